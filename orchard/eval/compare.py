"""`orchard runs compare RUN RUN...`: evaluations side by side, in a Markdown report with a picture.

For each run and harness: the resolve rate over the attempts that were graded (machine errors left
out, as in each run's own report) with its 95% interval (`orchard.eval.intervals`: a task is the
unit); for each task, its outcome in every run; and for each run after the first, against the
first on the tasks both graded, which tasks flipped either way and the paired change with its
interval.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from orchard.errors import OrchardError
from orchard.eval.intervals import change, rate, shares
from orchard.eval.report import outcome_cell, rate_chart
from orchard.eval.runner import machine_error

if TYPE_CHECKING:
    from orchard.store import ResultRecord, RunRecord, Store

KINDS = ("eval", "collect")


def evaluation(run_id: str, store: Store) -> RunRecord:
    """The run `run_id`, if it is one that compares (an eval or a collection); else OrchardError."""
    from orchard.store.runs import get_run

    run = get_run(run_id, store=store)
    if run is None:
        raise OrchardError(f"no run {run_id!r} (`orchard runs ls` lists them)")
    if run.kind not in KINDS:
        raise OrchardError(f"run {run_id} is a {run.kind} run: only eval and collect runs compare")
    return run


def graded_by_harness(run_id: str, store: Store) -> dict[str, tuple[list[ResultRecord], int]]:
    """A run's results by harness (sorted): those graded, and how many a machine error ended."""
    from orchard.store.runs import results_of

    records = results_of(run_id, store=store)
    found = {}
    for harness in sorted({r.harness for r in records}):
        mine = [r for r in records if r.harness == harness]
        graded = [r for r in mine if machine_error(r) is None]
        found[harness] = (graded, len(mine) - len(graded))
    return found


def compare_runs(run_ids: list[str], out: Path | None = None, *, store: Store | None = None) -> Path:
    """Write `compare.md` and `compare.png` into `out` (default: a folder under the store's runs
    named by the runs compared); the Markdown's path. OrchardError naming what is wrong: fewer
    than two runs, a run the store lacks, a run that is no evaluation."""
    from orchard.store import Store

    store = store or Store.open()
    if len(run_ids) < 2 or len(set(run_ids)) < len(run_ids):
        raise OrchardError("name two or more different runs to compare (`orchard runs ls --kind eval` lists them)")
    columns: list[tuple[str, str]] = []
    graded: dict[tuple[str, str], list[ResultRecord]] = {}
    errors: dict[tuple[str, str], int] = {}
    for run_id in run_ids:
        evaluation(run_id, store)
        for harness, (mine, lost) in graded_by_harness(run_id, store).items():
            columns.append((run_id, harness))
            graded[run_id, harness], errors[run_id, harness] = mine, lost
    if not columns:
        raise OrchardError(f"runs {', '.join(run_ids)} hold no results yet")
    digest = hashlib.sha256(" ".join(run_ids).encode()).hexdigest()[:12]
    folder = out or store.runs / f"compare-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    rates = {column: rate(shares(graded[column])) for column in columns}
    lines = [
        f"# Comparing {', '.join(run_ids)}",
        "",
        "| run | harness | resolved | rate (95% interval) | machine errors |",
    ]
    lines.append("|---|---|---|---|---|")
    for column in columns:
        figures, records = rates[column], graded[column]
        interval = f"{figures['rate']:.1%} ({figures['low']:.1%}-{figures['high']:.1%}, {figures['n']} tasks)"
        lines.append(
            f"| {column[0]} | {column[1]} | {sum(r.resolved for r in records)}/{len(records)} | {interval} "
            f"| {errors[column]} |"
        )
    lines += ["", "![rates](compare.png)", ""]
    lines += _flips(columns, graded)
    lines += _per_task(columns, graded)
    rate_chart(
        folder / "compare.png",
        [f"{run[-12:]}\n{harness}" for run, harness in columns],
        [rates[c]["rate"] for c in columns],
        "Resolve rate by run and harness",
        [(rates[c]["low"], rates[c]["high"]) for c in columns],
    )
    path = folder / "compare.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _flips(columns: list[tuple[str, str]], graded: dict[tuple[str, str], list[ResultRecord]]) -> list[str]:
    """Each later column against the first of the same harness (else the first of all): the tasks
    that flipped either way and the paired change on the tasks both graded."""
    lines = ["## Against the first run", ""]
    for column in columns:
        base = next((c for c in columns if c[1] == column[1]), columns[0])
        if base[0] == column[0]:
            continue
        before, after = shares(graded[base]), shares(graded[column])
        moved = change(before, after)
        gained = sorted(task for task in set(before) & set(after) if after[task] > before[task])
        lost = sorted(task for task in set(before) & set(after) if after[task] < before[task])
        lines.append(
            f"* {column[0]} {column[1]} against {base[0]} {base[1]}: {moved['change']:+.1%} "
            f"({moved['low']:+.1%} to {moved['high']:+.1%}, {moved['n']} tasks both graded); "
            f"resolved more often: {', '.join(gained) or 'none'}; less often: {', '.join(lost) or 'none'}"
        )
    return [*lines, ""] if len(lines) > 2 else []


def _per_task(columns: list[tuple[str, str]], graded: dict[tuple[str, str], list[ResultRecord]]) -> list[str]:
    """One row per task: its outcome in each column (`resolved 2/3` where it had several samples)."""
    tasks = sorted({r.instance_id for records in graded.values() for r in records})
    header = " | ".join(f"{run} {harness}" for run, harness in columns)
    lines = ["## Per task", "", f"| task | {header} |", "|---|" + "---|" * len(columns)]
    for task in tasks:
        cells = [outcome_cell([r for r in graded[column] if r.instance_id == task]) for column in columns]
        lines.append(f"| {task} | {' | '.join(cells)} |")
    return lines
