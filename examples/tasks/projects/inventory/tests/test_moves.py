from datetime import date
from decimal import Decimal

import pytest

from inventory import Move, MoveParseError, format_moves, parse_moves

SAMPLE = """\
date,sku,kind,qty,unit_cost,ref
# opening stock
2026-01-05,bolt-m6,in,100,0.12,PO-1001

2026-01-07,BOLT-M6,out,30,,SO-2001
2026-01-09,BOLT-M6,adjust,-2
"""


def test_move_validation():
    with pytest.raises(ValueError):
        Move("2026-01-05", "A1", "in", 5)  # no unit cost
    with pytest.raises(ValueError):
        Move("2026-01-05", "A1", "out", -5)
    with pytest.raises(ValueError):
        Move("2026-01-05", "A1", "adjust", 0)
    with pytest.raises(ValueError):
        Move("2026-01-05", "A1", "lost", 1)


def test_signed_qty():
    assert Move("2026-01-05", "A1", "in", 5, 1).signed_qty == 5
    assert Move("2026-01-05", "A1", "out", 5).signed_qty == -5
    assert Move("2026-01-05", "A1", "adjust", -3).signed_qty == -3


def test_parse_moves_sample():
    moves = parse_moves(SAMPLE)
    assert [m.kind for m in moves] == ["in", "out", "adjust"]
    first = moves[0]
    assert first.day == date(2026, 1, 5)
    assert first.sku == "BOLT-M6"
    assert first.qty == Decimal(100)
    assert first.unit_cost == Decimal("0.12")
    assert first.ref == "PO-1001"
    assert moves[1].unit_cost is None
    assert moves[2].qty == Decimal(-2)


def test_parse_moves_reports_line_numbers():
    with pytest.raises(MoveParseError, match="line 2"):
        parse_moves("2026-01-05,A1,in,1,1\n2026-01-06,A1,in\n")
    with pytest.raises(MoveParseError, match="line 1"):
        parse_moves("2026-13-05,A1,in,1,1\n")


def test_format_then_parse_roundtrip():
    moves = parse_moves(SAMPLE)
    text = format_moves(moves)
    assert text.splitlines()[0] == "date,sku,kind,qty,unit_cost,ref"
    assert parse_moves(text) == moves
