import pytest

from textkit import slugify, unique_slug


def test_slugify_basic():
    assert slugify("Hello, World!") == "hello-world"
    assert slugify("Crème Brûlée: a recipe!") == "creme-brulee-a-recipe"


def test_slugify_separator_and_case():
    assert slugify("Hello World", sep="_") == "hello_world"
    assert slugify("Hello World", lowercase=False) == "Hello-World"


def test_slugify_stopwords():
    assert slugify("The Lord of the Rings", stopwords=["the", "of"]) == "lord-rings"


def test_slugify_max_length_cuts_inside_word():
    assert slugify("Hello World", max_length=8) == "hello-wo"
    assert slugify("Hello World", max_length=50) == "hello-world"


def test_slugify_max_length_must_be_positive():
    with pytest.raises(ValueError):
        slugify("x", max_length=0)


def test_unique_slug():
    existing = {"hello-world", "hello-world-2"}
    assert unique_slug("Hello World", existing) == "hello-world-3"
    assert unique_slug("Other", existing) == "other"
    assert unique_slug("Hello World", {"hello_world"}, sep="_") == "hello_world_2"
