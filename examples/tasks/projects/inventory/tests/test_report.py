from decimal import Decimal

from inventory import Catalog, Item, Ledger, stock_report, stock_rows


def make_ledger():
    catalog = Catalog([Item("BOLT-M6", "Hex bolt M6"), Item("NUT-M6", "Nut M6"), Item("GASKET", "Gasket", unit="box")])
    ledger = Ledger(catalog)
    ledger.receive("BOLT-M6", 100, "0.12", "2026-01-05")
    ledger.receive("BOLT-M6", 100, "0.15", "2026-01-06")
    ledger.issue("BOLT-M6", 120, "2026-01-07")
    ledger.receive("NUT-M6", 1000, "0.05", "2026-01-06")
    ledger.receive("GASKET", 3, "1.10", "2026-01-06")
    return ledger


def test_stock_rows_fifo():
    rows = stock_rows(make_ledger())
    assert [(r.sku, r.name, r.qty, r.value) for r in rows] == [
        ("BOLT-M6", "Hex bolt M6", Decimal(80), Decimal("12.00")),
        ("GASKET", "Gasket", Decimal(3), Decimal("3.30")),
        ("NUT-M6", "Nut M6", Decimal(1000), Decimal("50.00")),
    ]


def test_stock_rows_average():
    rows = stock_rows(make_ledger(), method="average")
    assert rows[0].value == Decimal("10.80")


def test_stock_rows_zero_stock_has_zero_value():
    ledger = Ledger()
    ledger.receive("A1", 2, "5.00", "2026-01-01")
    ledger.issue("A1", 2, "2026-01-02")
    assert stock_rows(ledger)[0].value == Decimal("0.00")


def test_stock_report_layout():
    report = stock_report(make_ledger(), currency="EUR")
    assert report == (
        "SKU      Item          Qty  Unit      Value\n"
        "-------------------------------------------\n"
        "BOLT-M6  Hex bolt M6    80  pcs       12.00\n"
        "GASKET   Gasket          3  box        3.30\n"
        "NUT-M6   Nut M6       1000  pcs       50.00\n"
        "-------------------------------------------\n"
        "TOTAL                             65.30 EUR\n"
    )
