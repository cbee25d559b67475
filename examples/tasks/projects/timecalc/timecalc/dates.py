"""Small date helpers shared by the other modules."""

from __future__ import annotations

import calendar
from datetime import date, datetime, timedelta

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


def as_date(value) -> date:
    """Accept a date, a datetime (its date is used) or an ISO string."""
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    try:
        return date.fromisoformat(str(value).strip())
    except ValueError:
        raise ValueError(f"invalid date: {value!r}") from None


def parse_weekday(text: str) -> int:
    """``"monday"``, ``"Mon"`` or ``"mo"`` -> 0 ... ``"sunday"`` -> 6."""
    name = text.strip().lower().rstrip(".")
    if len(name) >= 2:
        for index, full in enumerate(WEEKDAYS):
            if full.startswith(name):
                return index
    raise ValueError(f"unknown weekday: {text!r}")


def days_in_month(year: int, month: int) -> int:
    return calendar.monthrange(year, month)[1]


def add_months(day: date, months: int) -> date:
    """Shift *day* by whole months, clamping to the end of shorter months.

    ``add_months(date(2026, 1, 31), 1)`` is ``date(2026, 2, 28)``.
    """
    index = day.year * 12 + (day.month - 1) + months
    year, month = divmod(index, 12)
    month += 1
    return date(year, month, min(day.day, days_in_month(year, month)))


def week_start(day: date) -> date:
    """The Monday of the week containing *day*."""
    return day - timedelta(days=day.weekday())


def weeks_between(start: date, end: date) -> int:
    """Number of week boundaries between the weeks of *start* and *end*.

    Days of the same (Monday-based) week give 0, consecutive weeks 1.
    """
    start_year, start_week, _ = start.isocalendar()
    end_year, end_week, _ = end.isocalendar()
    return (end_year - start_year) * 52 + (end_week - start_week)


def next_weekday(day: date, weekday: int, include: bool = False) -> date:
    """The first *weekday* after *day* (or on it, when ``include``)."""
    ahead = (weekday - day.weekday()) % 7
    if ahead == 0 and not include:
        ahead = 7
    return day + timedelta(days=ahead)
