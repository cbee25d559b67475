"""Filters available in templates: ``{{ name|upper }}``."""

from __future__ import annotations

import html
from typing import Callable, Dict

from .slug import slugify
from .wrap import shorten

FILTERS: Dict[str, Callable] = {}


def register(name: str):
    """Decorator adding a filter function to :data:`FILTERS`."""

    def decorator(func: Callable) -> Callable:
        FILTERS[name] = func
        return func

    return decorator


def _text(value) -> str:
    return "" if value is None else str(value)


@register("upper")
def upper(value) -> str:
    return _text(value).upper()


@register("lower")
def lower(value) -> str:
    return _text(value).lower()


@register("escape")
def escape(value) -> str:
    return html.escape(_text(value))


@register("slug")
def slug(value) -> str:
    return slugify(_text(value))


@register("shorten")
def shorten_filter(value) -> str:
    return shorten(_text(value), 40)


@register("length")
def length(value) -> int:
    return 0 if value is None else len(value)


@register("join")
def join(value) -> str:
    return ", ".join(_text(item) for item in value or ())

