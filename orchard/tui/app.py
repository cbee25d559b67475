"""`orchard tui`: watch runs, their metrics, live sandboxes and trajectories, refreshed from the store.

Screens (keys in the footer): Runs (`enter` opens one, `k` cycles the kind filter, `t` the status
filter), Run (metrics as sparklines, the eval matrix, its trajectories), Trajectory (each step's
action and observation, the value curve of credit assignment, rise-segment steps marked), and
Sandboxes (`s` from anywhere; `d` deletes the highlighted one). Everything is read from the store
(the SQLite file or `ORCHARD_DB_URL`) every `refresh` seconds, so it works beside any writer.
Keyboard-first, usable at 80x24, and `NO_COLOR` is honoured (by Textual).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, ClassVar

from rich.text import Text
from sqlmodel import col, func, select
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Label, Sparkline, Static

from orchard.errors import OrchardError
from orchard.store import (
    ExecRecord,
    MetricRecord,
    ResultRecord,
    RunRecord,
    SandboxRecord,
    StepRecord,
    TrajectoryRecord,
    session,
)
from orchard.store.runs import headline, list_runs, metrics_of

KINDS = [None, "eval", "collect", "credit", "sft", "rl", "value"]
STATUSES = [None, "running", "finished", "failed", "interrupted"]


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
        db_url = self.app.db_url  # type: ignore[attr-defined]
        runs = list_runs(kind=kind, status=status, db_url=db_url)
        with session(db_url) as db:
            graded = dict(db.exec(select(ResultRecord.run_id, func.count()).group_by(ResultRecord.run_id)).all())
            steps = dict(
                db.exec(select(MetricRecord.run_id, func.max(MetricRecord.step)).group_by(MetricRecord.run_id)).all()
            )
        for run in runs:
            progress = (
                f"{graded[run.id]} graded" if run.id in graded else f"step {steps[run.id]}" if steps.get(run.id) else ""
            )
            table.add_row(run.id, run.kind, run.status, _when(run.started_at), progress, headline(run), key=run.id)
        if table.row_count:
            table.move_cursor(row=min(selected, table.row_count - 1))

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
        db_url = self.app.db_url  # type: ignore[attr-defined]
        with session(db_url) as db:
            run = db.get(RunRecord, self.run_id)
            trajectories = list(
                db.exec(
                    select(TrajectoryRecord)
                    .where(TrajectoryRecord.run_id == self.run_id)
                    .order_by(col(TrajectoryRecord.instance_id))
                )
            )
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
        lines.append(headline(run))
        lines.append(f"config: {_one_line(run.config, 300)}")
        self.query_one("#about", Static).update(Text("\n".join(lines)))
        box = self.query_one("#metrics", VerticalScroll)
        for name, points in sorted(metrics_of(run.id, db_url=db_url).items()):
            values = [v for _, v in points]
            box.mount(Label(f"{name}: {values[-1]:.4g} (step {points[-1][0]}, {len(values)} points)"))
            if len(values) > 1:
                box.mount(Sparkline(values, summary_function=max))
        matrix = self.query_one("#matrix", DataTable)
        matrix.add_columns("harness", "resolved", "rate", "outcomes")
        for harness, row in json.loads(run.summary).get("harnesses", {}).items():
            outcomes = ", ".join(f"{k} {v}" for k, v in row.get("outcomes", {}).items())
            matrix.add_row(
                harness,
                f"{row.get('resolved', 0)}/{row.get('attempts', 0)}",
                f"{row.get('resolve_rate', 0):.0%}",
                outcomes,
            )
        table = self.query_one("#trajectories", DataTable)
        table.add_columns("task", "harness", "status", "verdict", "steps")
        for t in trajectories:
            verdict = t.outcome or "-"
            table.add_row(t.instance_id, t.harness, t.status, verdict, str(t.steps), key=t.id)
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


class TrajectoryScreen(Screen):
    BINDINGS: ClassVar = [Binding("escape", "app.pop_screen", "Back"), Binding("q", "app.quit", "Quit")]

    def __init__(self, trajectory_id: str) -> None:
        super().__init__()
        self.trajectory_id = trajectory_id

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll():
            yield Static(id="about")
            yield Sparkline([], id="values", summary_function=max)
            yield DataTable(id="steps", cursor_type="row")
            yield Static(id="patch")
        yield Footer()

    def on_mount(self) -> None:
        db_url = self.app.db_url  # type: ignore[attr-defined]
        with session(db_url) as db:
            t = db.get(TrajectoryRecord, self.trajectory_id)
            steps = list(
                db.exec(
                    select(StepRecord)
                    .where(StepRecord.trajectory_id == self.trajectory_id)
                    .order_by(col(StepRecord.index))
                )
            )
            result = db.exec(select(ResultRecord).where(ResultRecord.trajectory_id == self.trajectory_id)).first()
        if t is None:
            self.query_one("#about", Static).update(f"no trajectory {self.trajectory_id}")
            return
        about = [
            f"{t.instance_id}  {t.harness}  {t.model}",
            f"status {t.status}, verdict {t.outcome or '-'}, {t.steps} steps",
        ]
        if t.error:
            about.append(f"error: {t.error}")
        values = [s.value for s in steps if s.value is not None]
        if values:
            about.append("value after each step: " + " ".join(f"{v:.2f}" for v in values))
        self.query_one("#about", Static).update(Text("\n".join(about)))
        self.query_one("#values", Sparkline).data = values or [0.0]
        table = self.query_one("#steps", DataTable)
        table.add_columns("#", "credit", "", "action", "observation")
        for s in steps:
            actions = json.loads(s.actions)
            action = (s.format_error and f"format error: {s.format_error}") or "; ".join(
                _action_text(a) for a in actions
            )
            rise = "▲" if s.credit is not None and s.credit >= 0.05 else ""
            credit = "-" if s.credit is None else f"{s.credit:+.2f}"
            table.add_row(str(s.index), credit, rise, Text(_one_line(action, 40)), Text(_one_line(s.observation, 40)))
        tests = ""
        if result is not None:
            grade = json.loads(result.grade)
            tests = "\n".join(f"  {status:<8} {name}" for name, status in grade.get("tests", {}).items())
        patch = t.patch or "(empty patch)"
        self.query_one("#patch", Static).update(Text(f"final patch:\n{patch}\n\ntests:\n{tests or '  (not graded)'}"))


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
        db_url, now = self.app.db_url, self.app.now()  # type: ignore[attr-defined]
        with session(db_url) as db:
            live = list(
                db.exec(
                    select(SandboxRecord)
                    .where(col(SandboxRecord.status).in_(["pending", "ready"]))
                    .order_by(col(SandboxRecord.created_at))
                )
            )
            counts = dict(
                db.exec(
                    select(ExecRecord.sandbox_id, func.count())
                    .where(col(ExecRecord.sandbox_id).in_([s.id for s in live]))
                    .group_by(ExecRecord.sandbox_id)
                ).all()
            )
            last = {}
            for sandbox in live:
                row = db.exec(
                    select(ExecRecord.command)
                    .where(ExecRecord.sandbox_id == sandbox.id)
                    .order_by(col(ExecRecord.created_at).desc())
                ).first()
                last[sandbox.id] = row or ""
        table = self.query_one(DataTable)
        table.clear()
        for s in live:
            table.add_row(
                s.id,
                s.image,
                s.network,
                _age(now - s.created_at),
                str(counts.get(s.id, 0)),
                _one_line(last[s.id], 30),
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


class OrchardApp(App):
    """The dashboard over one store."""

    TITLE = "Orchard"
    CSS = """
    .title { margin-top: 1; text-style: bold; }
    #metrics { height: auto; }
    Sparkline { height: 2; margin-bottom: 1; }
    DataTable { height: auto; max-height: 16; }
    #runs { height: 1fr; max-height: 100%; }
    #sandboxes { height: 1fr; max-height: 100%; }
    """
    SCREENS: ClassVar = {"sandboxes": SandboxesScreen}

    def __init__(
        self,
        db_url: str | None = None,
        *,
        refresh_seconds: float = 2.0,
        now: Callable[[], float] = time.time,
        delete_sandbox: Callable[[str], None] | None = None,
    ):
        super().__init__()
        self.db_url, self.refresh_seconds, self.now = db_url, refresh_seconds, now
        self._delete = delete_sandbox

    def on_mount(self) -> None:
        self.push_screen(RunsScreen())

    def delete_sandbox(self, sandbox_id: str) -> None:
        """Remove the container and mark the sandbox deleted in the store."""
        if self._delete is not None:
            self._delete(sandbox_id)
            return
        from orchard.env.backends import backend_config

        backend_config("docker").build().delete(sandbox_id)
        with session(self.db_url) as db:
            record = db.get(SandboxRecord, sandbox_id)
            if record is not None:
                record.status, record.deleted_at = "deleted", time.time()
                db.add(record)
