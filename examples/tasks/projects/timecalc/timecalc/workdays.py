"""Business-day arithmetic with configurable weekends and holidays."""

from __future__ import annotations

from datetime import date, timedelta
from typing import Iterable

from .dates import as_date

ROLL_CONVENTIONS = ("following", "preceding", "modified_following")
_ONE_DAY = timedelta(days=1)


class BusinessCalendar:
    """Weekend days (0=Monday .. 6=Sunday) plus a set of holidays."""

    def __init__(self, holidays: Iterable = (), weekend: Iterable[int] = (5, 6)) -> None:
        self.holidays = frozenset(as_date(day) for day in holidays)
        self.weekend = frozenset(weekend)
        if len(self.weekend) >= 7:
            raise ValueError("a calendar needs at least one working weekday")

    def __repr__(self) -> str:
        return f"BusinessCalendar(holidays={len(self.holidays)}, weekend={sorted(self.weekend)})"

    def is_business_day(self, day: date) -> bool:
        return day.weekday() not in self.weekend and day not in self.holidays

    def next_business_day(self, day: date, include: bool = False) -> date:
        """First business day after *day* (or *day* itself when ``include``)."""
        day = day if include else day + _ONE_DAY
        while not self.is_business_day(day):
            day += _ONE_DAY
        return day

    def previous_business_day(self, day: date, include: bool = False) -> date:
        day = day if include else day - _ONE_DAY
        while not self.is_business_day(day):
            day -= _ONE_DAY
        return day

    def add_business_days(self, day: date, count: int) -> date:
        """Move *count* business days forward (or backward when negative).

        ``count == 0`` returns *day* unchanged, even on a weekend.
        """
        step = _ONE_DAY if count >= 0 else -_ONE_DAY
        remaining = count
        while remaining > 0:
            day += step
            if self.is_business_day(day):
                remaining -= 1
        return day

    def business_days_between(self, start: date, end: date) -> int:
        """Business days in ``[start, end)``; negative when *end* is earlier."""
        if end < start:
            return -self.business_days_between(end, start)
        count = 0
        day = start
        while day < end:
            if self.is_business_day(day):
                count += 1
            day += _ONE_DAY
        return count

    def roll(self, day: date, convention: str = "following") -> date:
        """Move a non-business *day* to a business day.

        ``modified_following`` rolls forward unless that changes the month,
        in which case it rolls backward.
        """
        if convention not in ROLL_CONVENTIONS:
            raise ValueError(f"unknown roll convention: {convention!r}")
        if self.is_business_day(day):
            return day
        if convention == "preceding":
            return self.previous_business_day(day)
        rolled = self.next_business_day(day)
        if convention == "modified_following" and rolled.month != day.month:
            return self.previous_business_day(day)
        return rolled
