from decimal import Decimal

import pytest

from inventory import AmountError, format_money, format_qty, round_money, to_decimal


def test_to_decimal_accepts_common_types():
    assert to_decimal(3) == Decimal(3)
    assert to_decimal(0.1) == Decimal("0.1")
    assert to_decimal(" 1_250.5 ") == Decimal("1250.5")
    assert to_decimal("1,250.50") == Decimal("1250.50")


def test_to_decimal_rejects_garbage():
    for value in ["", "abc", "nan", True, None]:
        with pytest.raises(AmountError):
            to_decimal(value)


def test_round_money_to_cents():
    assert round_money("1.234") == Decimal("1.23")
    assert round_money("1.236") == Decimal("1.24")
    assert round_money(2) == Decimal("2.00")


def test_format_money_uses_thousands_separator():
    assert format_money("1234.5") == "1,234.50"
    assert format_money(0) == "0.00"
    assert format_money("99.999", "EUR") == "100.00 EUR"


def test_format_qty():
    assert format_qty(Decimal("10.00")) == "10"
    assert format_qty("2.50") == "2.5"
    assert format_qty(7) == "7"
