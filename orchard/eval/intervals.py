"""95% intervals for resolve rates and for the change between two evaluations on the same tasks.

Samples of one task are not independent draws (a task a model solves, it tends to solve again), so
a task is the unit: a rate is the mean over tasks of each task's share of resolved samples, its
interval Wilson's for that many tasks (with k = 1 exactly Wilson's; with more samples it is wider
than one over all attempts would be, never narrower). A change is paired by task: the mean of the
per-task differences, with a normal interval of their standard error.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

Z = 1.959964
"""The standard normal's 97.5% quantile: two-sided 95%."""


def wilson(successes: float, n: int, z: float = Z) -> tuple[float, float]:
    """Wilson's score interval of a rate of `successes` in `n` (0..1 both ends; (0, 1) for n = 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def shares(results: Iterable[Any]) -> dict[str, float]:
    """Each task's share of resolved samples, from records with `instance_id` and `resolved`."""
    counts: dict[str, list[int]] = {}
    for record in results:
        seen = counts.setdefault(record.instance_id, [0, 0])
        seen[0] += bool(record.resolved)
        seen[1] += 1
    return {task: resolved / total for task, (resolved, total) in counts.items()}


def rate(per_task: Mapping[str, float]) -> dict[str, Any]:
    """The mean of per-task shares, the number of tasks, and its 95% interval."""
    n = len(per_task)
    total = sum(per_task.values())
    low, high = wilson(total, n)
    return {"rate": total / n if n else 0.0, "n": n, "low": low, "high": high}


def change(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, Any]:
    """After minus before over the tasks both have: the mean difference, n, and its 95% interval."""
    differences = [after[task] - before[task] for task in sorted(set(before) & set(after))]
    n = len(differences)
    if n == 0:
        return {"change": 0.0, "n": 0, "low": -1.0, "high": 1.0}
    mean = statistics.fmean(differences)
    half = Z * statistics.stdev(differences) / math.sqrt(n) if n > 1 else 2.0
    return {"change": mean, "n": n, "low": max(-1.0, mean - half), "high": min(1.0, mean + half)}
