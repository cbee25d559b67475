"""Plain-text stock reports."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from .ledger import Ledger
from .money import format_money, format_qty, round_money
from .valuation import METHODS, ValuationError, inventory_value

_HEADERS = ("SKU", "Item", "Qty", "Unit", "Value")
_RIGHT_ALIGNED = {2, 4}


@dataclass(frozen=True)
class StockRow:
    sku: str
    name: str
    qty: Decimal
    unit: str
    value: Decimal


def stock_rows(ledger: Ledger, method: str = "fifo") -> list[StockRow]:
    """One row per SKU that has moves, sorted by SKU."""
    if method not in METHODS:
        raise ValuationError(f"unknown valuation method: {method!r}")
    rows = []
    for sku in ledger.skus():
        qty = ledger.on_hand(sku)
        if ledger.catalog is not None and sku in ledger.catalog:
            item = ledger.catalog.get(sku)
            name, unit = item.name, item.unit
        else:
            name, unit = "", "pcs"
        if qty:
            value = round_money(inventory_value(ledger.moves(sku), method))
        else:
            value = Decimal("0.00")
        rows.append(StockRow(sku, name, qty, unit, value))
    return rows


def stock_report(ledger: Ledger, method: str = "fifo", currency: str = "") -> str:
    """A fixed-width table of :func:`stock_rows` with a total line."""
    rows = stock_rows(ledger, method)
    table = [_HEADERS]
    for row in rows:
        table.append((row.sku, row.name, format_qty(row.qty), row.unit, format_money(row.value)))
    total = sum((row.value for row in rows), Decimal(0))
    footer = ("TOTAL", "", "", "", format_money(total, currency))
    widths = [max(len(line[col]) for line in table + [footer]) for col in range(len(_HEADERS))]

    def render(cells) -> str:
        parts = [
            cell.rjust(width) if col in _RIGHT_ALIGNED else cell.ljust(width)
            for col, (cell, width) in enumerate(zip(cells, widths))
        ]
        return "  ".join(parts).rstrip()

    rule = "-" * len(render(["-" * width for width in widths]))
    lines = [render(table[0]), rule]
    lines.extend(render(line) for line in table[1:])
    lines.extend([rule, render(footer)])
    return "\n".join(lines) + "\n"
