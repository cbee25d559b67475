"""The suite's own rules (tests/suite_rules.py), on a suite of their own run by pytester."""

from __future__ import annotations

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
