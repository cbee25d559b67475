"""Recipes: the task domains Orchard trains and evaluates agents on, one folder each.

A recipe (`orchard/recipes/NAME/`, exporting `RECIPE`) is everything the shared layers need to
know about its domain: its task kinds, the harnesses its tasks are worked through, the task
folder formats and `scheme:` sources it reads, the images it builds, its example (tasks, config,
what the demo shows). `RECIPES` lists them. Task loading, the harness registry, `orchard image
build`, `orchard train` and `orchard demo` read this table and name no recipe themselves;
`docs/architecture.md` has the checklist for a new one. Every entry is a `module:Attr` string, so reading the table imports
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

DEFAULT_KIND = "swe"
"""The kind of a task record that names none (SWE-bench's rows have no `kind`)."""


@dataclass(frozen=True)
class Example:
    """What `orchard demo --recipe NAME` runs: the recipe's whole loop on its example tasks."""

    tasks: str
    """Its example task file (JSON list or JSONL), relative to the source checkout's `examples/`."""
    config: str
    """Its example recipe config, relative to `examples/`."""
    images: tuple[str, ...] = ("base",)
    """The images the demo builds first (names `orchard image build` takes)."""
    prepare: str = ""
    """`module:function`, called with the demo's config (a dict, from `config`) and the
    `examples/` folder before the run: what the example needs besides its files (say, its
    repositories made)."""
    pass_k: bool = False
    """Whether the demo's eval rows show pass^k beside each rate (a recipe graded on reliability)."""


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
    """Task sets laid out as folders of files, by format: `name -> "module:read_folder"`, where
    `read_folder(path)` returns the folder's (where, record) pairs, or None when the folder is not
    in its format (`orchard.tasks.loading.read_folder` asks each in turn)."""
    schemes: Mapping[str, str] = field(default_factory=dict)
    """Task sets named `scheme:argument`: `scheme -> "module:read_spec"`."""
    images: Mapping[str, str] = field(default_factory=dict)
    """The images its tasks run in, by the name `orchard image build NAME` takes:
    `name -> "module:build"`, `build(force=..., log=...)` returning the tag."""
    example: Example | None = None
    """Its example, for `orchard demo` and `orchard train`'s help."""


@functools.cache
def recipes() -> dict[str, Recipe]:
    """Every recipe of `RECIPES`, by name; two recipes claiming one name of a table is a `ConfigError`."""
    found = {name: load(RECIPES, name, "recipe") for name in RECIPES}
    for part, one in (
        ("kinds", "task kind"),
        ("harnesses", "harness"),
        ("folders", "folder format"),
        ("schemes", "scheme"),
        ("images", "image"),
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
    """One table of every recipe's `part` (`kinds`, `harnesses`, `folders`, `schemes`, `images`)."""
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


__all__ = [
    "DEFAULT_KIND",
    "RECIPES",
    "Example",
    "Recipe",
    "check_kinds",
    "merged",
    "recipe",
    "recipe_of_kind",
    "recipes",
]
