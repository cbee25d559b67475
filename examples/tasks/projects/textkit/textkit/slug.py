"""URL slugs."""

from __future__ import annotations

import re
from typing import Collection, Iterable, Optional

from .normalize import to_ascii

_WORD_RE = re.compile(r"[A-Za-z0-9]+")


def slugify(
    text: str,
    sep: str = "-",
    max_length: Optional[int] = None,
    lowercase: bool = True,
    stopwords: Iterable[str] = (),
) -> str:
    """Turn *text* into a URL slug.

    >>> slugify("Crème Brûlée: a recipe!")
    'creme-brulee-a-recipe'

    Words are runs of ASCII letters and digits after transliteration;
    everything else separates words.  ``stopwords`` are dropped
    (case-insensitively) and ``max_length`` limits the length of the result.
    """
    if max_length is not None and max_length < 1:
        raise ValueError("max_length must be at least 1")
    text = to_ascii(text)
    if lowercase:
        text = text.lower()
    stop = {word.lower() for word in stopwords}
    words = [word for word in _WORD_RE.findall(text) if word.lower() not in stop]
    slug = sep.join(words)
    if max_length is not None:
        slug = slug[:max_length]
    return slug


def unique_slug(text: str, existing: Collection[str], **options) -> str:
    """A slug for *text* that is not in *existing*, adding ``-2``, ``-3``..."""
    base = slugify(text, **options)
    sep = options.get("sep", "-")
    candidate = base
    counter = 2
    while candidate in existing:
        candidate = f"{base}{sep}{counter}"
        counter += 1
    return candidate
