"""Greedy word wrapping."""

from __future__ import annotations

from typing import Optional

from .normalize import collapse_whitespace, normalize_newlines


def wrap(
    text: str,
    width: int = 70,
    indent: str = "",
    subsequent_indent: Optional[str] = None,
    break_long_words: bool = True,
) -> list[str]:
    """Wrap *text* into lines of at most *width* characters.

    Whitespace in *text* is collapsed.  ``indent`` starts the first line and
    ``subsequent_indent`` (default: same as ``indent``) every other line;
    both count towards *width*.  Words longer than a line are split unless
    ``break_long_words`` is false.
    """
    if subsequent_indent is None:
        subsequent_indent = indent
    if width <= max(len(indent), len(subsequent_indent)):
        raise ValueError("width must be larger than the indentation")

    lines: list[str] = []
    current: list[str] = []
    used = 0  # length of the line being built, indentation included

    def prefix() -> str:
        return indent if not lines else subsequent_indent

    def flush() -> None:
        nonlocal current, used
        if current:
            lines.append(prefix() + " ".join(current))
        current = []
        used = 0

    for word in text.split():
        if current and used + 1 + len(word) < width:
            current.append(word)
            used += 1 + len(word)
            continue
        flush()
        room = width - len(prefix())
        while break_long_words and len(word) > room:
            lines.append(prefix() + word[:room])
            word = word[room:]
            room = width - len(prefix())
        current = [word]
        used = len(prefix()) + len(word)
    flush()
    return lines


def fill(text: str, width: int = 70, **options) -> str:
    """Like :func:`wrap` but returns one string; paragraphs are kept.

    Paragraphs are separated by blank lines in *text* and in the result.
    """
    paragraphs = [p for p in normalize_newlines(text).split("\n\n") if p.strip()]
    return "\n\n".join("\n".join(wrap(p, width, **options)) for p in paragraphs)


def shorten(text: str, width: int, placeholder: str = " [...]") -> str:
    """Collapse whitespace and cut *text* at a word boundary to fit *width*."""
    text = collapse_whitespace(text)
    if len(text) <= width:
        return text
    if len(placeholder.lstrip()) > width:
        raise ValueError("placeholder too long for width")
    result = ""
    for word in text.split(" "):
        candidate = f"{result} {word}" if result else word
        if len(candidate) + len(placeholder) > width:
            break
        result = candidate
    return (result + placeholder) if result else placeholder.lstrip()
