"""Relative date expressions.

Words are applied left to right, starting from *base*::

    resolve("+3bd", base)                 three business days after base
    resolve("2026-03-01 +1mo -2d", base)  an anchor date, then offsets
    resolve("next friday", base)          strictly after base
    resolve("eom", base)                  end of base's month

Anchors: ``today``, ``tomorrow``, ``yesterday`` and ISO dates.  Offsets:
``+N`` or ``-N`` followed by ``d`` (days), ``w`` (weeks), ``mo`` (months),
``y`` (years) or ``bd`` (business days).  Also ``next``/``last`` followed by
a weekday name or by ``business day``.
"""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Optional

from .dates import add_months, as_date, days_in_month, next_weekday, parse_weekday
from .workdays import BusinessCalendar

DEFAULT_CALENDAR = BusinessCalendar()
_OFFSET_RE = re.compile(r"([+-])(\d+)(d|w|mo|y|bd)")
_ISO_RE = re.compile(r"\d{4}-\d{2}-\d{2}")


class ExprError(ValueError):
    """Raised for expressions that cannot be understood."""


def _shift(day: date, amount: int, unit: str, calendar: BusinessCalendar = DEFAULT_CALENDAR) -> date:
    if unit == "d":
        return day + timedelta(days=amount)
    if unit == "w":
        return day + timedelta(weeks=amount)
    if unit == "mo":
        return add_months(day, amount)
    if unit == "y":
        return add_months(day, 12 * amount)
    return calendar.add_business_days(day, amount)


def resolve(expression: str, base, calendar: Optional[BusinessCalendar] = None) -> date:
    """Evaluate *expression* relative to *base* (see the module docstring).

    *calendar* supplies weekends and holidays for business-day words; the
    default calendar has Saturday/Sunday weekends and no holidays.
    """
    cal = calendar if calendar is not None else DEFAULT_CALENDAR
    base = as_date(base)
    words = expression.lower().replace(",", " ").split()
    if not words:
        raise ExprError("empty date expression")
    day = base
    index = 0
    while index < len(words):
        word = words[index]
        if word == "today":
            day = base
        elif word == "tomorrow":
            day = base + timedelta(days=1)
        elif word == "yesterday":
            day = base - timedelta(days=1)
        elif word == "eom":
            day = day.replace(day=days_in_month(day.year, day.month))
        elif _ISO_RE.fullmatch(word):
            try:
                day = as_date(word)
            except ValueError as exc:
                raise ExprError(str(exc)) from None
        elif word in ("next", "last"):
            target = words[index + 1 : index + 3]
            if target == ["business", "day"]:
                if word == "next":
                    day = cal.next_business_day(day)
                else:
                    day = cal.previous_business_day(day)
                index += 2
            else:
                try:
                    weekday = parse_weekday(target[0]) if target else -1
                except ValueError:
                    weekday = -1
                if weekday < 0:
                    raise ExprError(f"{word!r} needs a weekday in {expression!r}")
                if word == "next":
                    day = next_weekday(day, weekday)
                else:
                    day -= timedelta(days=(day.weekday() - weekday) % 7 or 7)
                index += 1
        else:
            match = _OFFSET_RE.fullmatch(word)
            if not match:
                raise ExprError(f"cannot understand {word!r} in {expression!r}")
            sign, amount, unit = match.groups()
            day = _shift(day, -int(amount) if sign == "-" else int(amount), unit)
        index += 1
    return day
