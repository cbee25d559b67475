"""Parsing and formatting of durations such as ``1h30m`` or ``2d 4h``."""

from __future__ import annotations

import re
from datetime import timedelta

UNIT_SECONDS = {"w": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}
_UNIT_NAMES = {
    "w": "w", "wk": "w", "week": "w", "weeks": "w",
    "d": "d", "day": "d", "days": "d",
    "h": "h", "hr": "h", "hrs": "h", "hour": "h", "hours": "h",
    "m": "m", "min": "m", "mins": "m", "minute": "m", "minutes": "m",
    "s": "s", "sec": "s", "secs": "s", "second": "s", "seconds": "s",
}
_PART_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]+)")
_CLOCK_RE = re.compile(r"(\d+):([0-5]\d)(?::([0-5]\d))?")


class DurationError(ValueError):
    """Raised for text that is not a duration."""


def parse_duration(text: str) -> timedelta:
    """Parse ``"1h30m"``, ``"2 days 4 hours"``, ``"1.5h"``, ``"-15m"`` or ``"1:30"``.

    Units: w, d, h, m, s (and their long forms); each unit at most once.
    """
    source = text
    text = text.strip().lower()
    sign = 1
    if text[:1] in ("+", "-"):
        sign = -1 if text[0] == "-" else 1
        text = text[1:].lstrip()
    if not text:
        raise DurationError(f"empty duration: {source!r}")

    clock = _CLOCK_RE.fullmatch(text)
    if clock:
        hours, minutes, seconds = (int(group or 0) for group in clock.groups())
        return sign * timedelta(hours=hours, minutes=minutes, seconds=seconds)

    total = 0.0
    seen: set[str] = set()
    position = 0
    for match in _PART_RE.finditer(text):
        if text[position : match.start()].strip(" ,"):
            raise DurationError(f"invalid duration: {source!r}")
        unit = _UNIT_NAMES.get(match.group(2))
        if unit is None:
            raise DurationError(f"unknown unit {match.group(2)!r} in {source!r}")
        if unit in seen:
            raise DurationError(f"unit {unit!r} given twice in {source!r}")
        seen.add(unit)
        total += float(match.group(1)) * UNIT_SECONDS[unit]
        position = match.end()
    if not seen or text[position:].strip(" ,"):
        raise DurationError(f"invalid duration: {source!r}")
    return timedelta(seconds=sign * total)


def format_duration(value: timedelta, sep: str = " ") -> str:
    """Format *value* as ``"1d 2h 30m"``, leaving out zero parts.

    Fractions of a second are dropped; a zero duration is ``"0s"``.  The
    result can be read back with :func:`parse_duration`.
    """
    hours, rest = divmod(value.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = []
    for amount, unit in ((value.days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")):
        if amount:
            parts.append(f"{amount}{unit}")
    return sep.join(parts) or "0s"
