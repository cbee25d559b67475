"""The recipe table (`orchard.recipes`): the shared registries are the recipes', and `orchard train
RECIPE` trains only that recipe's tasks."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard import recipes as recipes_module
from orchard.agents import HARNESSES
from orchard.cli import app
from orchard.env import IMAGES
from orchard.env.images import image_builders
from orchard.errors import ConfigError
from orchard.recipes import Recipe, check_kinds, recipe, recipe_of_kind, recipes
from orchard.tasks.kinds import KINDS
from orchard.tasks.loading import FOLDERS, SCHEMES

ROOT = Path(__file__).resolve().parents[1]
CLIS = ["codex", "claude", "opencode", "pi", "hermes", "mini"]
runner = CliRunner()


def test_the_shared_tables_are_the_recipes():
    assert list(recipes()) == ["swe", "claw", "gui"]
    assert list(KINDS) == ["swe", "claw", "claw-eval", "gui", "miniwob"]
    assert list(HARNESSES) == ["bash", "tools", "cli", *CLIS, "functions", "assistant", "react", "computer", "bid"]
    assert FOLDERS == {"claw-eval": "orchard.recipes.claw.claweval:read_folder"}
    assert SCHEMES == {"miniwob": "orchard.recipes.gui.miniwob:read_spec"}
    assert recipe_of_kind("claw-eval") is recipe("claw") and recipe_of_kind("my.module:Task") is None
    assert image_builders() == IMAGES | {
        "claw-eval": "orchard.recipes.claw.claweval:build_image",
        "browser": "orchard.recipes.gui.image:build_image",
        "miniwob": "orchard.recipes.gui.miniwob:build_image",
    }
    for found in recipes().values():  # its example files are where it says, its images are ones we build
        assert found.example is not None
        assert (ROOT / "examples" / found.example.tasks).is_file()
        assert (ROOT / "examples" / found.example.config).is_file()
        assert set(found.example.images) <= set(image_builders())


def test_two_recipes_claiming_one_name_is_an_error(monkeypatch: pytest.MonkeyPatch):
    twin = Recipe(name="twin", title="Twin", about="twins", kinds={}, harnesses={"bash": "x:Y"})
    monkeypatch.setattr(recipes_module, "TWIN", twin, raising=False)
    monkeypatch.setitem(recipes_module.RECIPES, "twin", "orchard.recipes:TWIN")
    recipes.cache_clear()
    try:
        with pytest.raises(ConfigError, match="recipes swe and twin both name harness 'bash'"):
            recipes()
    finally:
        monkeypatch.undo()
        recipes.cache_clear()
    with pytest.raises(ConfigError, match="no recipe 'web': name one of swe, claw, gui"):
        recipe("web")


def test_a_recipe_trains_its_own_tasks_and_tasks_of_your_own_kind():
    check_kinds("claw", {"claw", "claw-eval"}, "t")
    check_kinds("swe", {"swe", "path/to/kind.py:MyTask"}, "t")  # a kind of your own: any recipe trains it
    with pytest.raises(
        ConfigError, match=r"^t holds claw and gui tasks, not swe ones: train them with `orchard train claw`"
    ):
        check_kinds("swe", {"swe", "miniwob", "claw"}, "t")


def test_train_refuses_a_config_of_another_recipe_in_one_line(orchard_home, tmp_path, monkeypatch):
    monkeypatch.setenv("ORCHARD_CACHE_DIR", str(tmp_path))  # the config's `repos:` folder, made or not on this machine
    (tmp_path / "example-repos").mkdir()
    config = ROOT / "examples/configs/swe-tiny.yaml"
    result = runner.invoke(app, ["train", "claw", "--config", str(config)])
    assert result.exit_code == 1
    assert result.stderr == (
        f"error: the tasks {ROOT / 'examples/tasks/tasks.jsonl'} holds swe tasks, not claw ones: "
        "train them with `orchard train swe`, or name tasks of the claw recipe\n"
    )
    assert not (orchard_home / "train").exists()  # refused before any stage made its folder
    listed = runner.invoke(app, ["train", "--help"]).output
    assert all(f"Run the {r.title} recipe ({r.about})" in listed for r in recipes().values())


def test_image_build_takes_every_image_by_name(docker_client):
    """`orchard image build NAME` builds the shared images and the recipes' by the names of the
    table; an unknown name is one line listing them."""
    built = runner.invoke(app, ["image", "build", "busybox"])
    assert built.exit_code == 0, built.output
    assert built.stdout == "orchard/busybox:static\n"
    bad = runner.invoke(app, ["image", "build", "chrome"])
    assert bad.exit_code == 1
    assert bad.stderr == (
        "error: unknown image 'chrome': use base, busybox, agent, service, claw-eval, browser, miniwob or module:function\n"
    )


def test_a_perfect_solver_fits_every_episode_limit_of_every_example(orchard_home):
    """Under each example config's episode limits (collect, RL, eval) the scripted perfect solver
    (its first teacher's script: every step of it a turn) finishes every task of the stage, so a
    stage's rates can move: an eval capped below the solution's length reads 0% whatever the
    model. That the scripts resolve their tasks is what each recipe's collect tests show."""
    for found in recipes().values():
        assert found.example is not None
        _solver_fits(ROOT / "examples" / found.example.config)


def test_the_learning_runs_teacher_fits_its_episode_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """swe-smollm.yaml on tasks generated as bench/learning.py makes them (fewer of them)."""
    import subprocess
    import sys

    monkeypatch.setenv("ORCHARD_CACHE_DIR", str(tmp_path))
    generate = [sys.executable, str(ROOT / "examples/tasks/generate.py"), str(tmp_path / "learning-tasks")]
    subprocess.run([*generate, "--train", "12", "--held-out", "6"], check=True, capture_output=True)
    _solver_fits(ROOT / "examples/configs/swe-smollm.yaml")


def _solver_fits(path: Path) -> None:
    import yaml

    from orchard.configfile import validated
    from orchard.tasks import load_tasks
    from orchard.train.config import RecipeConfig

    data = yaml.safe_load(path.read_text()) | {"repos": None}
    config = validated(RecipeConfig, data, base=path.parent)
    script = config.collect.teachers[0].removeprefix("scripted:")
    trained = load_tasks(config.tasks, ids=config.ids)
    held_out = load_tasks(config.eval.tasks, ids=config.eval.ids) if config.eval.tasks else trained
    stages = {"collect": (config.collect.episode_steps, trained), "eval": (config.eval.episode_steps, held_out)}
    if config.rl.enabled:
        stages["rl"] = (config.rl.episode_steps, trained[: config.rl.tasks] if config.rl.tasks else trained)
    for stage, (limit, tasks) in stages.items():
        longest = max(tasks, key=lambda t: len(t.script(script)))
        assert len(longest.script(script)) <= limit, (
            f"{path.name}: {stage}.episode_steps {limit} cuts {longest.instance_id}'s "
            f"{script} solution of {len(longest.script(script))} steps"
        )
