"""Harnesses (the interface a model works through), models, and the agent loop.

Fourteen harnesses ship: for software tasks `bash` (one fenced shell command per turn), `tools`
(function calling with a file editor), `cli` (a coding CLI's tools, ending on a plain-text
answer), and the agent CLIs labs use, run unmodified in the sandbox with the attempt's model
behind them (`codex`, `claude`, `opencode`, `pi`, `hermes`, `mini`: `orchard.agents.clis`); for assistant tasks (`claw`) `functions` (each service endpoint a tool), `assistant`
(shell, files, HTTP by URL, memory) and `react` (a text protocol, no tool schemas); for browser
tasks (`gui`, `miniwob`) `computer` (screenshots, 13 tools on a 0-1000 grid) and `bid` (the page
as text, elements by id). `HARNESSES` names them (each recipe lists its own: `orchard.recipes`);
your own is a class with the `Harness` methods, named as `path/to/file.py:ClassName` or
`module:Class` wherever a harness name is accepted; `examples/custom_harness.py` shows one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchard.recipes import merged
from orchard.registry import load

if TYPE_CHECKING:
    from orchard.agents.base import Harness

HARNESSES: dict[str, str] = merged("harnesses")
"""The harnesses that ship, every recipe's (`orchard.recipes`), by name: `name -> "module:Class"`."""


def harness_factory(name: str) -> Callable[[], Harness]:
    """A function making a fresh harness (one per episode): a name in `HARNESSES`, `module:Class`
    or `path/file.py:Class`."""
    return load(HARNESSES, name, "harness", files=True)


def __getattr__(name: str) -> Any:
    """`Harness`, imported when first asked for: the table above is read at `orchard --help`."""
    if name != "Harness":
        raise AttributeError(f"module 'orchard.agents' has no attribute {name!r}")
    from orchard.agents.base import Harness

    return Harness


__all__ = ["HARNESSES", "Harness", "harness_factory"]
