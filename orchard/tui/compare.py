"""The Compare screen: two evaluations side by side (marked with `space` on the runs list, `c`).

The figures are those of `orchard runs compare` (`orchard.eval.compare`), from the same parts:
attempts a machine error ended are left out (`machine_error`); a rate is the mean over tasks of
each task's share of resolved samples, with its 95% interval, and the change is paired by task,
over the tasks both runs graded (`orchard.eval.intervals`); a task's cell is its outcome, or
`resolved 2/3` over several samples (`outcome_cell`). Run A is the one that started first, so a
flip reads from A to B: ▲ resolved more often in B, ▼ less often.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Label, Static

from orchard.errors import OrchardError
from orchard.eval.compare import evaluation, graded_by_harness
from orchard.eval.intervals import change, rate, shares
from orchard.eval.report import outcome_cell
from orchard.store import ResultRecord, RunRecord, Store
from orchard.tui.widgets import when

TOTAL = "all"
"""The harness column of the totals line: every task under every harness, each a unit."""


@dataclass(frozen=True)
class Side:
    """One run's graded attempts under one harness (or all of them: `TOTAL`)."""

    graded: int
    resolved: int
    machine_errors: int
    rate: dict[str, Any]
    """`orchard.eval.intervals.rate`: the mean over tasks, `n` tasks, its interval `low`-`high`."""

    def cell(self) -> str:
        return f"{self.resolved}/{self.graded} {self.rate['rate']:.0%}" if self.graded else "-"


@dataclass(frozen=True)
class HarnessLine:
    """A harness in both runs (a side is None where its run has no attempt under it)."""

    harness: str
    a: Side | None
    b: Side | None
    change: dict[str, Any] | None
    """`orchard.eval.intervals.change` from A to B over the tasks both graded; None without both."""
    gained: int = 0
    lost: int = 0


@dataclass(frozen=True)
class TaskLine:
    task: str
    harness: str
    a: str
    b: str
    """Each run's `outcome_cell` of the task under the harness (`-`: not graded there)."""
    flip: int
    """+1 resolved more often in B than in A, -1 less often, 0 the same (or not graded in both)."""


@dataclass(frozen=True)
class Comparison:
    a: RunRecord
    b: RunRecord
    """A started first."""
    harnesses: list[HarnessLine]
    total: HarnessLine
    tasks: list[TaskLine]


def comparison(first: str, second: str, *, store: Store | None = None) -> Comparison:
    """Runs `first` and `second` compared; OrchardError naming what is wrong (the same run twice,
    a run the store lacks, a run that is no evaluation)."""
    if first == second:
        raise OrchardError("mark two different runs to compare")
    store = store or Store.open()
    a, b = sorted((evaluation(first, store), evaluation(second, store)), key=lambda run: run.started_at)
    columns = [_columns(run.id, store) for run in (a, b)]
    harnesses, tasks = [], []
    for harness in sorted(set(columns[0]) | set(columns[1])):
        pair = [found.get(harness) for found in columns]
        harnesses.append(_line(harness, pair))
        tasks += _tasks(harness, pair)
    return Comparison(a, b, harnesses, _line(TOTAL, [_all(found) for found in columns]), tasks)


@dataclass(frozen=True)
class _Column:
    """One run's attempts under one harness (or all of them)."""

    graded: list[ResultRecord]
    """Those that were graded (the ones a machine error ended left out)."""
    machine_errors: int
    shares: dict[str, float]
    """Each task's share of resolved samples (`shares`): the units of its rate and of a change."""


def _columns(run_id: str, store: Store) -> dict[str, _Column]:
    """A run's results by harness."""
    return {h: _Column(graded, lost, shares(graded)) for h, (graded, lost) in graded_by_harness(run_id, store).items()}


def _all(columns: dict[str, _Column]) -> _Column:
    """Every harness of a run as one column, a task under a harness one unit."""
    return _Column(
        [r for c in columns.values() for r in c.graded],
        sum(c.machine_errors for c in columns.values()),
        {f"{task} ({harness})": share for harness, c in columns.items() for task, share in c.shares.items()},
    )


def _line(harness: str, pair: list[_Column | None]) -> HarnessLine:
    """Both runs under `harness`; the change and the flips where both have attempts under it."""
    sides = [
        None if c is None else Side(len(c.graded), sum(r.resolved for r in c.graded), c.machine_errors, rate(c.shares))
        for c in pair
    ]
    before, after = pair
    if before is None or after is None:
        return HarnessLine(harness, sides[0], sides[1], None)
    both = set(before.shares) & set(after.shares)
    return HarnessLine(
        harness,
        sides[0],
        sides[1],
        change(before.shares, after.shares),
        gained=sum(after.shares[task] > before.shares[task] for task in both),
        lost=sum(after.shares[task] < before.shares[task] for task in both),
    )


def _tasks(harness: str, pair: list[_Column | None]) -> list[TaskLine]:
    """Each task graded under `harness` in either run, with its outcome in both and its flip."""
    before, after = (c.shares if c is not None else {} for c in pair)
    lines = []
    for task in sorted(set(before) | set(after)):
        cells = [outcome_cell([r for r in c.graded if r.instance_id == task]) if c else "-" for c in pair]
        flip = (after[task] > before[task]) - (after[task] < before[task]) if task in before and task in after else 0
        lines.append(TaskLine(task, harness, cells[0], cells[1], flip))
    return lines


class CompareScreen(Screen):
    """Two runs side by side: the resolve rates of both per harness, with the change and how many
    tasks flipped each way, and a totals line; then each task's outcome in both (`f`: only the
    tasks that flipped)."""

    BINDINGS: ClassVar = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("f", "flips", "Flips only"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, compared: Comparison) -> None:
        super().__init__()
        self.compared = compared
        self.flips_only = False

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll():
            yield Static(id="about")
            yield Label("Resolved by harness", classes="title")
            yield DataTable(id="rates", cursor_type="none")
            yield Label("", classes="title", id="tasks-title")
            yield DataTable(id="tasks", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        found = self.compared
        about = Text()
        for letter, run in (("A", found.a), ("B", found.b)):
            about.append(f"{letter}  ", style="bold")
            about.append(f"{run.id}  {run.status}, started {when(run.started_at)}  {run.name}\n")
        errors = [
            f"{letter} {side.machine_errors}"
            for letter, side in (("A", found.total.a), ("B", found.total.b))
            if side and side.machine_errors
        ]
        if errors:
            about.append(f"machine errors left out of the rates: {', '.join(errors)}\n")
        about.rstrip()
        self.query_one("#about", Static).update(about)
        rates = self.query_one("#rates", DataTable)
        rates.add_columns("harness", "A", "B", "change (95% interval)", "▲ gained", "▼ lost")
        for line in [*found.harnesses, found.total]:
            rates.add_row(*self._rate_cells(line), key=line.harness)
        self.query_one("#tasks", DataTable).add_columns("task", "harness", "A", "B", "flip")
        self.show_tasks()

    def _rate_cells(self, line: HarnessLine) -> list[Text]:
        moved = line.change
        shift = f"{moved['change']:+.0%} ({moved['low']:+.0%} to {moved['high']:+.0%})" if moved and moved["n"] else "-"
        cells = [line.harness, *(side.cell() if side else "-" for side in (line.a, line.b)), shift]
        cells += [str(line.gained), str(line.lost)] if moved else ["-", "-"]
        return [Text(cell, style="bold" if line.harness == TOTAL else "") for cell in cells]

    def show_tasks(self) -> None:
        """Each task's outcome in both runs, or only those that flipped."""
        table = self.query_one("#tasks", DataTable)
        table.clear()
        shown = [t for t in self.compared.tasks if t.flip or not self.flips_only]
        for t in shown:
            flip = Text("▲ gained", style="green") if t.flip > 0 else Text("▼ lost", style="red") if t.flip < 0 else ""
            table.add_row(t.task, t.harness, t.a, t.b, flip, key=f"{t.task}/{t.harness}")
        which = "that flipped" if self.flips_only else "(f: only those that flipped)"
        self.query_one("#tasks-title", Label).update(f"By task {which}: {len(shown)}")

    def action_flips(self) -> None:
        self.flips_only = not self.flips_only
        self.show_tasks()
