"""A tiny template engine.

Syntax::

    Hello {{ user.name|upper }}!           variables, dotted lookup, filters
    {% for item in items %}...{% endfor %} loops (``loop.index``, ``loop.first``,
                                           ``loop.last``, ``loop.length``)
    {% if user.admin %}...{% else %}...{% endif %}
    {# a comment #}

``if`` also accepts ``not``: ``{% if not items %}``.  Missing variables
render as an empty string, or raise :class:`UndefinedError` when the
template is strict.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

from .filters import FILTERS


class TemplateError(Exception):
    """Base class for template errors."""


class TemplateSyntaxError(TemplateError):
    """The template source is malformed."""


class UndefinedError(TemplateError):
    """A variable is missing while rendering a strict template."""


_TOKEN_RE = re.compile(r"({{.*?}}|{%.*?%}|{#.*?#})", re.S)
_PATH_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")
_MISSING = object()


@dataclass
class Token:
    kind: str  # "text", "var" or "block"
    value: str
    line: int

    @property
    def tag(self) -> str:
        words = self.value.split()
        return words[0] if words else ""


def tokenize(source: str) -> list[Token]:
    tokens = []
    line = 1
    for part in _TOKEN_RE.split(source):
        if not part:
            continue
        if part.startswith("{{"):
            tokens.append(Token("var", part[2:-2].strip(), line))
        elif part.startswith("{%"):
            tokens.append(Token("block", part[2:-2].strip(), line))
        elif not part.startswith("{#"):
            tokens.append(Token("text", part, line))
        line += part.count("\n")
    return tokens


class Expression:
    """A variable path followed by filters: ``user.name|lower|escape``."""

    def __init__(self, source: str, line: int) -> None:
        self.source = source
        parts = [part.strip() for part in source.split("|")]
        self.path = parts[0]
        if not _PATH_RE.match(self.path):
            raise TemplateSyntaxError(f"line {line}: invalid expression {source!r}")
        self.filters: list[Callable] = []
        for name in parts[1:]:
            if name not in FILTERS:
                raise TemplateSyntaxError(f"line {line}: unknown filter {name!r}")
            self.filters.append(FILTERS[name])

    def evaluate(self, context: "Context") -> Any:
        value = context.resolve(self.path)
        for func in self.filters:
            value = func(value)
        return value


@dataclass
class LoopInfo:
    index: int
    length: int
    first: bool
    last: bool


class Context:
    def __init__(self, data: dict, strict: bool = False) -> None:
        self.scopes: list[dict] = [dict(data)]
        self.strict = strict

    def resolve(self, path: str) -> Any:
        head, *rest = path.split(".")
        value = _MISSING
        for scope in reversed(self.scopes):
            if head in scope:
                value = scope[head]
                break
        for part in rest:
            if value is _MISSING:
                break
            value = _lookup(value, part)
        if value is _MISSING:
            if self.strict:
                raise UndefinedError(f"{path!r} is undefined")
            return ""
        return value


def _lookup(value: Any, name: str) -> Any:
    if isinstance(value, dict):
        return value.get(name, _MISSING)
    if name.isdigit() and isinstance(value, (list, tuple)):
        index = int(name)
        return value[index] if index < len(value) else _MISSING
    return getattr(value, name, _MISSING)


# -- nodes -----------------------------------------------------------------


@dataclass
class Text:
    value: str

    def render(self, context: Context, out: list) -> None:
        out.append(self.value)


@dataclass
class Var:
    expr: Expression

    def render(self, context: Context, out: list) -> None:
        value = self.expr.evaluate(context)
        out.append("" if value is None else str(value))


@dataclass
class For:
    target: str
    iterable: Expression
    body: List[Any] = field(default_factory=list)

    def render(self, context: Context, out: list) -> None:
        items = list(self.iterable.evaluate(context) or ())
        for index, item in enumerate(items, start=1):
            loop = LoopInfo(index, len(items), index == 1, index == len(items))
            context.scopes.append({self.target: item, "loop": loop})
            try:
                _render_nodes(self.body, context, out)
            finally:
                context.scopes.pop()


@dataclass
class If:
    expr: Expression
    negate: bool
    body: List[Any] = field(default_factory=list)
    orelse: List[Any] = field(default_factory=list)

    def render(self, context: Context, out: list) -> None:
        test = bool(self.expr.evaluate(context))
        if self.negate:
            test = not test
        _render_nodes(self.body if test else self.orelse, context, out)


def _render_nodes(nodes: list, context: Context, out: list) -> None:
    for node in nodes:
        node.render(context, out)


# -- parser ----------------------------------------------------------------


def _find_end(tokens: list[Token], start: int, tag: str) -> int:
    """Index of the token closing the block opened at ``tokens[start]``."""
    for index in range(start + 1, len(tokens)):
        if tokens[index].kind == "block" and tokens[index].tag == "end" + tag:
            return index
    raise TemplateSyntaxError(f"line {tokens[start].line}: {{% {tag} %}} is never closed")


def _find_else(tokens: list[Token]) -> Optional[int]:
    for index, token in enumerate(tokens):
        if token.kind == "block" and token.tag == "else":
            return index
    return None


def _parse(tokens: list[Token]) -> list:
    nodes: list = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.kind == "text":
            nodes.append(Text(token.value))
        elif token.kind == "var":
            nodes.append(Var(Expression(token.value, token.line)))
        elif token.tag == "for":
            words = token.value.split(None, 3)
            if len(words) != 4 or words[2] != "in" or not words[1].isidentifier():
                raise TemplateSyntaxError(f"line {token.line}: expected 'for NAME in EXPR'")
            end = _find_end(tokens, index, "for")
            body = _parse(tokens[index + 1 : end])
            nodes.append(For(words[1], Expression(words[3], token.line), body))
            index = end
        elif token.tag == "if":
            words = token.value.split(None, 1)
            if len(words) != 2:
                raise TemplateSyntaxError(f"line {token.line}: expected 'if EXPR'")
            negate = words[1].startswith("not ")
            expr = Expression(words[1][4:] if negate else words[1], token.line)
            end = _find_end(tokens, index, "if")
            inner = tokens[index + 1 : end]
            split = _find_else(inner)
            if split is None:
                nodes.append(If(expr, negate, _parse(inner)))
            else:
                nodes.append(If(expr, negate, _parse(inner[:split]), _parse(inner[split + 1 :])))
            index = end
        elif token.tag in ("endfor", "endif", "else"):
            raise TemplateSyntaxError(f"line {token.line}: unexpected {{% {token.tag} %}}")
        else:
            raise TemplateSyntaxError(f"line {token.line}: unknown tag {token.tag!r}")
        index += 1
    return nodes


class Template:
    """A compiled template; render it as often as needed."""

    def __init__(self, source: str, strict: bool = False) -> None:
        self.source = source
        self.strict = strict
        self.nodes = _parse(tokenize(source))

    def render(self, data: Optional[dict] = None, **values: Any) -> str:
        context = Context({**(data or {}), **values}, strict=self.strict)
        out: list[str] = []
        _render_nodes(self.nodes, context, out)
        return "".join(out)


def render(source: str, data: Optional[dict] = None, **values: Any) -> str:
    """Compile and render *source* in one go."""
    return Template(source).render(data, **values)
