"""Inventory valuation: FIFO layers and weighted average cost.

Both methods walk through the moves of one SKU in date order.  Incoming
stock adds units at its unit cost, outgoing stock takes units away: FIFO
takes them from the oldest layer first, the average method at the current
average cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Iterable, Iterator, Optional

from .moves import Move

METHODS = ("fifo", "average")


class ValuationError(ValueError):
    """Raised when moves cannot be valued (e.g. more issued than received)."""


@dataclass
class Layer:
    """Units received together at the same unit cost."""

    qty: Decimal
    unit_cost: Decimal

    @property
    def value(self) -> Decimal:
        return self.qty * self.unit_cost


def _flows(moves: Iterable[Move]) -> Iterator[tuple[str, Decimal, Optional[Decimal]]]:
    """Yield ``(direction, qty, unit_cost)`` for *moves* in date order.

    *direction* is ``"in"`` or ``"out"`` and *qty* is always positive.
    """
    for move in sorted(moves, key=lambda move: move.day):
        if move.kind == "in":
            yield "in", move.qty, move.unit_cost
        elif move.kind == "out":
            yield "out", move.qty, None


def _run_fifo(moves: Iterable[Move]) -> tuple[list[Layer], Decimal]:
    layers: list[Layer] = []
    consumed = Decimal(0)
    for direction, qty, cost in _flows(moves):
        if direction == "in":
            layers.append(Layer(qty, cost))
            continue
        remaining = qty
        while remaining > 0:
            if not layers:
                raise ValuationError("more units taken out than received")
            oldest = layers[0]
            if oldest.qty > remaining:
                oldest.qty -= remaining
                consumed += remaining * oldest.unit_cost
                remaining = Decimal(0)
            else:
                remaining -= oldest.qty
                consumed += oldest.value
                layers.pop(0)
    return layers, consumed


def fifo_layers(moves: Iterable[Move]) -> list[Layer]:
    """The cost layers still in stock, oldest first."""
    return _run_fifo(moves)[0]


def cost_of_goods_sold(moves: Iterable[Move]) -> Decimal:
    """FIFO cost of all units taken out of stock."""
    return _run_fifo(moves)[1]


def quantity(moves: Iterable[Move]) -> Decimal:
    """Units in stock according to the valuation flows."""
    total = Decimal(0)
    for direction, qty, _cost in _flows(moves):
        total += qty if direction == "in" else -qty
    return total


def average_cost(moves: Iterable[Move]) -> Decimal:
    """Weighted average unit cost of the units in stock."""
    received_qty = Decimal(0)
    received_value = Decimal(0)
    for direction, qty, cost in _flows(moves):
        if direction == "in":
            received_qty += qty
            received_value += qty * cost
    if not received_qty:
        return Decimal(0)
    return received_value / received_qty


def inventory_value(moves: Iterable[Move], method: str = "fifo") -> Decimal:
    """Value of the stock left after *moves*, unrounded."""
    moves = list(moves)
    if method == "fifo":
        return sum((layer.value for layer in fifo_layers(moves)), Decimal(0))
    if method == "average":
        return quantity(moves) * average_cost(moves)
    raise ValuationError(f"unknown valuation method: {method!r}")
