"""Decimal helpers for quantities and money amounts.

Every amount in the library is a :class:`decimal.Decimal`.  Floats are
accepted on input but converted through their shortest ``repr`` so that
``0.1`` becomes ``Decimal("0.1")`` and not its binary approximation.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

CENT = Decimal("0.01")


class AmountError(ValueError):
    """Raised when a value cannot be interpreted as a number."""


def to_decimal(value) -> Decimal:
    """Convert *value* (Decimal, int, float or str) to a Decimal.

    Strings may contain ``_`` or ``,`` as thousands separators.
    """
    if isinstance(value, Decimal):
        return value
    if isinstance(value, bool):
        raise AmountError(f"not an amount: {value!r}")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, str):
        text = value.strip().replace("_", "").replace(",", "")
        if not text:
            raise AmountError("empty amount")
        try:
            result = Decimal(text)
        except InvalidOperation:
            raise AmountError(f"not an amount: {value!r}") from None
        if not result.is_finite():
            raise AmountError(f"not a finite amount: {value!r}")
        return result
    raise AmountError(f"unsupported amount type: {type(value).__name__}")


def round_money(amount) -> Decimal:
    """Round *amount* to whole cents (commercial rounding)."""
    return round(to_decimal(amount), 2)


def format_money(amount, currency: str = "") -> str:
    """Format *amount* with two decimals and thousands separators."""
    text = f"{round_money(amount):,.2f}"
    return f"{text} {currency}" if currency else text


def format_qty(qty) -> str:
    """Format a quantity, without decimals when it is a whole number."""
    value = to_decimal(qty)
    if value == value.to_integral_value():
        return str(value.quantize(Decimal(1)))
    return str(value.normalize())
