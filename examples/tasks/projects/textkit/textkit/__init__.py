"""textkit - small text utilities: slugs, wrapping, CSV-ish parsing, templates."""

from .csvish import CsvError, format_rows, parse_records, parse_rows
from .normalize import collapse_whitespace, normalize_newlines, strip_accents, to_ascii
from .slug import slugify, unique_slug
from .template import Template, TemplateError, TemplateSyntaxError, UndefinedError, render
from .wrap import fill, shorten, wrap

__version__ = "1.0"

__all__ = [
    "CsvError", "Template", "TemplateError", "TemplateSyntaxError", "UndefinedError",
    "collapse_whitespace", "fill", "format_rows", "normalize_newlines", "parse_records",
    "parse_rows", "render", "shorten", "slugify", "strip_accents", "to_ascii",
    "unique_slug", "wrap",
]
