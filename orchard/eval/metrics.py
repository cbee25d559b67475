"""Figures of an evaluation: pass@k, pass^k, and SWE-bench's report shape."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from math import comb
from typing import Any


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples resolves), from n samples of which c did
    (Chen et al., 2021): 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(all of k samples resolve) (tau-bench's pass^k): C(c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return comb(c, k) / comb(n, k)


def mean_over_tasks(per_task: dict[str, tuple[int, int]], k: int, estimator=pass_at_k) -> float:
    """The estimator averaged over tasks, each given as (samples, resolved)."""
    if not per_task:
        return 0.0
    return sum(estimator(n, c, k) for n, c in per_task.values()) / len(per_task)


ERROR_OUTCOMES = ("error", "patch_failed", "timeout")
"""Outcomes SWE-bench's harness counts as errors: the evaluation could not run the tests."""


def swebench_report(task_ids: Sequence[str], outcomes: dict[str, str]) -> dict[str, Any]:
    """SWE-bench's evaluation report for one prediction per task (`outcomes`: id -> outcome)."""
    submitted = [i for i in task_ids if i in outcomes]
    resolved = [i for i in submitted if outcomes[i] == "resolved"]
    empty = [i for i in submitted if outcomes[i] == "empty_patch"]
    errors = [i for i in submitted if outcomes[i] in ERROR_OUTCOMES]
    completed = [i for i in submitted if outcomes[i] not in (*ERROR_OUTCOMES, "empty_patch")]
    unresolved = [i for i in completed if outcomes[i] != "resolved"]
    return {
        "total_instances": len(task_ids),
        "submitted_instances": len(submitted),
        "completed_instances": len(completed),
        "resolved_instances": len(resolved),
        "unresolved_instances": len(unresolved),
        "empty_patch_instances": len(empty),
        "error_instances": len(errors),
        "completed_ids": sorted(completed),
        "incomplete_ids": sorted(set(task_ids) - set(submitted)),
        "empty_patch_ids": sorted(empty),
        "submitted_ids": sorted(submitted),
        "resolved_ids": sorted(resolved),
        "unresolved_ids": sorted(unresolved),
        "error_ids": sorted(errors),
        "schema_version": 2,
    }


def by_group(rows: Iterable[dict[str, Any]], key: str) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[row[key]].append(row)
    return dict(groups)


def spread(values: Sequence[float]) -> dict[str, float]:
    """How `values` spread: min, quartiles (inclusive, as numpy's default) and max; {} for none."""
    if not values:
        return {}
    ordered = sorted(values)
    q1, median, q3 = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else ordered * 3
    return {"min": ordered[0], "p25": q1, "median": median, "p75": q3, "max": ordered[-1]}
