"""The training configs: paths from the file's folder, Orchard's folders, one documented field each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from pydantic import Field

from orchard.configfile import ConfigModel, validated
from orchard.errors import ConfigError
from orchard.train.config import RecipeConfig, RLConfig
from orchard.train.pipeline import load_config

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_recipes_resolve_against_their_folder(orchard_home, tmp_path, monkeypatch):
    monkeypatch.setenv("ORCHARD_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache" / "example-repos").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    tiny = load_config(ROOT / "examples/configs/swe-tiny.yaml")
    assert tiny.tasks == str(ROOT / "examples/tasks/tasks.jsonl")
    assert tiny.repos == str(tmp_path / "cache" / "example-repos")
    assert tiny.work_dir == str(orchard_home / "train" / "swe-tiny")
    qwen = load_config(ROOT / "examples/configs/swe-qwen3.yaml")
    assert qwen.tasks == "princeton-nlp/SWE-bench_Verified" and qwen.student.path == "Qwen/Qwen3-8B"  # hub ids
    assert qwen.work_dir == "/data/orchard/swe-qwen3-8b" and qwen.collect.episode_steps == 100


def test_files_named_by_a_recipe_are_found_next_to_it(orchard_home, tmp_path, monkeypatch):
    folder = tmp_path / "recipe"
    (folder / "student").mkdir(parents=True)
    (folder / "moves.json").write_text("{}")
    (folder / "mine.py").write_text("")
    recipe = {
        "name": "r",
        "tasks": "tasks.jsonl",
        "work_dir": "~/out",
        "student": {"path": "student"},
        "collect": {"teachers": ["scripted:gold", "scripted:moves.json", "openai:a/b"], "harnesses": ["mine.py:H"]},
        "rl": {"harnesses": ["bash", "elsewhere.py:H"]},
    }
    (folder / "r.yaml").write_text(yaml.safe_dump(recipe))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    config = load_config(folder / "r.yaml")
    assert config.tasks == str(folder / "tasks.jsonl")  # not there: an absolute path for the error to name
    assert config.work_dir == str(tmp_path / "home" / "out") and config.student.path == str(folder / "student")
    assert config.collect.teachers == ["scripted:gold", f"scripted:{folder / 'moves.json'}", "openai:a/b"]
    assert config.collect.harnesses == [f"{folder / 'mine.py'}:H"] and config.rl.harnesses == ["bash", "elsewhere.py:H"]


def test_path_mistakes_name_the_key(orchard_home, tmp_path, monkeypatch):
    monkeypatch.delenv("NO_SUCH_FOLDER", raising=False)
    with pytest.raises(
        ConfigError, match=r"^here: repos: .*/nope is not a folder; work_dir: \$NO_SUCH_FOLDER is not set$"
    ):
        validated(
            RecipeConfig, {"name": "x", "tasks": "t", "work_dir": "$NO_SUCH_FOLDER/w", "repos": "nope"}, where="here"
        )
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match=r"a config is a mapping of keys, see orchard\.train\.config\.RecipeConfig"):
        load_config(empty)


def test_rl_config_builds_the_bar_config_and_refuses_an_impossible_one():
    assert RLConfig(group_size=2, max_rollouts=4, stride=2).bar.positive_counts() == [1]
    with pytest.raises(ConfigError, match="rl: need 1 <= group_size <= max_rollouts"):
        validated(RecipeConfig, {"name": "x", "tasks": "t", "rl": {"group_size": 20}})
    with pytest.raises(ConfigError, match="credit: estimator judge needs judge"):
        validated(RecipeConfig, {"name": "x", "tasks": "t", "credit": {"estimator": "judge"}})


def test_a_config_field_without_a_description_does_not_import():
    with pytest.raises(TypeError, match="Undocumented: give size a description"):

        class Undocumented(ConfigModel):
            size: int = 1
            named: int = Field(default=1, description="documented")


def test_every_section_is_a_strict_config_model():
    """Every section of the recipe forbids unknown keys and documents its fields (checked at import)."""
    from pydantic import BaseModel

    nested = [f.annotation for f in RecipeConfig.model_fields.values()]
    sections = [RecipeConfig] + [t for t in nested if isinstance(t, type) and issubclass(t, BaseModel)]
    assert len(sections) == 8 and all(issubclass(s, ConfigModel) for s in sections)
    assert all(s.model_config.get("extra") == "forbid" for s in sections)
    with pytest.raises(ConfigError, match=r"^f.yaml: student.paht: unknown key \(did you mean path\?\)$"):
        validated(RecipeConfig, {"name": "x", "tasks": "t", "student": {"paht": "m"}}, where="f.yaml")


def test_a_held_out_set_that_shares_a_task_or_a_repository_is_refused_in_one_line(orchard_home, tmp_path):
    """`eval.tasks` is held out only if the recipe never trains on its tasks or their repositories:
    `orchard train` says what it shares, in one line, before any stage starts or folder is made."""
    from typer.testing import CliRunner

    from orchard.cli import app

    rows = [json.loads(line) for line in (ROOT / "examples/tasks/tasks.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r["repo"] != "orchard-examples/timecalc"]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trained))
    (tmp_path / "same-repo.jsonl").write_text(json.dumps({**trained[0], "instance_id": "fresh-1"}) + "\n")
    (tmp_path / "held-out.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows if r["repo"] == "orchard-examples/timecalc")
    )
    config = yaml.safe_load((ROOT / "examples/configs/swe-tiny.yaml").read_text())
    config.update(tasks=str(tmp_path / "train.jsonl"), ids=None, repos=str(tmp_path), work_dir=str(tmp_path / "work"))
    expected = {
        "train.jsonl": f"shares task {trained[0]['instance_id']} (and {len(trained) - 1} more) and repository "
        "orchard-examples/inventory (and 1 more)",
        "same-repo.jsonl": f"shares repository {trained[0]['repo']}",
    }
    for held_out, shared in expected.items():
        config["eval"] = {"enabled": True, "tasks": str(tmp_path / held_out)}
        (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(config))
        result = CliRunner().invoke(app, ["train", "swe", "--config", str(tmp_path / "recipe.yaml")])
        assert result.exit_code == 1
        assert result.stderr == (
            f"error: eval.tasks {tmp_path / held_out} is not held out: it {shared} with the training tasks; "
            "evaluate on tasks (and repositories) the recipe never trains on\n"
        )
        assert not (tmp_path / "work").exists()
    config["eval"] = {"enabled": True, "tasks": "held-out.jsonl"}  # relative to the recipe's folder
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(config))
    assert load_config(tmp_path / "recipe.yaml").eval.tasks == str(tmp_path / "held-out.jsonl")
