import pytest

from textkit import CsvError, format_rows, parse_records, parse_rows


def test_parse_simple_rows():
    assert parse_rows("a,b,c\n1,2,3\n") == [["a", "b", "c"], ["1", "2", "3"]]


def test_parse_keeps_empty_fields():
    assert parse_rows("a,,c\n,\nx,y,") == [["a", "", "c"], ["", ""], ["x", "y", ""]]


def test_parse_quoted_fields():
    text = 'name,note\n"Smith, J.","line one\nline two"\r\n'
    assert parse_rows(text) == [["name", "note"], ["Smith, J.", "line one\nline two"]]


def test_parse_skips_blank_lines_and_other_delimiters():
    assert parse_rows("a;b\n\n1;2\n", delimiter=";") == [["a", "b"], ["1", "2"]]


def test_unterminated_quote():
    with pytest.raises(CsvError):
        parse_rows('a,"b\n')


def test_parse_records():
    text = "id, name\n1,Ann\n2,Bob\n"
    assert parse_records(text) == [{"id": "1", "name": "Ann"}, {"id": "2", "name": "Bob"}]


def test_parse_records_length_mismatch():
    with pytest.raises(CsvError, match="row 3"):
        parse_records("a,b\n1,2\n3\n")
    assert parse_records("a,b\n1\n1,2,3\n", strict=False) == [
        {"a": "1", "b": ""},
        {"a": "1", "b": "2"},
    ]


def test_format_rows_quotes_when_needed():
    rows = [["a", "b,c", " d", None], [1, 2.5, "x\ny", ""]]
    assert format_rows(rows) == 'a,"b,c"," d",\n1,2.5,"x\ny",\n'


def test_format_parse_roundtrip():
    rows = [["name", "city"], ["Smith, J.", "New\nYork"], ["", "Paris"]]
    assert parse_rows(format_rows(rows)) == rows
