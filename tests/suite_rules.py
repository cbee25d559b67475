"""The suite's own rules, as a pytest plugin (tests/conftest.py loads it; tests/test_suite_rules.py
tests it):

* a test using the Docker engine or the kube-apiserver, through any fixture, is marked `docker` or
  `kube`, so `just test-quick` can leave those out without anyone remembering to mark them;
* a test whose call takes over 20 seconds fails unless its docstring has a line `Slow: <why>`,
  so the suite does not grow slow unnoticed (tests/README.md).
"""

from __future__ import annotations

from typing import Any

import pytest

SLOW_SECONDS = 20.0
"""A test whose call takes longer fails unless its docstring says why (`Slow: ...`); the ini option
`slow_test_seconds` sets another bound."""

HEAVY_FIXTURES = {"docker_client": "docker", "kube": "kube"}
"""A test using one of these fixtures, directly or through others, gets its marker."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("slow_test_seconds", "a test's call over this many seconds must say why", default=str(SLOW_SECONDS))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, marker in HEAVY_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    report = yield
    bound = float(item.config.getini("slow_test_seconds"))
    if call.when == "call" and report.passed and call.duration > bound and not says_why_slow(item):
        report.outcome = "failed"
        report.longrepr = (
            f"{item.nodeid} took {call.duration:.0f} s, over {bound:g} s: make it faster, or say why "
            "in its docstring with a line `Slow: <why>` (tests/README.md)"
        )
    return report


def says_why_slow(item: pytest.Item) -> bool:
    function = getattr(item, "function", None)
    return any(line.strip().startswith("Slow:") for line in (getattr(function, "__doc__", None) or "").splitlines())
