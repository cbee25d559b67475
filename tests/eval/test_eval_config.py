"""Eval and collect configs: the flags of `orchard eval` and `orchard collect` as a YAML file."""

from __future__ import annotations

import pytest
import yaml

from orchard.configfile import load_config_file, validated
from orchard.errors import ConfigError
from orchard.eval.config import CollectRunConfig, EvalConfig


def test_an_eval_file_takes_its_paths_from_its_folder(tmp_path, monkeypatch):
    folder = tmp_path / "evals"
    (folder / "repos").mkdir(parents=True)
    (folder / "value").mkdir()
    (folder / "value" / "config.json").write_text("{}")
    (folder / "my_model.json").write_text("{}")
    data = {
        "tasks": "../tasks.jsonl",
        "repos": "repos",
        "ids": ["a", "b"],
        "models": ["scripted:gold", "scripted:my_model.json", "openai:qwen/coder"],
        "harnesses": ["bash", "tools"],
        "k": 4,
        "report": "out/report.json",
        "rerank": "value",
        "episode_steps": 12,
    }
    (folder / "eval.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path.parent)
    config = load_config_file(folder / "eval.yaml", EvalConfig)
    assert config.tasks == str(tmp_path / "tasks.jsonl") and config.repos == str(folder / "repos")
    assert config.models == ["scripted:gold", f"scripted:{folder / 'my_model.json'}", "openai:qwen/coder"]
    assert config.report == str(folder / "out" / "report.json") and config.rerank == str(folder / "value")
    assert (config.k, config.episode_steps, config.split, config.concurrency) == (4, 12, "test", 2)


def test_flags_as_they_are_typed_build_the_same_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "preds.jsonl").write_text("")
    flags = EvalConfig(tasks="owner/dataset", models="scripted:gold, noop", harnesses="bash,tools", ids="x,y")
    assert (
        flags.models == ["scripted:gold", "noop"] and flags.harnesses == ["bash", "tools"] and flags.ids == ["x", "y"]
    )
    assert flags.tasks == "owner/dataset"  # a hub id, nothing local by that name
    assert EvalConfig(tasks="t.jsonl", predictions="gold").predictions == "gold"
    assert EvalConfig(tasks="t.jsonl", predictions="preds.jsonl").predictions == str(tmp_path / "preds.jsonl")
    assert CollectRunConfig(tasks="t.jsonl", models="scripted:gold").k == 1


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, r"^e.yaml: say what to evaluate: models \(agents\), or predictions \(a JSONL file, or gold\)$"),
        ({"models": "noop", "predictions": "gold"}, "say what to evaluate"),
        ({"models": "noop", "rerank": "nowhere"}, r"rerank: no value model at .*nowhere \(train one"),
        ({"models": "noop", "harness": "bash", "max_steps": 3}, "harness: unknown key .did you mean harnesses..; "),
        ({"models": "noop", "max_steps": 3}, r"max_steps: unknown key \(renamed episode_steps\)$"),
        ({"models": "", "k": 0}, "^e.yaml: k: Input should be greater than or equal to 1; models: "),
    ],
)
def test_eval_config_mistakes_name_the_key(data, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        validated(EvalConfig, {"tasks": "t.jsonl", **data}, where="e.yaml")


def test_a_collection_needs_its_teachers():
    with pytest.raises(ConfigError, match=r"^c.yaml: models: missing \(a required key\)$"):
        validated(CollectRunConfig, {"tasks": "t.jsonl"}, where="c.yaml")
    with pytest.raises(ConfigError, match="predictions: unknown key"):
        validated(CollectRunConfig, {"tasks": "t.jsonl", "models": "noop", "predictions": "gold"})


def test_a_flag_not_given_takes_the_configs_default_which_its_help_states():
    """The commands' flags default to "not given", so each default lives in its config class;
    where a flag's help states it, it states that one."""
    import inspect
    import re
    import typing

    from orchard.eval import cli

    for command, config in ((cli.eval_, EvalConfig), (cli.collect, CollectRunConfig)):
        hints = typing.get_type_hints(command, include_extras=True)
        for name, parameter in inspect.signature(command).parameters.items():
            options = [m for m in getattr(hints.get(name), "__metadata__", ()) if hasattr(m, "help")]
            key = {"model": "models", "harness": "harnesses"}.get(name, name)
            if key not in config.model_fields or not options:
                continue
            assert parameter.default in (None, False), f"--{name} defaults to {parameter.default!r}"
            stated = re.search(r"\(default:? ([^,)]+)\)", options[0].help or "")
            if stated and key not in ("max_tokens", "temperature", "request_timeout", "harnesses"):
                assert stated.group(1) == str(config.model_fields[key].default), name
