"""Stock moves and their CSV representation.

A move file holds one move per line::

    date,sku,kind,qty,unit_cost,ref
    2026-01-05,BOLT-M6,in,100,0.12,PO-1001
    2026-01-07,BOLT-M6,out,30,,SO-2001

``unit_cost`` is required for ``in`` moves and optional for ``adjust``
moves; ``ref`` is free text.  The header line is optional, blank lines and
lines starting with ``#`` are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Iterable, Optional

from .items import normalize_sku
from .money import to_decimal

KINDS = ("in", "out", "adjust")
HEADER = ("date", "sku", "kind", "qty", "unit_cost", "ref")


class MoveParseError(ValueError):
    """Raised for malformed lines in a move file."""


def as_date(value) -> date:
    """Accept a :class:`datetime.date` or an ISO ``YYYY-MM-DD`` string."""
    if isinstance(value, date):
        return value
    try:
        return date.fromisoformat(str(value).strip())
    except ValueError:
        raise ValueError(f"invalid date: {value!r}") from None


@dataclass(frozen=True)
class Move:
    """One stock movement of a single SKU.

    ``in`` and ``out`` moves have a positive quantity; ``adjust`` moves
    (stock-count corrections) are signed.
    """

    day: date
    sku: str
    kind: str
    qty: Decimal
    unit_cost: Optional[Decimal] = None
    ref: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "day", as_date(self.day))
        object.__setattr__(self, "sku", normalize_sku(self.sku))
        if self.kind not in KINDS:
            raise ValueError(f"unknown move kind: {self.kind!r}")
        qty = to_decimal(self.qty)
        if self.kind == "adjust":
            if qty == 0:
                raise ValueError("adjustment quantity must not be zero")
        elif qty <= 0:
            raise ValueError(f"{self.kind} quantity must be positive")
        object.__setattr__(self, "qty", qty)
        if self.unit_cost is not None:
            cost = to_decimal(self.unit_cost)
            if cost < 0:
                raise ValueError("unit_cost must not be negative")
            object.__setattr__(self, "unit_cost", cost)
        elif self.kind == "in":
            raise ValueError("incoming moves need a unit_cost")

    @property
    def signed_qty(self) -> Decimal:
        """The quantity with its effect on stock (negative for issues)."""
        if self.kind == "out":
            return -self.qty
        return self.qty


def parse_moves(text: str) -> list[Move]:
    """Parse the CSV move format described in the module docstring."""
    moves: list[Move] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = [field.strip() for field in line.split(",")]
        if not moves and fields[0].lower() == HEADER[0]:
            continue
        if not 4 <= len(fields) <= len(HEADER):
            raise MoveParseError(
                f"line {lineno}: expected 4 to {len(HEADER)} fields, got {len(fields)}"
            )
        fields += [""] * (len(HEADER) - len(fields))
        day, sku, kind, qty, cost, ref = fields
        try:
            moves.append(Move(day, sku, kind.lower(), qty, cost or None, ref))
        except ValueError as exc:
            raise MoveParseError(f"line {lineno}: {exc}") from None
    return moves


def format_moves(moves: Iterable[Move], header: bool = True) -> str:
    """Write *moves* in the format read by :func:`parse_moves`."""
    lines = [",".join(HEADER)] if header else []
    for move in moves:
        cost = "" if move.unit_cost is None else str(move.unit_cost)
        fields = [move.day.isoformat(), move.sku, move.kind, str(move.qty), cost, move.ref]
        lines.append(",".join(fields))
    return "\n".join(lines) + "\n"
