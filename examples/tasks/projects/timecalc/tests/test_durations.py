from datetime import timedelta

import pytest

from timecalc import DurationError, format_duration, parse_duration


def test_parse_compact_and_long_forms():
    assert parse_duration("1h30m") == timedelta(hours=1, minutes=30)
    assert parse_duration("2 days, 4 hours") == timedelta(days=2, hours=4)
    assert parse_duration("1w 2d") == timedelta(days=9)
    assert parse_duration("90s") == timedelta(seconds=90)


def test_parse_fractions_and_sign():
    assert parse_duration("1.5h") == timedelta(minutes=90)
    assert parse_duration("-15m") == timedelta(minutes=-15)
    assert parse_duration("+2h") == timedelta(hours=2)


def test_parse_clock_form():
    assert parse_duration("1:30") == timedelta(hours=1, minutes=30)
    assert parse_duration("0:00:45") == timedelta(seconds=45)
    assert parse_duration("-0:10") == timedelta(minutes=-10)


@pytest.mark.parametrize("text", ["", "1x", "h", "1h 1h", "1h30", "abc 1h", "-"])
def test_parse_rejects(text):
    with pytest.raises(DurationError):
        parse_duration(text)


def test_format_duration():
    assert format_duration(timedelta(hours=1, minutes=30)) == "1h 30m"
    assert format_duration(timedelta(hours=26, seconds=5)) == "1d 2h 5s"
    assert format_duration(timedelta(0)) == "0s"
    assert format_duration(timedelta(minutes=2), sep="") == "2m"


def test_format_drops_fractions():
    assert format_duration(timedelta(seconds=61.75)) == "1m 1s"


def test_roundtrip():
    for text in ["1d 2h 3m 4s", "45m", "3d"]:
        assert format_duration(parse_duration(text)) == text
