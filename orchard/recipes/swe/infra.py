"""Test infrastructure: what judges a patch, so what no patch may change.

A path in a task's working tree is **test infrastructure** when any of these holds:

* it is a test: any part of it is a folder named `test`, `tests` or `testing` (at any depth, so
  test packages' `__init__.py` and helpers too), or its name is `test_*.py`, `*_test.py`,
  `tests.py` or `conftest.py`;
* it configures the test run: `pytest.ini`, `.pytest.ini`, `pytest.toml`, `.pytest.toml`,
  `tox.ini`, `setup.cfg` or `pyproject.toml`, at any depth (pytest takes the first one it meets
  walking up from the tests, so a new one in a subfolder would take over). Whole files, not only
  their test sections: the grader never reinstalls the package, so the rest of these files does
  not change the test run anyway, while telling test sections apart means parsing them as every
  pytest version and plugin does (`[tool:pytest]`, `[pytest]`, `[tool.pytest.ini_options]`,
  `[tool.pytest]`, pytest-env's `env`, coverage's sections), where one mismatch is a forged grade;
* it loads code into the test run before any test does: packaging metadata (anything in a
  `*.egg-info`, `*.dist-info` or `*.egg` folder, `*.egg-link`, `*.pth`: their `pytest11` entry
  points are plugins pytest loads at start), `sitecustomize.py`, `usercustomize.py`; matched in
  any case, as `importlib.metadata` finds `Evil.DIST-INFO` too;
* the test command names it (`./tests/runtests.py`, `bin/test`): the runner itself;

unless the task's own fix (its gold `patch`) changes it: then it is what is being fixed
(`TaskInfra`). The grader resets every such path a patch touches to `base_commit` (removes it
where `base_commit` has none) before the test patch is applied, so the tests, their
configuration and the runner are the task's, never the agent's.

What a patch can still do is change library code that the tests import, and library code runs
inside the test process: it can monkeypatch the tests, the runner or its report. That cannot be
prevented, only noticed: `TaskInfra.suspicious` names what in a patch reaches for the test run.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from posixpath import normpath

TEST_FOLDERS = frozenset({"test", "tests", "testing"})
TEST_FILES = ("test_*.py", "*_test.py", "tests.py", "conftest.py")
CONFIG_FILES = frozenset(
    {"pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml", "tox.ini", "setup.cfg", "pyproject.toml"}
)
LOADED_AT_START = ("*.egg-link", "*.pth", "sitecustomize.py", "usercustomize.py")
METADATA_FOLDERS = ("*.egg-info", "*.dist-info", "*.egg")
RUNNER_MODULES = frozenset({"pytest", "_pytest", "py", "pluggy", "iniconfig", "unittest", "nose", "xdist"})
"""Top-level names the test runner imports: a module of that name in a patch shadows or mimics it."""

SUSPICIOUS_CODE: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (reason, re.compile(pattern))
    for reason, pattern in (
        ("imports the test runner in library code", r"^\s*(?:import|from)\s+(?:_?pytest|pluggy|unittest|py)\b"),
        ("names test-runner internals", r"_pytest|\bpluggy\b|\bpytest_[a-z_]+\s*\(|hookimpl|hookwrapper"),
        (
            "writes sys.modules",
            r"sys\.modules\s*(?:\[[^\]]*\]\s*=|\.(?:update|setdefault|pop|clear)\b)|del\s+sys\.modules",
        ),
        ("reads the test report or the runner's arguments", r"(?i)junit|xmlpath|/proc/self/cmdline|sys\.argv"),
        ("inspects its callers' frames", r"sys\._getframe|inspect\.(?:stack|currentframe|getouterframes)"),
        ("replaces builtins or tracing hooks", r"\bbuiltins\.\w+\s*=|__builtins__|sys\.(?:settrace|setprofile)"),
        ("ends the process from library code", r"os\._exit|os\.kill\(\s*os\.getpid"),
    )
)
"""What in the added lines of library code reaches for the test run (patterns over each line)."""


def is_infra(path: str) -> bool:
    """Whether `path` (relative to the working tree) is test infrastructure by its name alone."""
    parts = [p for p in normpath(path).split("/") if p not in ("", ".")]
    if not parts:
        return False
    name, lower = parts[-1], [p.lower() for p in parts]
    return (
        any(p in TEST_FOLDERS for p in lower)
        or any(fnmatchcase(name, pattern) for pattern in TEST_FILES)
        or name in CONFIG_FILES
        or any(fnmatchcase(lower[-1], pattern) for pattern in LOADED_AT_START)
        or any(fnmatchcase(p, pattern) for p in lower for pattern in METADATA_FOLDERS)
    )


@dataclass(frozen=True)
class TaskInfra:
    """One task's test infrastructure: what `is_infra` names, plus the files its test command
    names, less the files the task's own fix changes (where a task's issue lies in, say,
    `django/test/`, that file is what is being fixed, so library code, not the judge)."""

    runner: frozenset[str] = frozenset()
    fix: frozenset[str] = frozenset()

    @classmethod
    def of(cls, test_cmd: str, fix_files: Iterable[str]) -> TaskInfra:
        return cls(frozenset(command_files(test_cmd)), frozenset(normpath(p) for p in fix_files))

    def __contains__(self, path: object) -> bool:
        if not isinstance(path, str):
            return False
        path = normpath(path)
        return path not in self.fix and (path in self.runner or is_infra(path))

    def suspicious(self, added: Mapping[str, Sequence[str]]) -> list[str]:
        """Why a patch looks like it reaches for the test run, from `added`: each path it changes
        to its added lines (test infrastructure is left out: it is reset). Empty when nothing does."""
        reasons: list[str] = []
        stdlib: frozenset[str] = getattr(sys, "stdlib_module_names", frozenset())
        for path, lines in added.items():
            if path in self:
                continue
            parts = normpath(path).split("/")
            top = parts[0].removesuffix(".py")
            if any(p.removesuffix(".py") in RUNNER_MODULES for p in parts):
                reasons.append(f"{path}: a module named like the test runner's")
            elif path.endswith(".py") and top in stdlib:
                reasons.append(f"{path}: a top-level module that shadows the standard library's {top}")
            if parts[-1].endswith((".pyc", ".pyo", ".so")) or "__pycache__" in parts:
                reasons.append(f"{path}: compiled code")
            for reason, pattern in SUSPICIOUS_CODE:
                line = next((line for line in lines if pattern.search(line)), None)
                if line is not None:
                    reasons.append(f"{path}: {reason} ({line.strip()[:80]})")
        return reasons


def command_files(test_cmd: str) -> list[str]:
    """The working tree's files a test command names (`./tests/runtests.py`, `bin/test`)."""
    try:
        words = shlex.split(test_cmd, comments=True)
    except ValueError:  # unbalanced quotes: the shell will refuse it too
        return []
    files = []
    for word in words:
        if word.startswith(("-", "/")) or "/" not in word or "=" in word or "::" in word:
            continue
        path = normpath(word)
        if not path.startswith("../"):
            files.append(path)
    return files
