"""The Trajectory screen (each step's action and observation, the value curve of credit assignment,
rise steps marked, the final patch coloured, a browser task's screenshots drawn) and the Step
screen (one step in full)."""

from __future__ import annotations

import json
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from orchard.eval.live import action_text
from orchard.store import views
from orchard.train.credit import EPSILON
from orchard.tui.widgets import Chart, one_line


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


def open_step(screen: Screen, trajectory_id: str, index: int) -> None:
    """Push the Step screen of step `index` of a trajectory (nothing if the store has neither)."""
    found = views.trajectory_view(trajectory_id, default_epsilon=EPSILON, store=screen.app.store)  # type: ignore[attr-defined]
    step = next((s for s in found.steps if s.index == index), None) if found is not None else None
    if found is not None and step is not None:
        screen.app.push_screen(StepScreen(found, step))


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
            yield Chart("value after each step", [], id="values")
            yield DataTable(id="steps", cursor_type="row")
            yield Static(id="screenshot")
            yield Static(id="patch")
        yield Footer()

    def on_mount(self) -> None:
        t = views.trajectory_view(self.trajectory_id, default_epsilon=EPSILON, store=self.app.store)  # type: ignore[attr-defined]
        chart = self.query_one("#values", Chart)
        if t is None:
            chart.display = False
            self.query_one("#about", Static).update(f"no trajectory {self.trajectory_id}")
            return
        about = [
            f"{t.instance_id}  {t.harness}  {t.model}",
            f"status {t.status}, verdict {t.outcome or '-'}, {t.steps_taken} steps",
        ]
        if t.error:
            about.append(f"error: {t.error}")
        values = [(s.index, s.value) for s in t.steps if s.value is not None]
        self.query_one("#about", Static).update(Text("\n".join(about)))
        chart.display = bool(values)  # no chart without data
        chart.show(values)
        self.view = t
        table = self.query_one("#steps", DataTable)
        table.add_columns("#", "credit", "", "action", "observation")
        cell = max(40, ((self.size.width or 80) - 24) // 2)  # the rest of the screen, half each
        for s in t.steps:
            action = (s.format_error and f"format error: {s.format_error}") or "; ".join(
                action_text(a) for a in s.actions
            )
            credit = "-" if s.credit is None else f"{s.credit:+.2f}"
            table.add_row(
                str(s.index),
                credit,
                "▲" if s.rise else "",
                Text(one_line(action, cell)),
                Text(one_line(s.observation, cell)),
                key=str(s.index),
            )
        self.shots = {s.index: s.screenshot for s in t.steps if s.screenshot}
        if self.shots:
            self.show_screenshot(min(self.shots))
        tests = "\n".join(f"  {status:<8} {name}" for name, status in (t.tests or {}).items())
        shown = Text("final patch:\n")
        shown.append_text(diff_text(t.patch) if t.patch else Text("(empty patch)"))
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


def diff_text(patch: str) -> Text:
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
