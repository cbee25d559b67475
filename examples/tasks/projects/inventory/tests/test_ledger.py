from datetime import date
from decimal import Decimal

import pytest

from inventory import Catalog, InsufficientStock, Item, Ledger, UnknownSku


def make_ledger():
    catalog = Catalog([
        Item("BOLT-M6", "Hex bolt M6", reorder_level=50),
        Item("NUT-M6", "Nut M6", reorder_level=20),
        Item("WASHER", "Washer"),
    ])
    ledger = Ledger(catalog)
    ledger.receive("BOLT-M6", 100, "0.12", "2026-01-05")
    ledger.issue("BOLT-M6", 30, "2026-01-07")
    ledger.receive("NUT-M6", 40, "0.05", "2026-01-06")
    return ledger


def test_on_hand():
    ledger = make_ledger()
    assert ledger.on_hand("BOLT-M6") == Decimal(70)
    assert ledger.on_hand("bolt-m6") == Decimal(70)
    assert ledger.on_hand("WASHER") == Decimal(0)


def test_on_hand_as_of_between_moves():
    ledger = make_ledger()
    assert ledger.on_hand("BOLT-M6", as_of="2026-01-06") == Decimal(100)
    assert ledger.on_hand("BOLT-M6", as_of=date(2026, 1, 4)) == Decimal(0)
    assert ledger.on_hand("BOLT-M6", as_of="2026-02-01") == Decimal(70)


def test_issue_more_than_on_hand_is_refused():
    ledger = make_ledger()
    with pytest.raises(InsufficientStock) as info:
        ledger.issue("NUT-M6", 41, "2026-01-08")
    assert info.value.available == Decimal(40)
    assert ledger.on_hand("NUT-M6") == Decimal(40)


def test_allow_negative():
    ledger = Ledger(allow_negative=True)
    ledger.issue("A1", 5, "2026-01-01")
    assert ledger.on_hand("A1") == Decimal(-5)


def test_unknown_sku_is_refused_with_catalog():
    ledger = make_ledger()
    with pytest.raises(UnknownSku):
        ledger.receive("SCREW", 1, 1, "2026-01-08")


def test_adjustments_change_stock():
    ledger = make_ledger()
    ledger.adjust("NUT-M6", -4, "2026-01-09", ref="count")
    ledger.adjust("WASHER", 12, "2026-01-09", ref="found", unit_cost="0.02")
    assert ledger.on_hand("NUT-M6") == Decimal(36)
    assert ledger.on_hand("WASHER") == Decimal(12)


def test_moves_are_in_date_order():
    ledger = make_ledger()
    days = [move.day for move in ledger.moves()]
    assert days == sorted(days)
    assert [move.kind for move in ledger.moves("bolt-m6")] == ["in", "out"]
    assert ledger.skus() == ["BOLT-M6", "NUT-M6"]


def test_below_reorder():
    ledger = make_ledger()
    ledger.issue("NUT-M6", 20, "2026-01-10")
    assert [item.sku for item in ledger.below_reorder()] == ["NUT-M6"]
