"""Recipes: the task domains Orchard trains and evaluates agents on, one folder each.

A recipe (`orchard/recipes/NAME/`, exporting `RECIPE`) is everything the shared layers need to
know about its domain: its task kinds, the harnesses its tasks are worked through, the task
folder formats and `scheme:` sources it reads, its example tasks and config. `RECIPES` lists
them. Task loading, the harness registry, `orchard train` and `orchard demo` read this table and
name no recipe themselves. Every entry is a `module:Attr` string, so reading the table imports
nothing heavy (`orchard --help` reads it).

A new recipe is a folder with `RECIPE = Recipe(...)` in its `__init__.py` and one line in `RECIPES`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from orchard.errors import ConfigError
from orchard.registry import load

RECIPES: dict[str, str] = {
    "swe": "orchard.recipes.swe:RECIPE",
    "claw": "orchard.recipes.claw:RECIPE",
    "gui": "orchard.recipes.gui:RECIPE",
}
"""The recipes, by name: `name -> "module:RECIPE"`."""


@dataclass(frozen=True)
class Recipe:
    """A task domain, as the shared layers see it. Every reference is a `module:Attr` string,
    imported only when used."""

    name: str
    title: str
    """What the demo's table is headed with, e.g. `Orchard-SWE`."""
    about: str
    """What its tasks are, for help texts: `repository issues`."""
    kinds: Mapping[str, str]
    """Its task kinds: `name -> "module:Class"` (a task file's `kind`)."""
    harnesses: Mapping[str, str]
    """The harnesses it ships: `name -> "module:Class"`."""
    folders: Mapping[str, str] = field(default_factory=dict)
    """Task sets laid out as folders of files, by format: `name -> "module:read_folder"` (see
    `orchard.tasks.loading.FOLDERS`)."""
    schemes: Mapping[str, str] = field(default_factory=dict)
    """Task sets named `scheme:argument`: `scheme -> "module:read_spec"`."""
    example_tasks: str = ""
    """Its example task file, relative to the source checkout's `examples/`."""
    example_config: str = ""
    """Its example recipe config (the demo's), relative to `examples/`."""


@functools.cache
def recipes() -> dict[str, Recipe]:
    """Every recipe of `RECIPES`, by name; two recipes claiming one name of a table is a `ConfigError`."""
    found = {name: load(RECIPES, name, "recipe") for name in RECIPES}
    for part, one in (
        ("kinds", "task kind"),
        ("harnesses", "harness"),
        ("folders", "folder format"),
        ("schemes", "scheme"),
    ):
        owners: dict[str, str] = {}
        for name, recipe in found.items():
            for key in getattr(recipe, part):
                if key in owners:
                    raise ConfigError(f"recipes {owners[key]} and {name} both name {one} {key!r}")
                owners[key] = name
    return found


def recipe(name: str) -> Recipe:
    """The recipe called `name`; a `ConfigError` naming the others when there is none."""
    known = recipes()
    if name not in known:
        raise ConfigError(f"no recipe {name!r}: name one of {', '.join(known)}")
    return known[name]


def merged(part: str) -> dict[str, str]:
    """One table of every recipe's `part` (`kinds`, `harnesses`, `folders`, `schemes`)."""
    return {key: value for recipe in recipes().values() for key, value in getattr(recipe, part).items()}


def recipe_of_kind(kind: str) -> Recipe | None:
    """The recipe whose task kind `kind` is; None for a kind of your own (`module:Class`)."""
    return next((r for r in recipes().values() if kind in r.kinds), None)


def check_kinds(name: str, kinds: Iterable[str], source: str) -> None:
    """A `ConfigError` unless each of `kinds` (the task kinds of `source`) is recipe `name`'s, or
    a kind of your own, which any recipe may train on."""
    others = sorted({found.name for kind in kinds if (found := recipe_of_kind(kind)) not in (None, recipes()[name])})
    if others:
        raise ConfigError(
            f"{source} holds {' and '.join(others)} tasks, not {name} ones: train them with "
            f"`orchard train {others[0]}`, or name tasks of the {name} recipe"
        )


__all__ = ["RECIPES", "Recipe", "check_kinds", "merged", "recipe", "recipe_of_kind", "recipes"]
