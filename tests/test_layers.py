"""The layers of the package, read from its source: which parts may import which.

Every import counts: at the top of a module or inside a function, for type checking only or not
(a lazy import is a dependency all the same). The source is read with `ast`, so nothing is
imported to check it.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import orchard

ROOT = Path(orchard.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in ROOT.rglob("*.py")}


def imported_modules(
    source: str, module: str, *, package: bool = False, known: frozenset[str] | None = None
) -> set[str]:
    """The Orchard modules `source` (the text of `module`) imports, as absolute names.

    `from a import b` names the module `a.b` when that is a module of `known`, else `a`; relative
    imports are resolved against `module`'s package.
    """
    known = frozenset(MODULES) if known is None else known
    here = module if package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {name for name in found if name == "orchard" or name.startswith("orchard.")}


def _imports(module: str) -> set[str]:
    path = MODULES[module]
    return imported_modules(path.read_text(), module, package=path.name == "__init__.py")


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def offending(importer: str, imported: str) -> list[str]:
    """Each `module imports target` where a module under `importer` imports one under `imported`."""
    return sorted(
        f"{module} imports {target}"
        for module in MODULES
        if _within(module, importer)
        for target in _imports(module)
        if _within(target, imported)
    )


def uses_typer(source: str) -> bool:
    """Whether a module's text imports typer: then it is a module of commands."""
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        if any(name.split(".")[0] == "typer" for name in names):
            return True
    return False


@functools.cache
def _area(module: str) -> str:
    """The part of Orchard a module belongs to: its subpackage, or the top-level module itself.
    Each recipe (`orchard.recipes.NAME`) is a part of its own, on the shared ones; the recipes'
    table (`orchard.recipes` itself) is one they all read.

    Modules of commands (those that use typer, such as `orchard/<area>/cli.py`) belong to the
    CLI, the layer above all the others.
    """
    if module in MODULES and uses_typer(MODULES[module].read_text()):
        return "orchard.cli"
    parts = module.split(".")
    return ".".join(parts[: 3 if parts[:2] == ["orchard", "recipes"] else 2])


def area_imports() -> dict[str, set[str]]:
    """Which parts of Orchard each part imports (itself left out)."""
    edges: dict[str, set[str]] = {}
    for module in MODULES:
        for target in _imports(module):
            if target != "orchard" and _area(target) != _area(module):
                edges.setdefault(_area(module), set()).add(_area(target))
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Groups of nodes that reach each other through `edges`, each sorted."""

    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    reachable = {node: reach(node) for node in edges}
    groups = {frozenset(n for n in reachable if n in reachable[node] and node in reachable[n]) for node in reachable}
    return sorted(sorted(group) for group in groups if len(group) > 1)


def test_the_reader_sees_lazy_relative_typed_and_package_imports():
    """The check itself: every form of import Orchard uses is seen, so a new one cannot slip by."""
    source = """
import json
from typing import TYPE_CHECKING
from orchard import store, __version__
from . import calls
from .backends.base import SandboxSpec
if TYPE_CHECKING:
    from orchard.train.value import ValueModel

def later():
    import orchard.env.client
    from orchard.env.discovery import running_service
"""
    known = frozenset({"orchard", "orchard.store", "orchard.env.calls", "orchard.env.backends.base"})
    assert imported_modules(source, "orchard.env.manager", known=known) == {
        "orchard",
        "orchard.store",
        "orchard.env.calls",
        "orchard.env.backends.base",
        "orchard.train.value",
        "orchard.env.client",
        "orchard.env.discovery",
    }
    assert imported_modules("from ... import errors", "orchard.env.backends", package=True) == {"orchard.errors"}
    assert imported_modules("from .. import errors", "orchard.env.manager") == {"orchard.errors"}
    assert offending("orchard.env", "orchard.store") != []  # the manager records in the store: seen
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert uses_typer("def main():\n    import typer") and uses_typer("from typer.testing import CliRunner")
    assert not uses_typer("import subprocess  # runs a CLI agent: not a module of commands")


def test_the_store_imports_nothing_from_the_environment_layer():
    """The store sits below the environment layer (process identity is `orchard.process`)."""
    assert offending("orchard.store", "orchard.env") == []


def test_the_service_imports_nothing_from_the_sdk():
    """`orchard up` and the SDK share the wire (`calls.py`) and discovery, never the client."""
    assert offending("orchard.env.service", "orchard.env.client") == []


def test_evaluation_imports_nothing_from_training():
    """Training uses evaluation; evaluation never needs a trainer."""
    assert offending("orchard.eval", "orchard.train") == []


def test_no_two_parts_of_orchard_import_each_other():
    """Each part sits on the ones below it; the CLI (every module of commands) on them all."""
    assert cycles(area_imports()) == []


AGENT = ROOT / "env" / "agent"
WIRE_WORDS = ("orchard-pty", "orchard-tunnel", "application/vnd.orchard.exec", "ORCHARD_AGENT_TOKEN")
"""Names of the agent's wire protocol that `orchard/env/agent/protocol.py` alone spells."""


def test_no_module_of_the_agent_is_over_800_lines():
    """The agent is a package of one module a responsibility, each small enough to read."""
    sizes = {path.name: len(path.read_text().splitlines()) for path in AGENT.glob("*.py")}
    assert {"protocol.py", "server.py", "__main__.py"} <= set(sizes)
    assert {name: lines for name, lines in sizes.items() if lines > 800} == {}


def test_the_agent_imports_the_standard_library_and_itself_only():
    """It runs in any image on the bundle's bare interpreter: nothing of Orchard's dependencies
    (nor of Orchard outside its package), lazy and type-checking imports included."""
    outside = []
    for path in sorted(AGENT.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                if isinstance(node, ast.ImportFrom) and node.level > 1:  # out of the package
                    outside.append(f"{path.name}: from {'.' * node.level}{node.module or ''}")
                continue
            # _sha2: the builtin SHA-256 of Python 3.12 and later (3.11's is _sha256)
            outside += [
                f"{path.name}: {name}"
                for name in names
                if name.split(".")[0] not in {*sys.stdlib_module_names, "_sha2"}
            ]
    assert outside == []


def _literals(source: str) -> list[str]:
    """The string constants of a module's code, its docstrings (and other bare strings) left out."""
    tree = ast.parse(source)
    prose = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
    ]


def test_the_wire_words_are_spelled_in_the_agents_protocol_module_only():
    """The host imports the agent's wire names (`orchard.env.agent.protocol`) rather than spelling
    them again, so the two sides cannot drift apart."""
    assert _literals('"""about orchard-pty"""\nX = "orchard-pty"\n"""and orchard-tunnel"""') == ["orchard-pty"]
    spelled = sorted(
        {
            f"{name} spells {word!r}"
            for name, path in MODULES.items()
            for literal in _literals(path.read_text())
            for word in WIRE_WORDS
            if word in literal
        }
    )
    assert spelled == [f"orchard.env.agent.protocol spells {word!r}" for word in sorted(WIRE_WORDS)]
