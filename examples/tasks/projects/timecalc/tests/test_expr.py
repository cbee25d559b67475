from datetime import date

import pytest

from timecalc import BusinessCalendar, ExprError, resolve

BASE = date(2026, 3, 4)  # a Wednesday


def test_anchors():
    assert resolve("today", BASE) == BASE
    assert resolve("tomorrow", BASE) == date(2026, 3, 5)
    assert resolve("yesterday", BASE) == date(2026, 3, 3)
    assert resolve("2026-12-24", BASE) == date(2026, 12, 24)


def test_offsets():
    assert resolve("+10d", BASE) == date(2026, 3, 14)
    assert resolve("-1w", BASE) == date(2026, 2, 25)
    assert resolve("+1y", date(2028, 2, 29)) == date(2029, 2, 28)
    assert resolve("2026-01-31 +1mo", BASE) == date(2026, 2, 28)


def test_business_days_default_calendar():
    assert resolve("+3bd", BASE) == date(2026, 3, 9)
    assert resolve("next business day", date(2026, 3, 6)) == date(2026, 3, 9)


def test_next_business_day_uses_calendar():
    cal = BusinessCalendar(holidays=["2026-03-09"])
    assert resolve("next business day", date(2026, 3, 6), calendar=cal) == date(2026, 3, 10)


def test_weekday_words():
    assert resolve("next friday", BASE) == date(2026, 3, 6)
    assert resolve("next wednesday", BASE) == date(2026, 3, 11)
    assert resolve("last monday", BASE) == date(2026, 3, 2)
    assert resolve("last wed", BASE) == date(2026, 2, 25)


def test_chaining_and_eom():
    assert resolve("eom", BASE) == date(2026, 3, 31)
    assert resolve("2026-03-01 +1mo eom -2d", BASE) == date(2026, 4, 28)


@pytest.mark.parametrize("text", ["", "soon", "next", "next holiday", "+3q", "2026-13-01"])
def test_errors(text):
    with pytest.raises(ExprError):
        resolve(text, BASE)
