"""The Sandboxes screen: the live sandboxes the store records, with the commands each ran; `d`
deletes the highlighted one (`orchard.tui.app.delete_sandbox`)."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Label

from orchard.errors import OrchardError
from orchard.store import views
from orchard.tui.widgets import age, one_line


class SandboxesScreen(Screen):
    BINDINGS: ClassVar = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("d", "delete", "Delete"),
        Binding("q", "app.quit", "Quit"),
    ]

    def compose(self) -> ComposeResult:
        yield Header()
        yield Label("", id="count")
        yield DataTable(id="sandboxes", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("sandbox", "image", "network", "age", "cmds", "last command")
        self.reload()
        self.set_interval(self.app.refresh_seconds, self.reload)  # type: ignore[attr-defined]

    def reload(self) -> None:
        live = views.live_sandboxes(store=self.app.store)  # type: ignore[attr-defined]
        now = self.app.now()  # type: ignore[attr-defined]
        table = self.query_one(DataTable)
        table.clear()
        for s in live:
            table.add_row(
                s.id,
                s.image,
                s.network,
                age(now - s.created_at),
                str(s.commands),
                one_line(s.last_command, 30),
                key=s.id,
            )
        self.query_one("#count", Label).update(f"{len(live)} live sandbox(es)")

    def action_delete(self) -> None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return
        sandbox_id = str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)
        try:
            self.app.delete_sandbox(sandbox_id)  # type: ignore[attr-defined]
        except OrchardError as exc:
            self.notify(f"could not delete {sandbox_id}: {exc}", severity="error")
            return
        self.notify(f"deleted {sandbox_id}")
        self.reload()
