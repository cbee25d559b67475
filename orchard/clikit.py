"""What every `orchard` command shares: one error style, and help that reads as a command line.

Every mistake ends as one line on stderr, `error: ...`, and exit code 1: an `OrchardError` that a
command raises (`command` turns it into that line) and a command line that typer refuses (an
unknown option, a missing argument, a value outside its choices: `Group` turns those into it).

Help shows what to type, never a Python type: a flag shows nothing after its name, a value its
metavar (`--pool IMAGE=SIZE`) or a plain word (`TEXT`, `INTEGER`, `NUMBER`, `PATH`), a choice its
choices (`--network blocked|open`), and an argument its name in capitals (`SANDBOX_ID`, `[IMAGE]`,
`COMMAND...`), where typer 0.29 prints `<bool>`, `<list[str]>` and `{sandbox_id}`. `Command` and
`Group` give their parameters that display (`_Option`, `_Argument`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, get_args

import typer
from typer._click import Context, Parameter
from typer._click.exceptions import BadParameter, NoArgsIsHelpError, NoSuchOption, UsageError
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from orchard.errors import OrchardError


def command(group: typer.Typer, *args: Any, **kwargs: Any) -> Callable:
    """Register a command whose Orchard errors end as one line on stderr and exit code 1."""

    def register(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*a: Any, **k: Any) -> Any:
            try:
                return fn(*a, **k)
            except OrchardError as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(1) from None

        return group.command(*args, cls=Command, **kwargs)(run)

    return register


def group(help: str, **kwargs: Any) -> typer.Typer:
    """A group of commands (an area, or a noun such as `sandbox`): its help when called bare."""
    return typer.Typer(
        cls=Group, help=help, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, **kwargs
    )


def either(choices: Sequence[str]) -> str:
    """`'a' or 'b'`, or `one of 'a', 'b', 'c'`: the choices a value must be one of."""
    quoted = [repr(c) for c in choices]
    return " or ".join(quoted) if len(quoted) <= 2 else f"one of {', '.join(quoted)}"


class _Plain:
    """A command whose parameters display as `_Option` and `_Argument` do."""

    def get_params(self, ctx: Context) -> list[Parameter]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            plain = _PLAIN.get(type(param))
            if plain is not None:
                param.__class__ = plain  # typer makes its own parameter classes: no hook to choose ours
            if isinstance(param, _Argument) and param.metavar is None:
                param.metavar = (param.name or "").upper()
        return params


class Command(_Plain, TyperCommand):
    """An `orchard` command."""


class Group(_Plain, TyperGroup):
    """A group of `orchard` commands; usage mistakes below it end as one `error:` line."""

    def make_context(self, info_name: str | None, args: list[str], parent: Context | None = None, **extra: Any):
        with _one_line():
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: Context) -> Any:
        with _one_line():
            return super().invoke(ctx)


@contextmanager
def _one_line() -> Iterator[None]:
    """A refused command line as `error: ...` and exit code 1 (bare groups still print their help)."""
    try:
        yield
    except NoArgsIsHelpError:
        raise
    except UsageError as exc:
        message = exc.format_message().rstrip(".")
        if isinstance(exc, NoSuchOption):  # typer's own words end in "(Possible options: ...)"
            guesses = f"; did you mean {' or '.join(sorted(exc.possibilities))}?" if exc.possibilities else ""
            message = f"no such option: {exc.option_name}{guesses}"
        see = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
        typer.echo(f"error: {message[:1].lower()}{message[1:]}{see}", err=True)
        raise typer.Exit(1) from None


class _Option(TyperOption):
    """An option shown as `--name VALUE`: a flag with no value, choices as `a|b`."""

    def display_type_rich(self, ctx: Context) -> str | None:
        if self.is_flag or self.count:
            return None
        return self.metavar or _value_word(self)

    def process_value(self, ctx: Context, value: Any) -> Any:
        with _choice_error(self, self.opts[0], value, ctx):
            return super().process_value(ctx, value)


class _Argument(TyperArgument):
    """An argument shown by its name in capitals: `NAME`, `[NAME]` when optional, `NAME...` for several."""

    @property
    def display_name_raw(self) -> str:
        return f"{self.metavar}{'...' if self.nargs != 1 else ''}"

    def _rich_display_name(self) -> str:
        return self.display_name_raw

    def _usage_display_name(self) -> str:
        return self.display_name_raw if self.required else f"[{self.display_name_raw}]"

    def display_type_rich(self, ctx: Context) -> str | None:
        return None

    def process_value(self, ctx: Context, value: Any) -> Any:
        with _choice_error(self, str(self.metavar), value, ctx):
            return super().process_value(ctx, value)


_PLAIN: dict[type, type] = {TyperOption: _Option, TyperArgument: _Argument}
_WORDS: dict[Any, str] = {int: "INTEGER", float: "NUMBER", Path: "PATH"}


def _value_word(param: TyperOption) -> str:
    """`a|b` for choices, else the kind of value in a word: TEXT, INTEGER, NUMBER, PATH."""
    described = param.type_descriptor
    if described.choices:
        return "|".join(str(getattr(c, "value", c)) for c in described.choices)
    annotation = get_args(described.annotation)[0] if described.is_list else described.annotation
    return _WORDS.get(annotation, "TEXT")


@contextmanager
def _choice_error(param: TyperOption | TyperArgument, name: str, value: Any, ctx: Context) -> Iterator[None]:
    """A value outside a parameter's choices as `--name must be 'a' or 'b', not 'c'`."""
    try:
        yield
    except BadParameter:
        choices = param.type_descriptor.choices
        if not choices or not isinstance(value, str):
            raise
        allowed = [str(getattr(c, "value", c)) for c in choices]
        raise UsageError(f"{name} must be {either(allowed)}, not {value!r}", ctx) from None
