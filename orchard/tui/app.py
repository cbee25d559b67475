"""`orchard tui`: watch runs, their metrics, live sandboxes and trajectories, refreshed from the store.

Screens (keys in the footer), one module each:

* Runs (`orchard.tui.runs`): `enter` opens one, `k` cycles the kind filter, `t` the status filter,
  `/` searches (id, name, model, recipe, status), `esc` clears; `space` marks a run, `c` compares
  two.
* Run (`orchard.tui.run`): metrics as sparklines with their range, the eval matrix, its
  trajectories; `/` searches its trajectories and their steps' actions and observations; while
  it runs, its progress and the sandboxes its attempts work in.
* Compare (`orchard.tui.compare`): two evaluations side by side, per harness and per task, the
  figures of `orchard runs compare`.
* Trajectory and Step (`orchard.tui.trajectory`): each step's action and observation, the value
  curve of credit assignment, rise-segment steps marked (credit at least the `credit.epsilon` the
  run was configured with); `enter` shows a step in full.
* Sandboxes (`orchard.tui.sandboxes`, `s` from the runs): `d` deletes the highlighted one, through
  the service or a manager (`delete_sandbox`).

Everything is read from the store (the SQLite file or `ORCHARD_DB_URL`) through
`orchard.store.views`, the read model `orchard runs show` shares, and `orchard.tui.queries`,
every `refresh` seconds, so it works beside any writer. Keyboard-first, usable at 80x24, and
`NO_COLOR` is honoured (by Textual). The layout is `app.tcss`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar

from textual.app import App

from orchard.errors import NotFound
from orchard.store import Store, views
from orchard.tui.compare import CompareScreen
from orchard.tui.run import RunScreen
from orchard.tui.runs import RunsScreen
from orchard.tui.sandboxes import SandboxesScreen
from orchard.tui.trajectory import StepScreen, TrajectoryScreen

__all__ = [
    "CompareScreen",
    "OrchardApp",
    "RunScreen",
    "RunsScreen",
    "SandboxesScreen",
    "StepScreen",
    "TrajectoryScreen",
]


class OrchardApp(App):
    """The dashboard over one store."""

    TITLE = "Orchard"
    CSS_PATH = "app.tcss"
    SCREENS: ClassVar = {"sandboxes": SandboxesScreen}

    def __init__(
        self,
        store: Store | None = None,
        *,
        refresh_seconds: float = 2.0,
        now: Callable[[], float] = time.time,
        delete_sandbox: Callable[[str], None] | None = None,
    ):
        super().__init__()
        self.store, self.refresh_seconds, self.now = store, refresh_seconds, now
        self._delete = delete_sandbox

    def on_mount(self) -> None:
        self.push_screen(RunsScreen())

    def delete_sandbox(self, sandbox_id: str) -> None:
        """Delete a sandbox (see `delete_sandbox`), or hand it to the hook the app was given."""
        if self._delete is not None:
            self._delete(sandbox_id)
        else:
            delete_sandbox(sandbox_id, self.store)


def delete_sandbox(sandbox_id: str, store: Store | None) -> None:
    """Delete a sandbox as its owner would, so that the owner's records stay true.

    The running service's own sandboxes go through the service (it drops its connections to
    them); any other goes through a manager acting for the process that made it, which removes
    it from the engine and marks it deleted in the store.
    """
    from orchard.env.client import Client
    from orchard.env.discovery import running_service_url
    from orchard.env.manager import SandboxManager

    url = running_service_url()
    if url:
        with Client(url=url) as client:
            if any(row["sandbox_id"] == sandbox_id for row in client.list()):
                client.attach(sandbox_id).delete()
                return
    found = views.sandbox(sandbox_id, store=store)
    if found is None:
        raise NotFound(f"no sandbox {sandbox_id!r} in the store")
    with SandboxManager(found.backend, owner=found.owner, store=store, reap_interval=None) as manager:
        manager.delete(sandbox_id)
