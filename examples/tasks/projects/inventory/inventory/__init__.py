"""inventory - a small stock ledger with FIFO and average-cost valuation."""

from .items import Catalog, DuplicateSku, Item, UnknownSku, normalize_sku
from .ledger import InsufficientStock, Ledger
from .money import AmountError, format_money, format_qty, round_money, to_decimal
from .moves import Move, MoveParseError, format_moves, parse_moves
from .report import StockRow, stock_report, stock_rows
from .valuation import (
    Layer,
    ValuationError,
    average_cost,
    cost_of_goods_sold,
    fifo_layers,
    inventory_value,
)

__version__ = "1.0"

__all__ = [
    "AmountError",
    "Catalog",
    "DuplicateSku",
    "InsufficientStock",
    "Item",
    "Layer",
    "Ledger",
    "Move",
    "MoveParseError",
    "StockRow",
    "UnknownSku",
    "ValuationError",
    "average_cost",
    "cost_of_goods_sold",
    "fifo_layers",
    "format_money",
    "format_moves",
    "format_qty",
    "inventory_value",
    "normalize_sku",
    "parse_moves",
    "round_money",
    "stock_report",
    "stock_rows",
    "to_decimal",
]
