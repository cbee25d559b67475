"""The stock ledger: an append-only list of moves with balance queries."""

from __future__ import annotations

from decimal import Decimal
from typing import Iterable, Optional

from .items import Catalog, Item, UnknownSku, normalize_sku
from .moves import Move, as_date


class InsufficientStock(Exception):
    """Raised when an issue or adjustment would make stock negative."""

    def __init__(self, sku: str, requested: Decimal, available: Decimal) -> None:
        super().__init__(
            f"cannot take {requested} of {sku}: only {available} on hand"
        )
        self.sku = sku
        self.requested = requested
        self.available = available


class Ledger:
    """Records stock moves and answers "how many do we have?".

    When a catalog is given, only SKUs from the catalog can be recorded.
    Unless ``allow_negative`` is set, moves that would take the balance of
    a SKU below zero are refused with :class:`InsufficientStock`.
    """

    def __init__(self, catalog: Optional[Catalog] = None, allow_negative: bool = False) -> None:
        self.catalog = catalog
        self.allow_negative = allow_negative
        self._moves: list[Move] = []

    def record(self, move: Move) -> Move:
        if self.catalog is not None and move.sku not in self.catalog:
            raise UnknownSku(move.sku)
        if move.signed_qty < 0 and not self.allow_negative:
            available = self.on_hand(move.sku)
            if available + move.signed_qty < 0:
                raise InsufficientStock(move.sku, -move.signed_qty, available)
        self._moves.append(move)
        return move

    def load(self, moves: Iterable[Move]) -> int:
        """Record several moves; returns how many were recorded."""
        count = 0
        for move in moves:
            self.record(move)
            count += 1
        return count

    def receive(self, sku, qty, unit_cost, day, ref: str = "") -> Move:
        return self.record(Move(day, sku, "in", qty, unit_cost, ref))

    def issue(self, sku, qty, day, ref: str = "") -> Move:
        return self.record(Move(day, sku, "out", qty, None, ref))

    def adjust(self, sku, qty, day, ref: str = "", unit_cost=None) -> Move:
        return self.record(Move(day, sku, "adjust", qty, unit_cost, ref))

    def moves(self, sku=None) -> list[Move]:
        """Moves in date order; moves of the same day keep recording order."""
        if sku is None:
            selected = list(self._moves)
        else:
            key = normalize_sku(sku)
            selected = [move for move in self._moves if move.sku == key]
        return sorted(selected, key=lambda move: move.day)

    def skus(self) -> list[str]:
        return sorted({move.sku for move in self._moves})

    def on_hand(self, sku, as_of=None) -> Decimal:
        """Quantity of *sku* in stock, or at the end of the day *as_of*."""
        key = normalize_sku(sku)
        limit = None if as_of is None else as_date(as_of)
        total = Decimal(0)
        for move in self._moves:
            if move.sku != key:
                continue
            if limit is not None and move.day >= limit:
                continue
            total += move.signed_qty
        return total

    def below_reorder(self) -> list[Item]:
        """Catalog items whose stock is at or below their reorder level."""
        if self.catalog is None:
            raise ValueError("below_reorder() needs a ledger with a catalog")
        return [
            item
            for item in self.catalog
            if item.reorder_level > 0 and self.on_hand(item.sku) <= item.reorder_level
        ]
