"""Predictions: submissions made elsewhere (for SWE, patches), graded as SWE-bench's own harness does.

A predictions file is JSONL (or a JSON list, or a JSON object keyed by instance id) of
`{"instance_id", "model_patch", "model_name_or_path"}` (`model_patch`: any kind's submission),
read by the one record reader of task files (`orchard.tasks.loading.read_records`), so a bad line
is named as in a task file. `gold` stands for each task's known solution (`task.gold()`; SWE: its
`patch`): grading it checks that the task set itself is sound.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchard.errors import ConfigError
from orchard.eval.runner import Attempt, Solved
from orchard.tasks.loading import read_records

if TYPE_CHECKING:
    from orchard.env.client import Client

GOLD = "gold"


def load_predictions(source: str, tasks: list[Any]) -> tuple[str, dict[str, str | None]]:
    """(model name, instance id -> submission); `gold` takes each task's own `patch`. A null
    `model_patch` stays None (SWE-bench's report says `patch_is_None`); it grades as empty."""
    if source == GOLD:
        return GOLD, {t.instance_id: t.gold() for t in tasks}
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"no predictions file {source} (or say `gold` to grade the tasks' own patches)")
    patches: dict[str, str | None] = {}
    names = set()
    for where, row in read_records(path, "predictions"):
        if not isinstance(row, dict) or not isinstance(row.get("instance_id"), str):
            raise ConfigError(f"{source}, {where}: needs a string instance_id")
        patch = row.get("model_patch")
        if patch is not None and not isinstance(patch, str):
            raise ConfigError(f"{source}, {where}: model_patch must be a string")
        patches[row["instance_id"]] = patch
        names.add(str(row.get("model_name_or_path") or "predictions"))
    known = {t.instance_id for t in tasks}
    unknown = sorted(set(patches) - known)
    if unknown:
        raise ConfigError(f"{source} predicts tasks not in the task set: {', '.join(unknown[:5])}")
    name = names.pop() if len(names) == 1 else "predictions"
    return name, patches


def solver_for(patches: dict[str, str | None]):
    """A solver that hands over the predicted submission (a task without one gets an empty one)."""

    def solve(attempt: Attempt, image: str, client: Client, run_id: str) -> Solved:
        patch = patches.get(attempt.task.instance_id, "")
        return Solved(submission=patch or "", submission_none=patch is None)

    solve.needs_sandbox = False  # type: ignore[attr-defined]  # grading only: no warm pools for it
    return solve
