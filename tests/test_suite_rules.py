"""The suite's own rules (tests/suite_rules.py), on a suite of their own run by pytester."""

from __future__ import annotations

import json

import pytest

pytest_plugins = ["pytester"]
INNER = (
    "-p",
    "no:cacheprovider",
    "-p",
    "no:xdist",
    "-p",
    "no:textual-snapshot",
    "-p",
    "no:asyncio",
)  # not the outer run's

SUITE = """
import time

def test_slow_without_a_reason():
    time.sleep(0.6)

def test_slow_with_a_reason():
    \"\"\"Sleeps.

    Slow: it sleeps, to show the rule.
    \"\"\"
    time.sleep(0.6)

def test_quick():
    pass

def test_failing_slowly():
    time.sleep(0.6)
    assert False
"""


def test_a_slow_test_fails_unless_its_docstring_says_why(pytester: pytest.Pytester):
    pytester.makeconftest('pytest_plugins = ["suite_rules"]')
    pytester.makepyfile(SUITE)
    result = pytester.runpytest_inprocess(*INNER, "-o", "slow_test_seconds=0.5")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["*test_slow_without_a_reason took 1 s, over 0.5 s: make it faster, or say why*"])
    assert "test_slow_with_a_reason took" not in result.stdout.str()


def test_tests_using_the_engine_or_the_api_server_are_marked_through_any_fixture(pytester: pytest.Pytester):
    pytester.makeconftest("""
import pytest
pytest_plugins = ["suite_rules"]

@pytest.fixture
def docker_client(): return None

@pytest.fixture
def kube(): return None

@pytest.fixture
def box(docker_client): return None
""")
    pytester.makepyfile("""
def test_box(box): pass
def test_kube(kube): pass
def test_plain(): pass
""")
    quick = pytester.runpytest_inprocess(*INNER, "-m", "not docker and not kube")
    quick.assert_outcomes(passed=1, deselected=2)
    docker = pytester.runpytest_inprocess(*INNER, "-m", "docker", "-v")
    docker.assert_outcomes(passed=1, deselected=2)
    docker.stdout.fnmatch_lines(["*test_box PASSED*"])


def test_cpu_report_gives_each_tests_machine_cpu_and_wall(pytester: pytest.Pytester):
    pytester.makeconftest('pytest_plugins = ["suite_rules"]')
    pytester.makepyfile("""
import time

def test_busy():
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass

def test_asleep():
    time.sleep(0.3)
""")
    report = pytester.path / "cpu.jsonl"
    result = pytester.runpytest_inprocess(*INNER, "--cpu-report", str(report))
    result.assert_outcomes(passed=2)
    records = {record["id"].split("::")[1]: record for record in map(json.loads, report.read_text().splitlines())}
    assert set(records) == {"test_busy", "test_asleep"}
    assert records["test_busy"]["cpu"] >= 0.25 and records["test_busy"]["wall"] >= 0.3
    assert records["test_asleep"]["wall"] >= 0.3
