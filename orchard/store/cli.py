"""The store's commands: `orchard runs ls|show|rm` (`compare` is the evaluations', `orchard.eval.cli`).

SQLAlchemy is imported inside the commands, so `orchard --help` stays fast.
"""

from __future__ import annotations

import time
from typing import Annotated, Literal

import typer

from orchard.clikit import command, group
from orchard.errors import OrchardError

app = group("The store: runs.")
runs_app = group("List, show and delete the runs in the store: evaluations, collections, training stages.")
app.add_typer(runs_app, name="runs")

RunKind = Literal["eval", "collect", "credit", "sft", "rl", "value", "bench", "proxy"]
"""The kinds of run: `eval` and `collect` (`orchard eval|collect`), the recipe's stages, benchmarks."""
RunStatus = Literal["running", "finished", "failed", "interrupted"]


@command(runs_app, "ls")
def runs_ls(
    kind: Annotated[RunKind | None, typer.Option(help="Only runs of this kind.")] = None,
    status: Annotated[RunStatus | None, typer.Option(help="Only runs in this state.")] = None,
) -> None:
    """List runs, newest first, with their status and headline figure."""
    from orchard.store.runs import headline, list_runs

    runs = list_runs(kind=kind, status=status)
    if not runs:
        typer.echo("no runs")
        return
    width = max(len(run.id) for run in runs) + 1
    typer.echo(f"{'ID':<{width}} {'KIND':<8} {'STATUS':<12} {'STARTED':<17} HEADLINE")
    for run in runs:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.started_at))
        typer.echo(f"{run.id:<{width}} {run.kind:<8} {run.status:<12} {started:<17} {headline(run)}")


@command(runs_app, "show")
def runs_show(run_id: Annotated[str, typer.Argument(help="Run id.")]) -> None:
    """Show one run: what it was asked, how it went, its metrics (last value, points), and each
    attempt's outcome with where its files are (patch, whole test log, report)."""
    from orchard.store.views import show_run

    typer.echo(show_run(run_id))


@command(runs_app, "rm")
def runs_rm(run_ids: Annotated[list[str], typer.Argument(metavar="RUN_ID", help="Run ids.")]) -> None:
    """Delete runs with their results, metrics, trajectories and steps, and their folders of files."""
    from orchard.store.runs import delete_run

    unknown = [r for r in run_ids if not delete_run(r)]
    for run_id in run_ids:
        if run_id not in unknown:
            typer.echo(f"deleted {run_id}")
    if unknown:
        raise OrchardError(f"no run {', '.join(map(repr, unknown))}")
