"""A forgiving reader and writer for comma-separated text.

Fields may be quoted with double quotes; quoted fields can contain the
delimiter, line breaks and quote characters (written twice: ``""``).
"""

from __future__ import annotations

from typing import Iterable, Sequence

from .normalize import normalize_newlines


class CsvError(ValueError):
    """Raised for malformed input."""


def parse_rows(text: str, delimiter: str = ",", quote: str = '"') -> list[list[str]]:
    """Split *text* into rows of fields.  Blank lines are skipped."""
    if len(delimiter) != 1 or len(quote) != 1:
        raise ValueError("delimiter and quote must be single characters")
    text = normalize_newlines(text)
    rows: list[list[str]] = []
    row: list[str] = []
    field: list[str] = []
    in_quotes = False
    i = 0
    while i < len(text):
        ch = text[i]
        if in_quotes:
            if ch == quote:
                in_quotes = False
            else:
                field.append(ch)
        elif ch == quote:
            in_quotes = True
        elif ch == delimiter:
            row.append("".join(field))
            field = []
        elif ch == "\n":
            row.append("".join(field))
            field = []
            rows.append(row)
            row = []
        else:
            field.append(ch)
        i += 1
    if in_quotes:
        raise CsvError("unterminated quoted field")
    if field or row:
        row.append("".join(field))
        rows.append(row)
    return [r for r in rows if r != [""]]


def parse_records(text: str, delimiter: str = ",", strict: bool = True) -> list[dict[str, str]]:
    """Rows as dicts keyed by the header row.

    Rows of the wrong length raise :class:`CsvError` when ``strict``, else
    they are padded with ``""`` or cut.
    """
    rows = parse_rows(text, delimiter)
    if not rows:
        return []
    header = [name.strip() for name in rows[0]]
    if len(set(header)) != len(header):
        raise CsvError("duplicate column names in header")
    records = []
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            if strict:
                raise CsvError(f"row {number}: expected {len(header)} fields, got {len(row)}")
            row = (row + [""] * len(header))[: len(header)]
        records.append(dict(zip(header, row)))
    return records


def _quote_field(value: str, delimiter: str, quote: str) -> str:
    if any(ch in value for ch in (delimiter, quote, "\n", "\r")) or value != value.strip():
        return quote + value.replace(quote, quote * 2) + quote
    return value


def format_rows(rows: Iterable[Sequence[object]], delimiter: str = ",", quote: str = '"') -> str:
    """Write rows so that :func:`parse_rows` reads them back."""
    lines = []
    for row in rows:
        fields = ["" if value is None else str(value) for value in row]
        lines.append(delimiter.join(_quote_field(f, delimiter, quote) for f in fields))
    return "\n".join(lines) + ("\n" if lines else "")
