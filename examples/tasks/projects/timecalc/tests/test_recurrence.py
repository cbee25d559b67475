from datetime import date

import pytest

from timecalc import BusinessCalendar, Schedule, parse_schedule


def test_daily_interval():
    schedule = Schedule("daily", "2026-03-01", interval=3)
    assert schedule.occurrences(count=3) == [date(2026, 3, 1), date(2026, 3, 4), date(2026, 3, 7)]


def test_weekly_on_several_days():
    schedule = Schedule("weekly", date(2026, 3, 4), weekdays=("mon", "thu"))
    assert schedule.occurrences(count=4) == [
        date(2026, 3, 5), date(2026, 3, 9), date(2026, 3, 12), date(2026, 3, 16),
    ]


def test_weekly_every_other_week():
    schedule = Schedule("weekly", date(2026, 3, 2), interval=2, weekdays=(0, 2))
    assert schedule.occurrences(until="2026-03-31") == [
        date(2026, 3, 2), date(2026, 3, 4), date(2026, 3, 16), date(2026, 3, 18),
        date(2026, 3, 30),
    ]


def test_monthly_default_day():
    schedule = Schedule("monthly", date(2026, 1, 15), interval=2)
    assert schedule.occurrences(count=3) == [date(2026, 1, 15), date(2026, 3, 15), date(2026, 5, 15)]


def test_monthly_starts_after_start_date():
    schedule = Schedule("monthly", date(2026, 1, 20), day_of_month=10)
    assert schedule.occurrences(count=2) == [date(2026, 2, 10), date(2026, 3, 10)]


def test_rolling_with_calendar():
    cal = BusinessCalendar(holidays=["2026-06-15"])
    schedule = Schedule("monthly", date(2026, 5, 15), calendar=cal)
    # 2026-06-15 is a holiday, 2026-08-15 a Saturday
    assert schedule.occurrences(until="2026-08-31") == [
        date(2026, 5, 15), date(2026, 6, 16), date(2026, 7, 15), date(2026, 8, 17),
    ]


def test_between_and_next_after():
    schedule = Schedule("weekly", date(2026, 3, 2))
    assert schedule.between("2026-03-10", "2026-03-24") == [date(2026, 3, 16), date(2026, 3, 23)]
    assert schedule.next_after(date(2026, 3, 9)) == date(2026, 3, 16)


def test_occurrences_needs_a_limit():
    with pytest.raises(ValueError):
        Schedule("daily", "2026-03-01").occurrences()


def test_validation():
    with pytest.raises(ValueError):
        Schedule("yearly", "2026-03-01")
    with pytest.raises(ValueError):
        Schedule("weekly", "2026-03-01", interval=0)
    with pytest.raises(ValueError):
        Schedule("monthly", "2026-03-01", day_of_month=32)


def test_parse_schedule():
    start = date(2026, 3, 2)
    assert parse_schedule("every 2 weeks on mon, thu", start) == Schedule("weekly", start, 2, weekdays=(0, 3))
    assert parse_schedule("Every Weekday", start).weekdays == (0, 1, 2, 3, 4)
    assert parse_schedule("daily", start) == Schedule("daily", start)
    assert parse_schedule("every month on the 15th", start).day_of_month == 15
    with pytest.raises(ValueError):
        parse_schedule("every fortnight", start)
