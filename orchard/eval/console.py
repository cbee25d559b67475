"""What `orchard eval` shows in the terminal: a progress bar with ETA, then the results table; and
on Ctrl-C, one line and exit code 130."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from orchard.eval.report import flagged, graded_cells
from orchard.eval.runner import RunInterrupted, machine_error
from orchard.store import ResultRecord

INTERRUPTED = 130
"""The exit code of a command stopped by Ctrl-C (128 + SIGINT), as shells report it."""


@contextmanager
def exits_on_interrupt() -> Iterator[None]:
    """Ctrl-C as one line on stderr and exit code 130: the run it stopped is recorded as interrupted,
    and the same command resumes it."""
    try:
        yield
    except RunInterrupted as stop:
        typer.echo(f"interrupted: {stop}; it is recorded, and the same command resumes it", err=True)
        raise typer.Exit(INTERRUPTED) from None
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        raise typer.Exit(INTERRUPTED) from None


class EvalProgress:
    """A progress bar on stderr: attempts done of all, resolved so far, elapsed and ETA."""

    def __init__(self, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.progress = Progress(
            TextColumn("[bold]eval[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("resolved {task.fields[resolved]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self.task_id: Any = None
        self.resolved = 0

    def __enter__(self) -> EvalProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def __call__(self, done: int, total: int, record: ResultRecord | None) -> None:
        if self.task_id is None:
            self.task_id = self.progress.add_task("eval", total=total, completed=done, resolved=0)
        if record is not None and record.resolved:
            self.resolved += 1
        if record is not None and machine_error(record) is not None:  # said as it happens, above the bar
            error = str(json.loads(record.grade or "{}").get("error") or "")
            where = f"{record.instance_id} {record.harness}/{record.sample}"
            self.progress.console.print(
                f"machine error: {where}: {error[:300]}", style="red", markup=False, soft_wrap=True
            )
        self.progress.update(self.task_id, completed=done, resolved=self.resolved)


def results_table(summary: dict[str, Any], title: str) -> Table:
    """One row per harness: resolve rate, mean score (for kinds that grade with scores), suspicious
    attempts (when there are any), pass@k, pass^k, steps, tokens, outcomes."""
    harnesses = summary["harnesses"]
    scored = summary.get("metric") == "score"
    k_max = max((len(h["pass_at_k"]) for h in harnesses.values()), default=1)
    any_flagged = any(h.get("suspicious") for h in harnesses.values())
    any_errors = any(h.get("machine_errors") for h in harnesses.values())
    table = Table(title=title)
    table.add_column("harness")
    table.add_column("resolved", justify="right")
    table.add_column("rate", justify="right")
    if any_errors:
        table.add_column("machine errors", justify="right", style="red")
    if scored:
        table.add_column("score", justify="right")
    if any_flagged:
        table.add_column("suspicious", justify="right", no_wrap=True)
    if k_max > 1:
        table.add_column(f"pass@{k_max}", justify="right")
        table.add_column(f"pass^{k_max}", justify="right")
    table.add_column("steps", justify="right")
    table.add_column("tokens", justify="right")
    table.add_column("outcomes")
    for name, row in harnesses.items():
        cells = [name, *graded_cells(row)]
        if any_errors:
            cells.append(str(row.get("machine_errors", 0)))
        if scored:
            cells.append(f"{row['mean_score']:.3f}")
        if any_flagged:
            cells.append(flagged(row))
        if k_max > 1:
            k = str(len(row["pass_at_k"]))
            cells += [f"{row['pass_at_k'][k]:.1%}", f"{row['pass_hat_k'][k]:.1%}"] if k != "0" else ["-", "-"]
        cells += [
            f"{row['mean_steps']:.1f}",
            f"{row['mean_tokens']:.0f}",
            ", ".join(f"{kind} {count}" for kind, count in row["outcomes"].items()),
        ]
        table.add_row(*cells)
    return table


def matrix_table(summaries: dict[str, dict[str, Any]]) -> Table:
    """Models x harnesses: the resolve rate of each pair, so harness lock-in shows."""
    harnesses = sorted({h for summary in summaries.values() for h in summary["harnesses"]})
    table = Table(title="resolve rate, model x harness")
    table.add_column("model")
    for harness in harnesses:
        table.add_column(harness, justify="right")
    for model, summary in summaries.items():
        rows = summary["harnesses"]
        table.add_row(model, *(f"{rows[h]['resolve_rate']:.1%}" if h in rows else "-" for h in harnesses))
    return table
