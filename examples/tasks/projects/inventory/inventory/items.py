"""The catalog of stock items."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SKU_RE = re.compile(r"^[A-Z0-9][A-Z0-9._-]*$")


class UnknownSku(KeyError):
    """Raised when a SKU is not in the catalog."""

    def __str__(self) -> str:
        return f"unknown SKU: {self.args[0]}"


class DuplicateSku(ValueError):
    """Raised when an item is added twice."""


def normalize_sku(sku) -> str:
    """Return the canonical form of *sku*: trimmed and upper case."""
    text = str(sku).strip().upper()
    if not _SKU_RE.match(text):
        raise ValueError(f"invalid SKU: {sku!r}")
    return text


@dataclass(frozen=True)
class Item:
    sku: str
    name: str
    unit: str = "pcs"
    reorder_level: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "sku", normalize_sku(self.sku))
        if not self.name.strip():
            raise ValueError("item name must not be empty")
        if self.reorder_level < 0:
            raise ValueError("reorder_level must not be negative")


class Catalog:
    """A set of items indexed by SKU."""

    def __init__(self, items=()) -> None:
        self._items: dict[str, Item] = {}
        for item in items:
            self.add(item)

    def add(self, item: Item) -> Item:
        if item.sku in self._items:
            raise DuplicateSku(f"duplicate SKU: {item.sku}")
        self._items[item.sku] = item
        return item

    def get(self, sku) -> Item:
        key = normalize_sku(sku)
        try:
            return self._items[key]
        except KeyError:
            raise UnknownSku(key) from None

    def search(self, text: str) -> list[Item]:
        """Items whose SKU or name contains *text* (case-insensitive)."""
        needle = text.strip().lower()
        return [
            item
            for item in self
            if needle in item.sku.lower() or needle in item.name.lower()
        ]

    def __contains__(self, sku) -> bool:
        try:
            return normalize_sku(sku) in self._items
        except ValueError:
            return False

    def __iter__(self):
        return iter(sorted(self._items.values(), key=lambda item: item.sku))

    def __len__(self) -> int:
        return len(self._items)
