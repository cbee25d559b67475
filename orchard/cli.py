"""The `orchard` command: the root, which mounts one sub-app per area.

Each area keeps its commands in its own `cli.py`: the environment (`orchard.env.cli`: up, down,
status, image, sandbox, bench), evaluation (`orchard.eval.cli`: eval, collect), training
(`orchard.train.cli`: train, model, demo, examples), the store (`orchard.store.cli`: runs), trajectories
(`orchard.agents.cli`), the recording proxy (`orchard.proxy.cli`: proxy) and the dashboard (`orchard.tui.cli`: tui). What they share (one error style, plain help) is
`orchard.clikit`. Heavy libraries (docker, httpx, fastapi, sqlalchemy, torch) are imported inside
commands, so `orchard --help` stays fast.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from orchard import __version__
from orchard.agents import cli as agents_cli
from orchard.clikit import Group
from orchard.env import cli as env_cli
from orchard.errors import EngineUnavailable
from orchard.eval import cli as eval_cli
from orchard.proxy import cli as proxy_cli
from orchard.store import cli as store_cli
from orchard.train import cli as train_cli
from orchard.tui import cli as tui_cli

app = typer.Typer(
    name="orchard",
    cls=Group,
    help="Build, train and evaluate LLM agents on isolated sandboxes.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
for area in (env_cli, eval_cli, train_cli, store_cli, agents_cli, proxy_cli, tui_cli):
    app.add_typer(area.app)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"orchard {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Build, train and evaluate LLM agents on isolated sandboxes."""


def main() -> None:
    """Entry point of the `orchard` command."""
    try:
        app()
    except EngineUnavailable as exc:  # raised outside a command, e.g. at import of a backend
        typer.echo(f"error: {exc}", err=True)
        sys.exit(1)
