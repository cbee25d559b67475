"""Harnesses (the interface a model works through), models, and the agent loop.

Three harnesses ship: `bash` (one fenced shell command per turn), `tools` (function calling with
a file editor), `cli` (a coding CLI's tools, ending on a plain-text answer). Your own is a class
with the `Harness` methods in a file: name it as `path/to/file.py:ClassName` (or `module:Class`)
wherever a harness name is accepted; `examples/custom_harness.py` shows one.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path

from orchard.agents.base import Harness
from orchard.errors import ConfigError

BUILTIN = ("bash", "tools", "cli")


def harness_factory(name: str) -> Callable[[], Harness]:
    """A function making a fresh harness (one per episode) for a built-in name or `file.py:Class`."""
    if name == "bash":
        from orchard.agents.bash import BashHarness

        return BashHarness
    if name == "tools":
        from orchard.agents.tools import ToolsHarness

        return ToolsHarness
    if name == "cli":
        from orchard.agents.cli import CliHarness

        return CliHarness
    where, colon, attribute = name.rpartition(":")
    if not colon or not where or not attribute:
        raise ConfigError(f"unknown harness {name!r}: use {', '.join(BUILTIN)} or path/to/file.py:ClassName")
    try:
        if where.endswith(".py"):
            path = Path(where)
            spec = importlib.util.spec_from_file_location(f"orchard_harness_{path.stem}", path)
            if spec is None or spec.loader is None or not path.is_file():
                raise ConfigError(f"harness file {where} not found")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
        factory = getattr(module, attribute)
    except (ImportError, AttributeError, SyntaxError) as exc:
        raise ConfigError(f"cannot load harness {name!r}: {exc}") from None
    return factory


__all__ = ["BUILTIN", "Harness", "harness_factory"]
