import pytest

from textkit import fill, shorten, wrap

PANGRAM = "the quick brown fox jumps over the lazy dog"


def test_wrap_greedy():
    assert wrap(PANGRAM, 11) == ["the quick", "brown fox", "jumps over", "the lazy", "dog"]


def test_wrap_collapses_whitespace():
    assert wrap("  one\n two\t\tthree  ", 40) == ["one two three"]


def test_wrap_indent():
    lines = wrap(PANGRAM, 15, indent="* ", subsequent_indent="  ")
    assert lines == ["* the quick", "  brown fox", "  jumps over", "  the lazy dog"]


def test_wrap_breaks_long_words():
    assert wrap("abcdefghij", 4) == ["abcd", "efgh", "ij"]
    assert wrap("abcdefghij xy", 4, break_long_words=False) == ["abcdefghij", "xy"]


def test_wrap_rejects_tiny_width():
    with pytest.raises(ValueError):
        wrap("abc", 2, indent="  ")


def test_fill_keeps_paragraphs():
    text = "first paragraph here\n\nsecond one"
    assert fill(text, 12) == "first\nparagraph\nhere\n\nsecond one"


def test_shorten():
    assert shorten("Hello   world", 20) == "Hello world"
    assert shorten(PANGRAM, 20) == "the quick [...]"
    assert shorten(PANGRAM, 20, placeholder="...") == "the quick brown..."
