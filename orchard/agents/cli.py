"""The trajectories' commands: `orchard trajectories export|import` (`orchard.agents.trajectories`).

SQLAlchemy is imported inside the commands, so `orchard --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchard.clikit import command, group
from orchard.errors import OrchardError

app = group("Agent trajectories.")
trajectories_app = group("Export and import agent trajectories as JSONL (the Orchard dataset's shape).")
app.add_typer(trajectories_app, name="trajectories")


@command(trajectories_app, "export")
def trajectories_export(
    out: Annotated[Path, typer.Argument(metavar="FILE", help="JSONL file to write (`-`, the default: stdout).")] = Path(
        "-"
    ),
    run: Annotated[str | None, typer.Option(metavar="RUN_ID", help="Only this run's trajectories.")] = None,
) -> None:
    """Write trajectories (tools, messages, metadata with the verify status) as JSONL."""
    import sys

    from orchard.agents.trajectories import export_file, export_lines

    if str(out) == "-":
        lines = list(export_lines(run_id=run))
        sys.stdout.writelines(line + "\n" for line in lines)
        count, where = len(lines), "stdout"
    else:
        count, where = export_file(out, run_id=run), str(out)
    if count == 0 and run:
        from orchard.store.views import run_view

        if run_view(run) is None:
            raise OrchardError(f"no run {run!r} (`orchard runs ls` lists them)")
    none = " (none yet: `orchard eval` and `orchard collect` record them)" if count == 0 else ""
    typer.echo(f"wrote {count} trajectories to {where}{none}", err=where == "stdout")


@command(trajectories_app, "import")
def trajectories_import(
    source: Annotated[Path, typer.Argument(metavar="FILE", help="JSONL file of trajectories.")],
    run: Annotated[str | None, typer.Option(metavar="RUN_ID", help="File them under this run id.")] = None,
) -> None:
    """Read trajectories (ours, or the published Orchard dataset's) into the store."""
    from orchard.agents.trajectories import import_file

    imported, skipped = import_file(source, run_id=run)
    typer.echo(f"imported {imported} trajectories" + (f" ({skipped} already in the store)" if skipped else ""))
