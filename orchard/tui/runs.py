"""The Runs screen: every run, newest first, with its progress and headline figure.

`k` and `t` cycle the kind and status filters; `/` searches (what is typed keeps the runs whose
id, name, kind, status or configuration holds it: a model, a recipe, a task file), `esc` clears
it; `space` marks a run and `c` compares the two marked (or the one marked with the highlighted
one); `enter` opens a run.
"""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Label, Static

from orchard.errors import OrchardError
from orchard.store import views
from orchard.tui.compare import CompareScreen, comparison
from orchard.tui.queries import run_ids_matching
from orchard.tui.run import RunScreen, progress
from orchard.tui.widgets import SearchBar, when

KINDS = [None, "eval", "collect", "credit", "sft", "rl", "value"]
STATUSES = [None, "running", "finished", "failed", "interrupted"]
MARK = "●"


class RunsScreen(Screen):
    BINDINGS: ClassVar = [
        Binding("enter", "open", "Open"),
        Binding("slash", "search", "Search", priority=True),
        Binding("escape", "clear_search", "Clear"),
        Binding("space", "mark", "Mark"),
        Binding("c", "compare", "Compare"),
        Binding("k", "kind", "Kind"),
        Binding("t", "status", "Status"),
        Binding("s", "app.push_screen('sandboxes')", "Sandboxes"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.kind_index = self.status_index = 0
        self.search = ""
        self.marked: list[str] = []
        """Runs marked for comparing, in the order they were marked."""

    def compose(self) -> ComposeResult:
        yield Header()
        yield Label("", id="filters")
        yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield Static("", id="hint")
        yield SearchBar("search runs: id, name, model, recipe, status (esc clears)")
        yield Footer(show_command_palette=False)  # its keys fill 80 columns (ctrl+p still opens it)

    def on_mount(self) -> None:
        table = self.query_one("#runs", DataTable)
        table.add_column(" ", key="mark")
        table.add_columns("run", "kind", "status", "started", "progress", "headline")
        self.reload()
        self.set_interval(self.app.refresh_seconds, self.reload)  # type: ignore[attr-defined]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """`esc` only while there is a search to clear; `/` only while not typing one."""
        bars = list(self.query(SearchBar))
        if action == "clear_search":
            return bool(self.search) or any(bar.display for bar in bars)
        if action == "search":
            return not any(bar.typing for bar in bars)
        return True

    def reload(self) -> None:
        store = self.app.store  # type: ignore[attr-defined]
        kind, status = KINDS[self.kind_index], STATUSES[self.status_index]
        shown = [f"kind: {kind or 'all'}", f"status: {status or 'all'}"]
        if self.search:
            shown.append(f"search: {self.search}")
        if self.marked:
            shown.append(f"marked: {', '.join(self.marked)}")
        self.query_one("#filters", Label).update("   ".join(shown))
        found = views.runs(kind=kind, status=status, store=store)
        if self.search:
            matching = run_ids_matching(self.search, store=store)
            found = [run for run in found if run.id in matching]
        table = self.query_one("#runs", DataTable)
        selected = table.cursor_row
        table.clear()
        for run in found:
            table.add_row(
                MARK if run.id in self.marked else "",
                run.id,
                run.kind,
                run.status,
                when(run.started_at),
                progress(run.status, run.started_at, run.graded, run.total, run.last_step, self.app.now()),  # type: ignore[attr-defined]
                run.headline,
                key=run.id,
            )
        if table.row_count:
            table.move_cursor(row=min(selected, table.row_count - 1))
        hint = self.query_one("#hint", Static)
        hint.display = not table.row_count
        hint.update(
            "no runs match these filters: k, t and / change them (esc clears the search)"
            if kind or status or self.search
            else "no runs yet: `orchard eval --tasks examples/tasks/tasks.jsonl --model scripted:gold` makes one, "
            "and `orchard train RECIPE` a run of each stage"
        )

    def highlighted(self) -> str | None:
        table = self.query_one("#runs", DataTable)
        if not table.row_count:
            return None
        return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)

    def action_kind(self) -> None:
        self.kind_index = (self.kind_index + 1) % len(KINDS)
        self.reload()

    def action_status(self) -> None:
        self.status_index = (self.status_index + 1) % len(STATUSES)
        self.reload()

    def action_search(self) -> None:
        self.query_one(SearchBar).open()
        self.refresh_bindings()

    def action_clear_search(self) -> None:
        self.query_one(SearchBar).close()
        self.search = ""
        self.query_one("#runs", DataTable).focus()
        self.reload()
        self.refresh_bindings()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.search = event.value.strip()
        self.reload()
        self.refresh_bindings()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """`enter` in the search: back to the runs it left, the search kept."""
        self.query_one("#runs", DataTable).focus()

    def action_mark(self) -> None:
        """Mark the highlighted run for comparing, or unmark it; a third mark replaces the oldest."""
        run_id = self.highlighted()
        if run_id is None:
            return
        if run_id in self.marked:
            self.marked.remove(run_id)
        else:
            self.marked = [*self.marked[-1:], run_id]
        self.reload()

    def action_compare(self) -> None:
        """The two marked runs side by side, or the one marked and the highlighted one."""
        pair = self.marked if len(self.marked) == 2 else [*self.marked, self.highlighted()]
        if len(pair) != 2 or pair[1] is None or pair[0] == pair[1]:
            self.notify("mark two runs with space, then c compares them", severity="warning")
            return
        try:
            compared = comparison(str(pair[0]), str(pair[1]), store=self.app.store)  # type: ignore[attr-defined]
        except OrchardError as exc:
            self.notify(f"cannot compare: {exc}", severity="error")
            return
        self.app.push_screen(CompareScreen(compared))

    def action_open(self) -> None:
        run_id = self.highlighted()
        if run_id is not None:
            self.app.push_screen(RunScreen(run_id))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.app.push_screen(RunScreen(str(event.row_key.value)))
