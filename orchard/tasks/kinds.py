"""The registry of task kinds: a name in `KINDS` (the recipes'), `module:Class` or `path/file.py:Class` -> a task class."""

from __future__ import annotations

from pathlib import Path

from orchard.errors import ConfigError
from orchard.recipes import merged
from orchard.registry import load
from orchard.tasks.base import TaskBase

KINDS: dict[str, str] = merged("kinds")
"""Task kinds by name, every recipe's (`orchard.recipes`): `name -> "module:Class"`."""


def task_class(kind: str, *, relative_to: str | Path | None = None) -> type[TaskBase]:
    """The task class of `kind`; a relative file path is taken from `relative_to` (a task file's folder)."""
    found = load(KINDS, kind, "task kind", files=True, relative_to=relative_to)
    if not (isinstance(found, type) and issubclass(found, TaskBase)):
        raise ConfigError(f"task kind {kind!r} is not a task class (a subclass of orchard.tasks.base.TaskBase)")
    return found
