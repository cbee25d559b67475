from datetime import date, datetime

import pytest

from timecalc import add_months, as_date, days_in_month, parse_weekday, week_start, weeks_between
from timecalc.dates import next_weekday


def test_as_date():
    assert as_date("2026-03-01") == date(2026, 3, 1)
    assert as_date(datetime(2026, 3, 1, 12, 30)) == date(2026, 3, 1)
    with pytest.raises(ValueError):
        as_date("March 1st")


def test_parse_weekday():
    assert parse_weekday("Monday") == 0
    assert parse_weekday("thu") == 3
    assert parse_weekday("Su") == 6
    with pytest.raises(ValueError):
        parse_weekday("t")  # tuesday or thursday?


def test_days_in_month():
    assert days_in_month(2026, 2) == 28
    assert days_in_month(2028, 2) == 29
    assert days_in_month(2026, 12) == 31


def test_add_months_clamps():
    assert add_months(date(2026, 1, 31), 1) == date(2026, 2, 28)
    assert add_months(date(2026, 3, 31), -1) == date(2026, 2, 28)
    assert add_months(date(2026, 11, 15), 3) == date(2027, 2, 15)


def test_week_start():
    assert week_start(date(2026, 3, 5)) == date(2026, 3, 2)
    assert week_start(date(2026, 3, 2)) == date(2026, 3, 2)


def test_weeks_between_same_year():
    assert weeks_between(date(2026, 3, 2), date(2026, 3, 8)) == 0
    assert weeks_between(date(2026, 3, 2), date(2026, 3, 16)) == 2
    assert weeks_between(date(2026, 3, 16), date(2026, 3, 2)) == -2


def test_weeks_between_across_new_year():
    assert weeks_between(date(2025, 12, 22), date(2026, 1, 5)) == 2


def test_next_weekday():
    friday = date(2026, 3, 6)
    assert next_weekday(friday, 0) == date(2026, 3, 9)
    assert next_weekday(friday, 4) == date(2026, 3, 13)
    assert next_weekday(friday, 4, include=True) == friday
