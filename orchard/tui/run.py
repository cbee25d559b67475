"""The Run screen: what a run was asked and how it went, its metrics charted with their range,
its eval matrix and its trajectories; while it runs, its progress and what is under way.

`/` searches the run: what is typed keeps the trajectories whose task, harness, model, status or
verdict holds it, and lists the steps whose action or observation holds it (`STEP_HITS` at
most, looked for once typing pauses, off the screen's thread); `enter` on a step opens it in
full, `esc` clears the search (then goes back).

While a run runs, the screen reads the store again every `refresh` seconds. An evaluation
records an attempt (its trajectory and its steps included) only once the attempt ends; what is
under way meanwhile is what its runner lists in the run's folder (`queries.attempts_in_flight`):
each attempt's task, harness and sample, how long it has run, whether it is solved or graded, its
steps so far and its last action. A run that lists none (a training stage) shows the live
sandboxes of its process instead (`queries.sandboxes_of_run`), each with its image, its age and
the commands it has finished.
"""

from __future__ import annotations

import time
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import DataTable, Footer, Header, Input, Label, Static
from textual.worker import get_current_worker

from orchard.store import views
from orchard.store.runs import metrics_of
from orchard.tui.queries import StepHit, attempts_in_flight, sandboxes_of_run, step_hits, trajectories
from orchard.tui.trajectory import TrajectoryScreen, open_step
from orchard.tui.widgets import Chart, SearchBar, age, around, one_line, span, when

STEP_HITS = 200
"""The most steps a search lists."""
SEARCH_PAUSE = 0.3
"""Seconds typing must pause before the steps are searched (each key filters trajectories at once)."""


def progress(status: str, started_at: float, graded: int, total: int | None, last_step: int | None, now: float) -> str:
    """`3/10 graded, ETA 2m` for a running evaluation (the ETA from its pace so far), `10/10
    graded` once it ended, `step 5` for a training stage."""
    if total:
        done = f"{graded}/{total} graded"
        if status != "running" or not graded or graded >= total:
            return done
        left = (now - started_at) / graded * (total - graded)
        return f"{done}, ETA {span(left)}"
    return f"{graded} graded" if graded else f"step {last_step}" if last_step else ""


class RunScreen(Screen):
    BINDINGS: ClassVar = [
        Binding("escape", "back", "Back"),
        Binding("enter", "open", "Open"),
        Binding("slash", "search", "Search", priority=True),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id
        self.search = ""
        self.status: str | None = None
        """The run's status as last read (None: no such run)."""
        self.hits: list[StepHit] = []
        self.timer: Timer | None = None
        """Reads the store again while the run runs."""

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll():
            yield Static(id="about")
            yield VerticalScroll(id="metrics")
            yield Label("Under way", classes="title", id="inflight-title")
            yield Static(id="inflight-about")
            yield DataTable(id="inflight", cursor_type="none")
            yield Label("Results by harness", classes="title", id="matrix-title")
            yield DataTable(id="matrix", cursor_type="none")
            yield Label("Trajectories", classes="title", id="trajectories-title")
            yield DataTable(id="trajectories", cursor_type="row", zebra_stripes=True)
            yield Label("", classes="title", id="hits-title")
            yield DataTable(id="hits", cursor_type="row", zebra_stripes=True)
        yield SearchBar("search the run: task, harness, model, verdict, and steps' actions and observations")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#trajectories", DataTable).add_columns("task", "harness", "status", "verdict", "steps")
        self.query_one("#hits", DataTable).add_columns("task", "harness", "step", "in", "text")
        self.query_one("#matrix", DataTable).add_columns("harness", "resolved", "rate", "machine errors", "outcomes")
        self.show_hits("", [], False)
        self.load()
        if self.status == "running":
            self.timer = self.set_interval(self.app.refresh_seconds, self.refresh_running)  # type: ignore[attr-defined]
        table = self.query_one("#trajectories", DataTable)
        if table.row_count:
            table.focus()

    def load(self) -> None:
        """Everything, as the store has it now."""
        run = views.run_view(self.run_id, store=self.app.store)  # type: ignore[attr-defined]
        self.status = run.status if run is not None else None
        if run is None:
            self.query_one("#about", Static).update(f"no run {self.run_id}")
            for name in ("inflight", "matrix", "trajectories"):
                self.query_one(f"#{name}-title").display = self.query_one(f"#{name}").display = False
            self.query_one("#inflight-about").display = False
            return
        lines = [
            f"{run.id}  {run.kind}  {run.status}",
            run.name,
            f"started {when(run.started_at)}, ended {when(run.ended_at)}",
        ]
        if run.error:
            lines.append(f"error: {run.error}")
        lines.append(run.headline)
        lines.append(f"config: {one_line(run.config, 300)}")
        self.query_one("#about", Static).update(Text("\n".join(lines)))
        self.show_metrics({metric.name: metric.points for metric in run.metrics})
        matrix = self.query_one("#matrix", DataTable)
        matrix.clear()
        for row in run.harnesses:
            outcomes = ", ".join(f"{k} {v}" for k, v in row.outcomes.items())
            rate = f"{row.resolve_rate:.0%}" if row.graded else "-"
            errors = Text(str(row.machine_errors), style="red" if row.machine_errors else "")
            matrix.add_row(row.harness, f"{row.resolved}/{row.graded}", rate, errors, outcomes)
        self.query_one("#matrix-title").display = matrix.display = bool(matrix.row_count)
        self.show_trajectories()
        self.show_under_way(self._row() if run.status == "running" else None)

    def refresh_running(self) -> None:
        """What moves while a run runs: its progress, what is under way, its trajectories and
        metrics; all of it once it has ended (its summary, its matrix), and then no more."""
        row = self._row()
        if row is None or row.status != "running":
            self.load()
            if self.timer is not None:
                self.timer.stop()
            return
        self.show_metrics(metrics_of(self.run_id, store=self.app.store))  # type: ignore[attr-defined]
        self.show_trajectories()
        self.show_under_way(row)

    def _row(self) -> views.RunRow | None:
        """The run as the runs list has it: its figures of progress."""
        return next((r for r in views.runs(store=self.app.store) if r.id == self.run_id), None)  # type: ignore[attr-defined]

    def show_metrics(self, series: dict[str, list[tuple[int, float]]]) -> None:
        """A chart a metric, each with its range; a metric first seen gets a chart of its own."""
        box = self.query_one("#metrics", VerticalScroll)
        charts = {chart.series_name: chart for chart in box.query(Chart)}
        for name, points in series.items():
            if name in charts:
                charts[name].show(points)
            else:
                box.mount(Chart(name, points))

    def show_under_way(self, run: views.RunRow | None) -> None:
        """For a running run: its progress and the live sandboxes of its process (see the module)."""
        for name in ("#inflight-title", "#inflight-about", "#inflight"):
            self.query_one(name).display = run is not None
        if run is None:
            return
        store, now = self.app.store, self.app.now()  # type: ignore[attr-defined]
        figures = (
            progress(run.status, run.started_at, run.graded, run.total, run.last_step, now) or "nothing recorded yet"
        )
        table = self.query_one("#inflight", DataTable)
        attempts = attempts_in_flight(self.run_id, store=store)
        if attempts:
            self.query_one("#inflight-about", Static).update(f"{figures}. In flight:")
            table.clear(columns=True)
            table.add_columns("task", "harness", "sample", "for", "phase", "steps", "last action")
            for a in attempts:
                cells = [a["task"], a["harness"], str(a["sample"]), age(now - a["started"]), a["phase"]]
                table.add_row(*cells, str(a["steps"]), one_line(a["last"], 60))
            table.display = True
            return
        boxes = sandboxes_of_run(self.run_id, store=store)
        note = (
            f"{figures}. Attempts are recorded as they end; meanwhile, the live sandboxes of the run's process "
            "show where they work (and are graded) and the commands they finished:"
            if boxes
            else f"{figures}. Attempts are recorded as they end, and the store holds no live sandbox of the run's "
            "process (a service's sandboxes are its own: `s` lists them)."
        )
        self.query_one("#inflight-about", Static).update(note)
        table.clear(columns=True)
        table.add_columns("sandbox", "age", "cmds", "last command", "image")
        for s in boxes:
            table.add_row(s.id, age(now - s.created_at), str(s.commands), one_line(s.last_command, 40), s.image)
        table.display = bool(boxes)

    def show_trajectories(self) -> None:
        """The run's trajectories, those the search keeps (the highlighted one stays highlighted)."""
        table = self.query_one("#trajectories", DataTable)
        highlighted = self._key(table)
        table.clear()
        for t in trajectories(self.run_id, self.search, store=self.app.store):  # type: ignore[attr-defined]
            table.add_row(t.instance_id, t.harness, t.status, t.outcome or "-", str(t.steps), key=t.id)
        if highlighted is not None and highlighted in table.rows:
            table.move_cursor(row=table.get_row_index(highlighted))
        title = self.query_one("#trajectories-title", Label)
        title.update(f"Trajectories holding {self.search!r}: {table.row_count}" if self.search else "Trajectories")
        title.display = bool(table.row_count) or bool(self.search)
        table.display = bool(table.row_count)

    @work(thread=True, exclusive=True, group="step-search")
    def search_steps(self, text: str) -> None:
        """The steps holding `text`, once typing has paused (a newer search cancels this one)."""
        time.sleep(SEARCH_PAUSE)
        if get_current_worker().is_cancelled:
            return
        hits, more = step_hits(self.run_id, text, limit=STEP_HITS, store=self.app.store)  # type: ignore[attr-defined]
        if not get_current_worker().is_cancelled:
            self.app.call_from_thread(self.show_hits, text, hits, more)

    def show_hits(self, text: str, hits: list[StepHit], more: bool) -> None:
        """The steps a search for `text` found (`more`: it found more than these); none without one."""
        self.hits = hits
        table = self.query_one("#hits", DataTable)
        table.clear()
        beside = max((len(h.instance_id) + len(h.harness) for h in hits), default=0) + 28  # the other columns
        width = max(30, (self.size.width or 80) - beside)
        for number, hit in enumerate(hits):
            table.add_row(
                hit.instance_id,
                hit.harness,
                str(hit.index),
                hit.found_in,
                Text(around(hit.text, text, width)),
                key=str(number),
            )
        title = self.query_one("#hits-title", Label)
        count = f"the first {len(hits)}" if more else str(len(hits))
        title.update(f"Steps whose action or observation holds {text!r}: {count}")
        title.display = bool(text)
        table.display = bool(hits)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """`/` only while not typing a search (then it is text)."""
        return action != "search" or not any(bar.typing for bar in self.query(SearchBar))

    def action_search(self) -> None:
        self.query_one(SearchBar).open()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.search = event.value.strip()
        self.show_trajectories()
        if self.search:
            self.search_steps(self.search)
        else:
            self.workers.cancel_group(self, "step-search")
            self.show_hits("", [], False)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """`enter` in the search: to the trajectories it kept, else to the steps it found."""
        for name in ("#trajectories", "#hits"):
            table = self.query_one(name, DataTable)
            if table.row_count:
                table.focus()
                return

    def action_back(self) -> None:
        """`esc`: clear the search if there is one, else back to the runs."""
        bar = self.query_one(SearchBar)
        if self.search or bar.display:
            bar.close()
            self.search = ""
            self.show_trajectories()
            self.show_hits("", [], False)
            self.query_one("#trajectories", DataTable).focus()
        else:
            self.app.pop_screen()

    def action_open(self) -> None:
        """`enter` away from the lists: the highlighted trajectory (on a list, its row is selected)."""
        self.open_row("#trajectories", self._key(self.query_one("#trajectories", DataTable)))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.open_row(f"#{event.data_table.id}", str(event.row_key.value))

    def open_row(self, table: str, key: str | None) -> None:
        """A trajectory in its screen, or a step the search found in full."""
        if key is None:
            return
        if table == "#trajectories":
            self.app.push_screen(TrajectoryScreen(key))
        elif table == "#hits":
            hit = self.hits[int(key)]
            open_step(self, hit.trajectory_id, hit.index)

    @staticmethod
    def _key(table: DataTable) -> str | None:
        if not table.row_count:
            return None
        return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)
