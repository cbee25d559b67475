"""The suite's own rules, as a pytest plugin (tests/conftest.py loads it; tests/test_suite_rules.py
tests it):

* a test using the Docker engine or the kube-apiserver, through any fixture, is marked `docker` or
  `kube`, so `just test-quick` can leave those out without anyone remembering to mark them;
* a test whose call takes over 20 seconds fails unless its docstring has a line `Slow: <why>`,
  so the suite does not grow slow unnoticed (tests/README.md);
* `--cpu-report FILE` appends, for each test, the machine's busy CPU seconds and the wall seconds
  from its setup to its teardown as a JSON line: with one process (`-p no:xdist`) on an idle
  machine, what the test costs, its containers, browsers and subprocesses included.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

SLOW_SECONDS = 20.0
"""A test whose call takes longer fails unless its docstring says why (`Slow: ...`); the ini option
`slow_test_seconds` sets another bound."""

HEAVY_FIXTURES = {"docker_client": "docker", "kube": "kube"}
"""A test using one of these fixtures, directly or through others, gets its marker."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("slow_test_seconds", "a test's call over this many seconds must say why", default=str(SLOW_SECONDS))
    parser.addoption("--cpu-report", metavar="FILE", help="append each test's machine CPU and wall seconds to FILE")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    path = item.config.getoption("cpu_report")
    if not path:
        return (yield)
    cpu, wall = busy_cpu_seconds(), time.monotonic()
    try:
        return (yield)
    finally:
        record = {
            "id": item.nodeid,
            "cpu": round(busy_cpu_seconds() - cpu, 2),
            "wall": round(time.monotonic() - wall, 2),
        }
        with open(path, "a") as out:
            out.write(json.dumps(record) + "\n")


def busy_cpu_seconds() -> float:
    """The seconds every CPU of this machine spent busy since boot (`/proc/stat`: all but idle and iowait)."""
    with open("/proc/stat") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / 100


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
