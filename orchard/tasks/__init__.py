"""Tasks: the task-kind protocol (`orchard.tasks.base`), the kinds, loading task sets, and what
recipes share to grade with (`orchard.tasks.checks`); the kinds themselves are the recipes'.

A task file's records pick their kind with a `kind` field (`orchard.recipes.DEFAULT_KIND` when
absent): a name in
`orchard.tasks.kinds.KINDS` (every recipe's kinds: `orchard.recipes`), or a task class named
`module:Class` or `path/to/file.py:Class` (a path relative to the task file's folder).
"""

from orchard.tasks.base import Grade, Prepare, TaskBase, task_sandbox
from orchard.tasks.kinds import KINDS, task_class
from orchard.tasks.loading import load_tasks

__all__ = ["KINDS", "Grade", "Prepare", "TaskBase", "load_tasks", "task_class", "task_sandbox"]
