"""Registries: tables `name -> "module:Attr"`, and the one way to load what a name stands for.

Harnesses, backends, models and task kinds are each chosen by a name in their table, or by a full
import path where the table has no name for it: `module:Attr`, and where files are allowed,
`path/to/file.py:Attr`. The table's keys make the help text (`names`) and the error listing what is
available; nothing is imported until a name is loaded, so a table costs nothing at `orchard --help`.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchard.errors import ConfigError

_from_files: dict[Path, Any] = {}
_guard = threading.Lock()


def names(table: Mapping[str, str], *, files: bool = False, form: str = "Class") -> str:
    """What a user may write, for help texts and errors: `bash, tools, cli, module:Class or
    path/file.py:Class` (`form` names what the attribute is: a class, a function)."""
    forms = [*table, f"module:{form}"] + ([f"path/file.py:{form}"] if files else [])
    return f"{', '.join(forms[:-1])} or {forms[-1]}"


def load(
    table: Mapping[str, str],
    name: str,
    what: str,
    *,
    files: bool = False,
    relative_to: str | Path | None = None,
    form: str = "Class",
) -> Any:
    """The object `name` stands for: a key of `table`, `module:Attr`, or with `files` `path/file.py:Attr`.

    A relative file path is taken from `relative_to` (default: the working folder). A file is executed
    once per process, so a name loads the same object every time. Every failure is a `ConfigError`
    naming `what` (`harness`, `backend`, ...); an unknown name lists the table's keys.
    """
    reference = table.get(name, name)
    where, colon, attribute = reference.rpartition(":")
    is_file = where.endswith(".py")
    if not colon or not where or not attribute or (is_file and not files):
        raise ConfigError(f"unknown {what} {name!r}: use {names(table, files=files, form=form)}")
    try:
        module = (
            _module_of_file(Path(relative_to or ".") / where, what, name) if is_file else importlib.import_module(where)
        )
        return getattr(module, attribute)
    except ConfigError:
        raise
    except Exception as exc:  # an import error, or whatever a plugin file raises as it runs: one line
        raise ConfigError(f"cannot load {what} {name!r}: {exc}") from None


def _module_of_file(path: Path, what: str, name: str) -> Any:
    """The module a Python file defines, executed once and kept in `sys.modules` (pydantic and
    pickle look classes up there) under a name unique to the file."""
    path = path.expanduser().resolve()
    with _guard:
        if path in _from_files:
            return _from_files[path]
        if not path.is_file():
            raise ConfigError(f"{what} {name!r}: no file {path}")
        module_name = f"orchard_plugin_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None  # a .py path always has a source loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
        _from_files[path] = module
        return module
