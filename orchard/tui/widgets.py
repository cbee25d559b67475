"""What the dashboard's screens share: a labelled chart with its range, the search bar, and how
times, spans and long text are written."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Label, Sparkline, Static


class Chart(Vertical):
    """A series as a sparkline under its name and latest value, with its scale beside it: the
    largest and smallest value on the left (level with the top and the bottom of the bars), the
    steps it spans and its first and last value on the right. A series of one point is its line
    alone: a bar of one value says nothing."""

    def __init__(self, name: str, points: Sequence[tuple[int, float]], *, id: str | None = None) -> None:
        super().__init__(id=id, classes="chart")
        self.series_name, self.points = name, list(points)

    def compose(self) -> ComposeResult:
        yield Label(self._title(), classes="chart-title")
        with Horizontal(classes="chart-row"):
            yield Static(classes="chart-scale")
            yield Sparkline([], summary_function=max)
            yield Static(classes="chart-span")

    def on_mount(self) -> None:
        self.show(self.points)

    def show(self, points: Sequence[tuple[int, float]]) -> None:
        """Draw `points` ((step, value) in step order) instead of what the chart held."""
        self.points = list(points)
        self.query_one(".chart-title", Label).update(self._title())
        row = self.query_one(".chart-row", Horizontal)
        row.display = len(self.points) > 1
        if not row.display:
            return
        values = [value for _, value in self.points]
        self.query_one(Sparkline).data = values
        self.query_one(".chart-scale", Static).update(scale_text(values))
        self.query_one(".chart-span", Static).update(span_text(self.points))

    def _title(self) -> str:
        if not self.points:
            return f"{self.series_name}: no values"
        step, value = self.points[-1]
        return f"{self.series_name}: {value:.4g} (step {step}, {len(self.points)} points)"


def scale_text(values: Sequence[float]) -> Text:
    """`max 3` over `min 1.25`, the numbers aligned: the top and the bottom of the bars."""
    high, low = f"{max(values):.4g}", f"{min(values):.4g}"
    width = max(len(high), len(low))
    return Text(f"max {high:<{width}}\nmin {low:<{width}}")


def span_text(points: Sequence[tuple[int, float]]) -> Text:
    """`steps 1-5` over `first 3, last 1.25`: what the bars run over, from left to right."""
    (first_step, first), (last_step, last) = points[0], points[-1]
    return Text(f"steps {first_step}-{last_step}\nfirst {first:.4g}, last {last:.4g}")


class SearchBar(Horizontal):
    """The `/` search of a screen, one line over the footer: hidden until `/` opens it; what is
    typed filters at once (its `Input.Changed`); the screen clears it with `esc`."""

    def __init__(self, placeholder: str) -> None:
        super().__init__(id="search", classes="search")
        self.placeholder = placeholder

    def compose(self) -> ComposeResult:
        yield Label("/")
        yield Input(placeholder=self.placeholder)

    @property
    def typing(self) -> bool:
        """Whether keys go into it now (then `/` is text, not the key that opens it)."""
        return self.display and self.screen.focused is self.query_one(Input)  # `has_focus` lags behind

    def open(self) -> None:
        """Shown and focused at once, so that the keys typed right after `/` are its text.

        The screens bind `/` with priority: the app runs it as the key arrives, before it passes
        the keys behind it on to the focused widget (a plain binding runs only once `/` has gone
        through the focused widget, by which time the keys behind it went there too, and were
        lost). So `/` is a key of the screen only while nothing is typed here (`typing`)."""
        self.display = True
        self.screen.set_focus(self.query_one(Input))

    def close(self) -> None:
        """Empty and hidden (the screen then shows everything again)."""
        self.query_one(Input).value = ""
        self.display = False


def when(at: float | None) -> str:
    return time.strftime("%m-%d %H:%M", time.localtime(at)) if at else "-"


def span(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 90 else f"{seconds / 60:.0f}m" if seconds < 5400 else f"{seconds / 3600:.1f}h"


def age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def one_line(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def around(text: str, found: str, width: int) -> str:
    """`text` on one line, cut to `width` around the first place `found` is in it (case ignored),
    so the match is in sight."""
    flat = " ".join(text.split())
    at = flat.lower().find(found.lower())
    if len(flat) <= width or at < 0:
        return one_line(flat, width)
    start = max(0, at - width // 3)
    if start == 0:
        return flat[: width - 1] + "…"
    if start + width - 1 >= len(flat):
        return "…" + flat[len(flat) - width + 1 :]
    return "…" + flat[start : start + width - 2] + "…"
