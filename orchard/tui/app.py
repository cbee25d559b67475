"""`orchard tui`: watch runs, their metrics, live sandboxes and trajectories, refreshed from the store.

Screens (keys in the footer): Runs (`enter` opens one, `k` cycles the kind filter, `t` the status
filter), Run (metrics as sparklines, the eval matrix, its trajectories), Trajectory (each step's
action and observation, the value curve of credit assignment, rise-segment steps marked: credit
at least the `credit.epsilon` the run was configured with), and Sandboxes (`s` from anywhere; `d`
deletes the highlighted one, through the service or a manager: see `delete_sandbox`). Everything
is read from the store (the SQLite file or `ORCHARD_DB_URL`) through `orchard.store.views`, the
read model `orchard runs show` shares, every `refresh` seconds, so it works beside any writer.
Keyboard-first, usable at 80x24, and `NO_COLOR` is honoured (by Textual). The layout is `app.tcss`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Label, Sparkline, Static

from orchard.errors import NotFound, OrchardError
from orchard.store import Store, views
from orchard.train.credit import EPSILON

KINDS = [None, "eval", "collect", "credit", "sft", "rl", "value"]
STATUSES = [None, "running", "finished", "failed", "interrupted"]


def _progress(run: views.RunRow, now: float) -> str:
    """`3/10 graded, ETA 2m` for a running evaluation (the ETA from its pace so far), `10/10
    graded` once it ended, `step 5` for a training stage."""
    if run.total:
        done = f"{run.graded}/{run.total} graded"
        if run.status != "running" or not run.graded or run.graded >= run.total:
            return done
        left = (now - run.started_at) / run.graded * (run.total - run.graded)
        return f"{done}, ETA {_span(left)}"
    return f"{run.graded} graded" if run.graded else f"step {run.last_step}" if run.last_step else ""


def _span(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 90 else f"{seconds / 60:.0f}m" if seconds < 5400 else f"{seconds / 3600:.1f}h"


def _when(at: float | None) -> str:
    return time.strftime("%m-%d %H:%M", time.localtime(at)) if at else "-"


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


class RunsScreen(Screen):
    BINDINGS: ClassVar = [
        Binding("enter", "open", "Open"),
        Binding("k", "kind", "Kind filter"),
        Binding("t", "status", "Status filter"),
        Binding("s", "app.push_screen('sandboxes')", "Sandboxes"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.kind_index = self.status_index = 0

    def compose(self) -> ComposeResult:
        yield Header()
        yield Label("", id="filters")
        yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield Static("", id="hint")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("run", "kind", "status", "started", "progress", "headline")
        self.reload()
        self.set_interval(self.app.refresh_seconds, self.reload)  # type: ignore[attr-defined]

    def reload(self) -> None:
        kind, status = KINDS[self.kind_index], STATUSES[self.status_index]
        self.query_one("#filters", Label).update(f"kind: {kind or 'all'}   status: {status or 'all'}")
        table = self.query_one(DataTable)
        selected = table.cursor_row
        table.clear()
        for run in views.runs(kind=kind, status=status, store=self.app.store):  # type: ignore[attr-defined]
            progress = _progress(run, self.app.now())  # type: ignore[attr-defined]
            table.add_row(run.id, run.kind, run.status, _when(run.started_at), progress, run.headline, key=run.id)
        if table.row_count:
            table.move_cursor(row=min(selected, table.row_count - 1))
        hint = self.query_one("#hint", Static)
        hint.display = not table.row_count
        hint.update(
            "no runs match these filters: k and t change them"
            if kind or status
            else "no runs yet: `orchard eval --tasks examples/tasks/tasks.jsonl --model scripted:gold` makes one, "
            "and `orchard train RECIPE` a run of each stage"
        )

    def action_kind(self) -> None:
        self.kind_index = (self.kind_index + 1) % len(KINDS)
        self.reload()

    def action_status(self) -> None:
        self.status_index = (self.status_index + 1) % len(STATUSES)
        self.reload()

    def action_open(self) -> None:
        table = self.query_one(DataTable)
        if table.row_count:
            run_id = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
            self.app.push_screen(RunScreen(str(run_id)))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.app.push_screen(RunScreen(str(event.row_key.value)))


class RunScreen(Screen):
    BINDINGS: ClassVar = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("enter", "open", "Trajectory"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll():
            yield Static(id="about")
            yield VerticalScroll(id="metrics")
            yield Label("Results by harness", classes="title", id="matrix-title")
            yield DataTable(id="matrix", cursor_type="none")
            yield Label("Trajectories", classes="title", id="trajectories-title")
            yield DataTable(id="trajectories", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        run = views.run_view(self.run_id, store=self.app.store)  # type: ignore[attr-defined]
        if run is None:
            self.query_one("#about", Static).update(f"no run {self.run_id}")
            return
        lines = [
            f"{run.id}  {run.kind}  {run.status}",
            run.name,
            f"started {_when(run.started_at)}, ended {_when(run.ended_at)}",
        ]
        if run.error:
            lines.append(f"error: {run.error}")
        lines.append(run.headline)
        lines.append(f"config: {_one_line(run.config, 300)}")
        self.query_one("#about", Static).update(Text("\n".join(lines)))
        box = self.query_one("#metrics", VerticalScroll)
        for metric in run.metrics:
            step, value = metric.points[-1]
            box.mount(Label(f"{metric.name}: {value:.4g} (step {step}, {len(metric.points)} points)"))
            if len(metric.points) > 1:
                box.mount(Sparkline(metric.values, summary_function=max))
        matrix = self.query_one("#matrix", DataTable)
        matrix.add_columns("harness", "resolved", "rate", "machine errors", "outcomes")
        for row in run.harnesses:
            outcomes = ", ".join(f"{k} {v}" for k, v in row.outcomes.items())
            rate = f"{row.resolve_rate:.0%}" if row.graded else "-"
            errors = Text(str(row.machine_errors), style="red" if row.machine_errors else "")
            matrix.add_row(row.harness, f"{row.resolved}/{row.graded}", rate, errors, outcomes)
        table = self.query_one("#trajectories", DataTable)
        table.add_columns("task", "harness", "status", "verdict", "steps")
        for t in run.trajectories:
            table.add_row(t.instance_id, t.harness, t.status, t.outcome or "-", str(t.steps), key=t.id)
        for name, shown in (("matrix", matrix.row_count), ("trajectories", table.row_count)):
            self.query_one(f"#{name}-title").display = self.query_one(f"#{name}").display = bool(shown)
        if table.row_count:
            table.focus()

    def action_open(self) -> None:
        table = self.query_one("#trajectories", DataTable)
        if table.row_count:
            key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
            self.app.push_screen(TrajectoryScreen(str(key)))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.app.push_screen(TrajectoryScreen(str(event.row_key.value)))


class StepScreen(Screen):
    """One step in full, scrollable: the model's reply, each tool call with its arguments, and
    what came back."""

    BINDINGS: ClassVar = [Binding("escape", "app.pop_screen", "Back"), Binding("q", "app.quit", "Quit")]

    def __init__(self, trajectory: views.TrajectoryView, step: views.StepView) -> None:
        super().__init__()
        self.trajectory, self.step = trajectory, step

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll():
            yield Static(self._text(), id="step")
        yield Footer()

    def _text(self) -> Text:
        s, t = self.step, self.trajectory
        text = Text(f"{t.instance_id}  {t.harness}  step {s.index}", style="bold")
        figures = [
            f"value {s.value:.2f}" if s.value is not None else "",
            f"credit {s.credit:+.2f}" if s.credit is not None else "",
        ]
        text.append("  " + "  ".join(f for f in figures if f) + ("  rise" if s.rise else "") + "\n\n")
        text.append("model reply\n", style="bold underline")
        text.append((s.reply or "(no text)") + "\n\n")
        if s.format_error:
            text.append(f"format error: {s.format_error}\n\n", style="red")
        text.append(f"tool calls ({len(s.actions)})\n", style="bold underline")
        for action in s.actions:
            arguments = action.get("arguments")
            shown = json.dumps(arguments, indent=2) if not isinstance(arguments, str) else arguments
            text.append(f"{action.get('name')}\n", style="cyan")
            text.append(shown + "\n")
        text.append("\nobservation\n", style="bold underline")
        text.append(s.observation or "(nothing)")
        return text


class TrajectoryScreen(Screen):
    BINDINGS: ClassVar = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("enter", "open_step", "Step in full"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, trajectory_id: str) -> None:
        super().__init__()
        self.trajectory_id = trajectory_id
        self.shots: dict[int, str] = {}
        """The screenshot file each step left (browser tasks)."""
        self.view: views.TrajectoryView | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll():
            yield Static(id="about")
            yield Sparkline([], id="values", summary_function=max)
            yield DataTable(id="steps", cursor_type="row")
            yield Static(id="screenshot")
            yield Static(id="patch")
        yield Footer()

    def on_mount(self) -> None:
        t = views.trajectory_view(self.trajectory_id, default_epsilon=EPSILON, store=self.app.store)  # type: ignore[attr-defined]
        if t is None:
            self.query_one("#about", Static).update(f"no trajectory {self.trajectory_id}")
            return
        about = [
            f"{t.instance_id}  {t.harness}  {t.model}",
            f"status {t.status}, verdict {t.outcome or '-'}, {t.steps_taken} steps",
        ]
        if t.error:
            about.append(f"error: {t.error}")
        values = [s.value for s in t.steps if s.value is not None]
        if values:
            about.append("value after each step: " + " ".join(f"{v:.2f}" for v in values))
        self.query_one("#about", Static).update(Text("\n".join(about)))
        chart = self.query_one("#values", Sparkline)
        chart.data, chart.display = values or [0.0], bool(values)  # no chart without data
        self.view = t
        table = self.query_one("#steps", DataTable)
        table.add_columns("#", "credit", "", "action", "observation")
        cell = max(40, ((self.size.width or 80) - 24) // 2)  # the rest of the screen, half each
        for s in t.steps:
            action = (s.format_error and f"format error: {s.format_error}") or "; ".join(
                _action_text(a) for a in s.actions
            )
            credit = "-" if s.credit is None else f"{s.credit:+.2f}"
            table.add_row(
                str(s.index),
                credit,
                "▲" if s.rise else "",
                Text(_one_line(action, cell)),
                Text(_one_line(s.observation, cell)),
                key=str(s.index),
            )
        self.shots = {s.index: s.screenshot for s in t.steps if s.screenshot}
        if self.shots:
            self.show_screenshot(min(self.shots))
        tests = "\n".join(f"  {status:<8} {name}" for name, status in (t.tests or {}).items())
        shown = Text("final patch:\n")
        shown.append_text(_diff(t.patch) if t.patch else Text("(empty patch)"))
        shown.append(f"\n\ntests:\n{tests or '  (not graded)'}")
        self.query_one("#patch", Static).update(shown)

    def action_open_step(self) -> None:
        table = self.query_one("#steps", DataTable)
        if self.view is not None and table.row_count:
            index = int(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value or 0)
            step = next((s for s in self.view.steps if s.index == index), None)
            if step is not None:
                self.app.push_screen(StepScreen(self.view, step))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open_step()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if self.shots and event.row_key.value is not None:
            self.show_screenshot(int(event.row_key.value))

    def show_screenshot(self, index: int) -> None:
        """The screenshot the step left (or the newest one before it), drawn, with its file."""
        from orchard.tui.picture import half_blocks

        earlier = [i for i in self.shots if i <= index]
        shown_widget = self.query_one("#screenshot", Static)
        shown_widget.display = bool(earlier)
        if not earlier:
            return
        shown = max(earlier)
        path = self.shots[shown]
        width = max(20, min(100, self.size.width - 4)) if self.size.width else 80
        picture = Text(f"screenshot after step {shown}: {path}\n")
        picture.append_text(half_blocks(path, width))
        shown_widget.update(picture)


def _diff(patch: str) -> Text:
    """A patch coloured as a diff: added lines green, removed red, hunk heads cyan, file heads bold."""
    text = Text()
    for line in patch.splitlines(keepends=True):
        style = (
            "bold" if line.startswith(("diff --git", "+++ ", "--- "))
            else "green" if line.startswith("+")
            else "red" if line.startswith("-")
            else "cyan" if line.startswith("@@")
            else ""
        )  # fmt: skip
        text.append(line, style=style)
    return text


def _action_text(action: dict[str, Any]) -> str:
    arguments = action.get("arguments")
    if isinstance(arguments, dict):
        inner = arguments.get("command") or arguments.get("path") or json.dumps(arguments)
        return f"{action.get('name')}: {inner if isinstance(inner, str) else json.dumps(inner)}"
    return str(action.get("name"))


def _one_line(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


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
            age, last = _age(now - s.created_at), _one_line(s.last_command, 30)
            table.add_row(s.id, s.image, s.network, age, str(s.commands), last, key=s.id)
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
