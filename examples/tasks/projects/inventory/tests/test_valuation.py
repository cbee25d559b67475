from decimal import Decimal

import pytest

from inventory import (
    Move,
    ValuationError,
    average_cost,
    cost_of_goods_sold,
    fifo_layers,
    inventory_value,
)


def moves(*rows):
    return [Move(*row) for row in rows]


def test_fifo_partial_sale_within_first_layer():
    ms = moves(
        ("2026-02-01", "A1", "in", 10, "2.00"),
        ("2026-02-02", "A1", "in", 10, "3.00"),
        ("2026-02-03", "A1", "out", 4),
    )
    layers = fifo_layers(ms)
    assert [(layer.qty, layer.unit_cost) for layer in layers] == [
        (Decimal(6), Decimal("2.00")),
        (Decimal(10), Decimal("3.00")),
    ]
    assert inventory_value(ms) == Decimal("42.00")
    assert cost_of_goods_sold(ms) == Decimal("8.00")


def test_fifo_sale_spanning_layers():
    ms = moves(
        ("2026-02-01", "A1", "in", 10, "2.00"),
        ("2026-02-02", "A1", "in", 10, "3.00"),
        ("2026-02-03", "A1", "out", 15),
    )
    assert inventory_value(ms, "fifo") == Decimal("15.00")
    assert cost_of_goods_sold(ms) == Decimal("35.00")


def test_fifo_uses_date_order_not_list_order():
    ms = moves(
        ("2026-02-02", "A1", "in", 10, "3.00"),
        ("2026-02-01", "A1", "in", 10, "2.00"),
        ("2026-02-03", "A1", "out", 10),
    )
    assert inventory_value(ms) == Decimal("30.00")


def test_fifo_overdraw_raises():
    ms = moves(("2026-02-01", "A1", "in", 1, 1), ("2026-02-02", "A1", "out", 2))
    with pytest.raises(ValuationError):
        fifo_layers(ms)


def test_average_cost_of_receipts():
    ms = moves(
        ("2026-02-01", "A1", "in", 10, "10.00"),
        ("2026-02-02", "A1", "in", 10, "13.00"),
    )
    assert average_cost(ms) == Decimal("11.5")
    assert inventory_value(ms, "average") == Decimal("230.00")


def test_average_cost_unchanged_by_issue():
    ms = moves(
        ("2026-02-01", "A1", "in", 10, "10.00"),
        ("2026-02-02", "A1", "in", 10, "13.00"),
        ("2026-02-03", "A1", "out", 4),
    )
    assert average_cost(ms) == Decimal("11.5")
    assert inventory_value(ms, "average") == Decimal("184.00")


def test_empty_and_unknown_method():
    assert average_cost([]) == Decimal(0)
    assert inventory_value([]) == Decimal(0)
    with pytest.raises(ValuationError):
        inventory_value([], "lifo")
