"""The trajectories' commands: `orchard trajectories export|import` (`orchard.agents.trajectories`).

SQLAlchemy is imported inside the commands, so `orchard --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchard.clikit import command, group

app = group("Agent trajectories.")
trajectories_app = group("Export and import agent trajectories as JSONL (the Orchard dataset's shape).")
app.add_typer(trajectories_app, name="trajectories")


@command(trajectories_app, "export")
def trajectories_export(
    out: Annotated[Path, typer.Argument(metavar="FILE", help="JSONL file to write.")],
    run: Annotated[str | None, typer.Option(metavar="RUN_ID", help="Only this run's trajectories.")] = None,
) -> None:
    """Write trajectories (tools, messages, metadata with the verify status) as JSONL."""
    from orchard.agents.trajectories import export_file

    typer.echo(f"wrote {export_file(out, run_id=run)} trajectories to {out}")


@command(trajectories_app, "import")
def trajectories_import(
    source: Annotated[Path, typer.Argument(metavar="FILE", help="JSONL file of trajectories.")],
    run: Annotated[str | None, typer.Option(metavar="RUN_ID", help="File them under this run id.")] = None,
) -> None:
    """Read trajectories (ours, or the published Orchard dataset's) into the store."""
    from orchard.agents.trajectories import import_file

    imported, skipped = import_file(source, run_id=run)
    typer.echo(f"imported {imported} trajectories" + (f" ({skipped} already in the store)" if skipped else ""))
