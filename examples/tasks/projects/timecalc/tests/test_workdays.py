from datetime import date

import pytest

from timecalc import BusinessCalendar

EASTER_2026 = ["2026-04-03", "2026-04-06"]  # Good Friday, Easter Monday


def test_is_business_day():
    cal = BusinessCalendar(holidays=EASTER_2026)
    assert cal.is_business_day(date(2026, 4, 2))
    assert not cal.is_business_day(date(2026, 4, 3))
    assert not cal.is_business_day(date(2026, 4, 4))


def test_custom_weekend():
    cal = BusinessCalendar(weekend=(4, 5))  # Friday/Saturday
    assert not cal.is_business_day(date(2026, 4, 3))
    assert cal.is_business_day(date(2026, 4, 5))
    with pytest.raises(ValueError):
        BusinessCalendar(weekend=range(7))


def test_next_and_previous_business_day():
    cal = BusinessCalendar(holidays=EASTER_2026)
    assert cal.next_business_day(date(2026, 4, 2)) == date(2026, 4, 7)
    assert cal.next_business_day(date(2026, 4, 2), include=True) == date(2026, 4, 2)
    assert cal.previous_business_day(date(2026, 4, 7)) == date(2026, 4, 2)


def test_add_business_days_forward():
    cal = BusinessCalendar(holidays=EASTER_2026)
    assert cal.add_business_days(date(2026, 4, 1), 1) == date(2026, 4, 2)
    assert cal.add_business_days(date(2026, 4, 1), 2) == date(2026, 4, 7)
    assert cal.add_business_days(date(2026, 4, 4), 0) == date(2026, 4, 4)


def test_business_days_between():
    cal = BusinessCalendar(holidays=EASTER_2026)
    assert cal.business_days_between(date(2026, 3, 30), date(2026, 4, 13)) == 8
    assert cal.business_days_between(date(2026, 4, 13), date(2026, 3, 30)) == -8
    assert cal.business_days_between(date(2026, 4, 1), date(2026, 4, 1)) == 0


def test_roll_conventions():
    cal = BusinessCalendar()
    saturday = date(2026, 10, 31)
    assert cal.roll(saturday) == date(2026, 11, 2)
    assert cal.roll(saturday, "preceding") == date(2026, 10, 30)
    assert cal.roll(saturday, "modified_following") == date(2026, 10, 30)
    assert cal.roll(date(2026, 10, 30), "preceding") == date(2026, 10, 30)
    with pytest.raises(ValueError):
        cal.roll(saturday, "nearest")
