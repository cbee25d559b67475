"""Character-level normalisation helpers shared by the other modules."""

from __future__ import annotations

import re
import unicodedata

# Letters that do not decompose into ASCII + combining marks under NFKD.
_TRANSLITERATE = {
    "ß": "ss", "æ": "ae", "Æ": "AE", "œ": "oe", "Œ": "OE", "ø": "o", "Ø": "O",
    "ł": "l", "Ł": "L", "đ": "d", "Đ": "D", "þ": "th", "Þ": "TH",
}

_WHITESPACE_RE = re.compile(r"\s+")


def normalize_newlines(text: str) -> str:
    """Convert Windows (``\\r\\n``) and old Mac (``\\r``) line ends to ``\\n``."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def strip_accents(text: str) -> str:
    """Remove combining marks: ``"Crème brûlée"`` -> ``"Creme brulee"``."""
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def to_ascii(text: str) -> str:
    """Best-effort ASCII transliteration; characters without one are dropped."""
    text = "".join(_TRANSLITERATE.get(ch, ch) for ch in text)
    return strip_accents(text).encode("ascii", "ignore").decode("ascii")


def collapse_whitespace(text: str) -> str:
    """Replace runs of whitespace by a single space and trim the ends."""
    return _WHITESPACE_RE.sub(" ", text).strip()
