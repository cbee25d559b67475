import pytest

from inventory import Catalog, DuplicateSku, Item, UnknownSku, normalize_sku


def test_normalize_sku():
    assert normalize_sku("  bolt-m6 ") == "BOLT-M6"
    with pytest.raises(ValueError):
        normalize_sku("bad sku")


def test_item_sku_is_normalized():
    assert Item("nut-m6", "Nut M6").sku == "NUT-M6"


def test_item_validation():
    with pytest.raises(ValueError):
        Item("X1", "   ")
    with pytest.raises(ValueError):
        Item("X1", "Thing", reorder_level=-1)


def test_catalog_lookup_is_case_insensitive():
    catalog = Catalog([Item("BOLT-M6", "Hex bolt M6")])
    assert catalog.get("bolt-m6").name == "Hex bolt M6"
    assert "Bolt-M6" in catalog
    assert "bad sku" not in catalog


def test_catalog_rejects_duplicates_and_unknown():
    catalog = Catalog([Item("A1", "Alpha")])
    with pytest.raises(DuplicateSku):
        catalog.add(Item("a1", "Again"))
    with pytest.raises(UnknownSku):
        catalog.get("B2")


def test_catalog_iterates_sorted_and_searches():
    catalog = Catalog([Item("B2", "Washer"), Item("A1", "Bolt"), Item("C3", "Bolt cutter")])
    assert [item.sku for item in catalog] == ["A1", "B2", "C3"]
    assert [item.sku for item in catalog.search("bolt")] == ["A1", "C3"]
    assert len(catalog) == 3
