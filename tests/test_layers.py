"""The layers of the package, read from its source: which parts may import which.

Every import counts: at the top of a module or inside a function, for type checking only or not
(a lazy import is a dependency all the same). The source is read with `ast`, so nothing is
imported to check it. Besides the layers: no part takes another's private names, and the
shared layers name no recipe (they read the recipes' table, `orchard.recipes`).
"""

from __future__ import annotations

import ast
import functools
import itertools
import re
import sys
from pathlib import Path

import orchard
from orchard.recipes import recipes

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


@functools.cache
def _area(module: str) -> str:
    """The part of Orchard a module belongs to: its subpackage (its `cli.py`, the commands, with
    it), or the top-level module itself. Each recipe (`orchard.recipes.NAME`) is a part of its
    own, on the shared ones; the recipes' table (`orchard.recipes` itself) is one they all read."""
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
    assert private_imports(
        "from orchard.env.client import _Public, Sandbox\nfrom .calls import _mine", "orchard.store.x"
    ) == ["orchard.store.x imports _Public from orchard.env.client"]
    assert private_imports("from orchard.env import client as c\nc._hidden()", "orchard.store.x") == [
        "orchard.store.x uses c._hidden of orchard.env.client"
    ]
    assert private_imports("from orchard.env.client import _Mine", "orchard.env.manager") == []  # its own part


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
    """Each part sits on the ones below it, its commands (`cli.py`) counted with it; only the root
    command (`orchard.cli`) mounts them all."""
    assert cycles(area_imports()) == []


def private_imports(source: str, module: str, *, package: bool = False) -> list[str]:
    """Each name starting with `_` that `source` (the text of `module`) takes from another part of
    Orchard: `from part import _name`, or `alias._name` of a module it imported from there."""
    found: list[str] = []
    bound: dict[str, str] = {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                line = f"from {'.' * node.level}{node.module or ''} import {alias.name}"
                for target in imported_modules(line, module, package=package):
                    if target.endswith(f".{alias.name}") and target in MODULES:
                        bound[alias.asname or alias.name] = target
                    elif (
                        alias.name.startswith("_")
                        and not alias.name.startswith("__")
                        and _area(target) != _area(module)
                    ):
                        found.append(f"{module} imports {alias.name} from {target}")
        elif isinstance(node, ast.Import):
            bound.update({a.asname: a.name for a in node.names if a.asname and a.name.startswith("orchard.")})
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and _area(bound[node.value.id]) != _area(module)
        ):
            found.append(f"{module} uses {node.value.id}.{node.attr} of {bound[node.value.id]}")
    return found


def test_no_part_takes_another_parts_private_names():
    """What starts with `_` is its part's own: another part that needs it needs a public name."""
    found = [
        line
        for module, path in MODULES.items()
        for line in private_imports(path.read_text(), module, package=path.name == "__init__.py")
    ]
    assert found == []


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are docstrings: a module's, class's or function's, and
    an attribute's (a string right after an assignment)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if not isinstance(body, list) or not body:
            continue
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
        for before, after in itertools.pairwise(body):
            if isinstance(before, (ast.Assign, ast.AnnAssign)) and isinstance(after, ast.Expr):
                found.add(id(after.value))  # an attribute's docstring (or a bare expression: no string)
    return found


def recipe_names_in(source: str, words: set[str]) -> list[str]:
    """Where `source` names a recipe: an import of `orchard.recipes.NAME`, or a string (not a
    docstring) holding one of `words` as a word of its own."""
    pattern = re.compile(
        r"(?<![\w./-])(" + "|".join(map(re.escape, sorted(words, key=len, reverse=True))) + r")(?![\w-])", re.I
    )
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"line {node.lineno}: imports {n}" for n in names if n.startswith("orchard.recipes.")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            found += [f"line {node.lineno}: {m.group(0)!r}" for m in pattern.finditer(node.value)]
    return found


def test_the_shared_layers_name_no_recipe():
    """Everything outside `orchard/recipes/NAME/` (and the table, `orchard/recipes/__init__.py`)
    knows the recipes only through the table: no import of a recipe's modules, and no string that
    names a recipe, its task kinds, folder formats, schemes, images or title (docstrings may give
    them as examples)."""
    words = {
        word
        for found in recipes().values()
        for word in (found.name, found.title, *found.kinds, *found.folders, *found.schemes, *found.images)
    }
    assert recipe_names_in("from orchard.recipes.swe.task import SWETask\nkind = 'SWE'", {"swe"}) == [
        "line 1: imports orchard.recipes.swe.task",
        "line 2: 'SWE'",
    ]
    assert recipe_names_in('"""A swe task."""\nx = "mini-swe-agent, orchard.recipes.swe"', {"swe"}) == []
    shared = {
        module: path
        for module, path in MODULES.items()
        if not (_area(module).startswith("orchard.recipes.") or module == "orchard.recipes")
    }
    found = {module: lines for module, path in shared.items() if (lines := recipe_names_in(path.read_text(), words))}
    assert found == {}


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
