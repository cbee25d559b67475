"""Predictions: patches made elsewhere, graded as SWE-bench's own harness does.

A predictions file is JSONL (or a JSON list, or a JSON object keyed by instance id) of
`{"instance_id", "model_patch", "model_name_or_path"}`. `gold` stands for each task's own patch:
grading it checks that the task set itself is sound.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from orchard.errors import ConfigError
from orchard.eval.runner import Attempt, Solved

if TYPE_CHECKING:
    from orchard.env.client import Client
    from orchard.tasks.schema import SWETask

GOLD = "gold"


def load_predictions(source: str, tasks: list[SWETask]) -> tuple[str, dict[str, str]]:
    """(model name, instance id -> patch); `gold` takes each task's patch."""
    if source == GOLD:
        return GOLD, {t.instance_id: t.patch for t in tasks}
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"no predictions file {source} (or say `gold` to grade the tasks' own patches)")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".jsonl":
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            data = json.loads(text)
            rows = list(data.values()) if isinstance(data, dict) else data
    except ValueError as exc:
        raise ConfigError(f"{source}: not valid JSON ({exc})") from None
    patches: dict[str, str] = {}
    names = set()
    for index, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("instance_id"), str):
            raise ConfigError(f"{source}, prediction {index}: needs a string instance_id")
        patch = row.get("model_patch") or ""
        if not isinstance(patch, str):
            raise ConfigError(f"{source}, prediction {index}: model_patch must be a string")
        patches[row["instance_id"]] = patch
        names.add(str(row.get("model_name_or_path") or "predictions"))
    known = {t.instance_id for t in tasks}
    unknown = sorted(set(patches) - known)
    if unknown:
        raise ConfigError(f"{source} predicts tasks not in the task set: {', '.join(unknown[:5])}")
    name = names.pop() if len(names) == 1 else "predictions"
    return name, patches


def solver_for(patches: dict[str, str]):
    """A solver that hands over the predicted patch (a task without one gets an empty patch)."""

    def solve(attempt: Attempt, image: str, client: Client, run_id: str) -> Solved:
        return Solved(patch=patches.get(attempt.task.instance_id, ""))

    return solve
