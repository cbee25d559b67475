"""The recipe table (`orchard.recipes`): the shared registries are the recipes', and `orchard train
RECIPE` trains only that recipe's tasks."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard import recipes as recipes_module
from orchard.agents import HARNESSES
from orchard.cli import app
from orchard.errors import ConfigError
from orchard.recipes import Recipe, check_kinds, recipe, recipe_of_kind, recipes
from orchard.tasks.kinds import KINDS
from orchard.tasks.loading import FOLDERS, SCHEMES

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def test_the_shared_tables_are_the_recipes():
    assert list(recipes()) == ["swe", "claw", "gui"]
    assert list(KINDS) == ["swe", "claw", "claw-eval", "gui", "miniwob"]
    assert list(HARNESSES) == ["bash", "tools", "cli", "functions", "assistant", "react", "computer", "bid"]
    assert FOLDERS == {"claw-eval": "orchard.recipes.claw.claweval:read_folder"}
    assert SCHEMES == {"miniwob": "orchard.recipes.gui.miniwob:read_spec"}
    assert recipe_of_kind("claw-eval") is recipe("claw") and recipe_of_kind("my.module:Task") is None
    for found in recipes().values():  # its example files are where it says
        assert (ROOT / "examples" / found.example_tasks).is_file() and (
            ROOT / "examples" / found.example_config
        ).is_file()


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


def test_train_refuses_a_config_of_another_recipe_in_one_line(orchard_home):
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
