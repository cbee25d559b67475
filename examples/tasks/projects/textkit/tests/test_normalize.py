from textkit import collapse_whitespace, normalize_newlines, strip_accents, to_ascii


def test_normalize_newlines():
    assert normalize_newlines("a\r\nb\rc\nd") == "a\nb\nc\nd"


def test_strip_accents():
    assert strip_accents("Crème brûlée") == "Creme brulee"


def test_to_ascii_transliterates():
    assert to_ascii("Straße in Łódź") == "Strasse in Lodz"
    assert to_ascii("Ærø ☃") == "AEro "


def test_collapse_whitespace():
    assert collapse_whitespace("  a \t b\n\nc  ") == "a b c"
