"""`orchard tui`: the terminal dashboard (Textual is imported when it starts)."""

from __future__ import annotations

from typing import Annotated

import typer

from orchard.clikit import command, group

app = group("The terminal dashboard.")


@command(app, "tui")
def tui(
    refresh: Annotated[
        float, typer.Option(metavar="SECONDS", min=0.1, help="Seconds between reloads from the store.")
    ] = 2.0,
) -> None:
    """Watch runs, metrics, sandboxes and trajectories in the terminal (reads the store)."""
    from orchard.tui.app import OrchardApp

    OrchardApp(refresh_seconds=refresh).run()
