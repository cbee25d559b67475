"""Recurring schedules: every N days, weeks (on given weekdays) or months."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Iterator, Optional

from .dates import as_date, parse_weekday, weeks_between
from .workdays import ROLL_CONVENTIONS, BusinessCalendar

FREQUENCIES = ("daily", "weekly", "monthly")


@dataclass(frozen=True)
class Schedule:
    """A recurrence rule anchored at *start*.

    * ``daily``: every *interval* days from *start*.
    * ``weekly``: on *weekdays* (default: the weekday of *start*) of every
      *interval*-th week, counting from the week of *start*.
    * ``monthly``: on *day_of_month* (default: the day of *start*) of every
      *interval*-th month.

    With a *calendar*, occurrences on non-business days are moved with the
    *roll* convention.
    """

    freq: str
    start: date
    interval: int = 1
    weekdays: tuple = ()
    day_of_month: Optional[int] = None
    calendar: Optional[BusinessCalendar] = None
    roll: str = "following"

    def __post_init__(self) -> None:
        start = as_date(self.start)
        object.__setattr__(self, "start", start)
        if self.freq not in FREQUENCIES:
            raise ValueError(f"unknown frequency: {self.freq!r}")
        if self.interval < 1:
            raise ValueError("interval must be at least 1")
        if self.roll not in ROLL_CONVENTIONS:
            raise ValueError(f"unknown roll convention: {self.roll!r}")
        days = {parse_weekday(d) if isinstance(d, str) else int(d) for d in self.weekdays}
        if any(not 0 <= d <= 6 for d in days):
            raise ValueError("weekdays must be between 0 (Monday) and 6 (Sunday)")
        if self.freq == "weekly" and not days:
            days = {start.weekday()}
        object.__setattr__(self, "weekdays", tuple(sorted(days)))
        if self.freq == "monthly":
            day_of_month = self.day_of_month or start.day
            if not 1 <= day_of_month <= 31:
                raise ValueError("day_of_month must be between 1 and 31")
            object.__setattr__(self, "day_of_month", day_of_month)

    def _raw(self) -> Iterator[date]:
        if self.freq == "daily":
            day = self.start
            while True:
                yield day
                day += timedelta(days=self.interval)
        elif self.freq == "weekly":
            day = self.start
            while True:
                if day.weekday() in self.weekdays and weeks_between(self.start, day) % self.interval == 0:
                    yield day
                day += timedelta(days=1)
        else:
            year, month = self.start.year, self.start.month
            while True:
                day = date(year, month, self.day_of_month)
                if day >= self.start:
                    yield day
                year, month = divmod(year * 12 + month - 1 + self.interval, 12)
                month += 1

    def __iter__(self) -> Iterator[date]:
        """All occurrences (rolled to business days when there is a calendar)."""
        previous = None
        for day in self._raw():
            if self.calendar is not None:
                day = self.calendar.roll(day, self.roll)
            if day != previous:
                yield day
            previous = day

    def occurrences(self, count: Optional[int] = None, until=None) -> list[date]:
        """The first *count* occurrences and/or those up to *until* (inclusive)."""
        if count is None and until is None:
            raise ValueError("give count or until, the schedule is endless")
        limit = None if until is None else as_date(until)
        result: list[date] = []
        if count == 0:
            return result
        for day in self:
            if limit is not None and day > limit:
                break
            result.append(day)
            if count is not None and len(result) >= count:
                break
        return result

    def between(self, start, end) -> list[date]:
        """Occurrences from *start* to *end*, both inclusive."""
        first = as_date(start)
        return [day for day in self.occurrences(until=end) if day >= first]

    def next_after(self, day) -> date:
        day = as_date(day)
        for occurrence in self:
            if occurrence > day:
                return occurrence
        raise AssertionError("unreachable: schedules are endless")


_EVERY_RE = re.compile(r"every (?:(\d+) )?(day|week|month)s?(?: on (.+))?")
_ALIASES = {"daily": "every day", "weekly": "every week", "monthly": "every month"}


def parse_schedule(text: str, start, calendar: Optional[BusinessCalendar] = None) -> Schedule:
    """Build a schedule from ``"every 2 weeks on mon, thu"``-style text.

    Also understood: ``daily``, ``weekly``, ``monthly``, ``every weekday``,
    ``every 3 days`` and ``every month on the 15th``.
    """
    spec = " ".join(text.lower().split())
    spec = _ALIASES.get(spec, spec)
    if spec == "every weekday":
        return Schedule("weekly", start, weekdays=(0, 1, 2, 3, 4), calendar=calendar)
    match = _EVERY_RE.fullmatch(spec)
    if not match:
        raise ValueError(f"cannot parse schedule: {text!r}")
    interval = int(match.group(1) or 1)
    unit, on = match.group(2), match.group(3)
    if unit == "day":
        if on:
            raise ValueError(f"daily schedules take no 'on' part: {text!r}")
        return Schedule("daily", start, interval, calendar=calendar)
    if unit == "week":
        names = re.split(r"\s*,\s*|\s+and\s+", on) if on else []
        days = tuple(parse_weekday(name) for name in names)
        return Schedule("weekly", start, interval, weekdays=days, calendar=calendar)
    day_of_month = None
    if on:
        day_match = re.fullmatch(r"(?:the )?(\d{1,2})(?:st|nd|rd|th)?", on)
        if not day_match:
            raise ValueError(f"cannot parse day of month in {text!r}")
        day_of_month = int(day_match.group(1))
    return Schedule("monthly", start, interval, day_of_month=day_of_month, calendar=calendar)
