"""SWE-bench's own knowledge of its repositories, from the `swebench` package (pinned).

SWE-bench decides, per repository and version, which Python a task runs on, what is installed
(a requirements file of the repository, conda and pip packages, the `install` command), how its
tests run (`test_cmd` plus directives taken from the test patch) and how their log is read (one
parser per repository). Orchard takes all of that from the package rather than restating it:
`swebench_spec`, `test_directives`, `log_parser`. A task row may override `python`, `install`,
`test_cmd` and `image` field by field (`orchard.recipes.swe.task.SWETask.environment`).

Only its constants, test-spec helpers and log parsers are used, imported when a task first asks
(its package imports its whole harness on the way: Docker builds, Modal, the dataset tools, ~2 s
once per process here).
"""

from __future__ import annotations

import functools
import importlib
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SWEBENCH_VERSION = "4.1.0"
"""The release whose specs are honoured (5.x no longer ships them: it evaluates from images)."""

RESOLVED_BEFORE = "2025-01-01T00:00:00Z"
"""What SWE-bench's specs install is resolved as of when SWE-bench published its instance images
(swebench 3.0, January 2025), as those images hold it: a later release of a dependency the spec
leaves unpinned can break rows they pass (docutils 0.22 dropped `docutils.utils.roman`, which
sphinx 3.x imports). Indexes that do not say when a file was uploaded offer all they hold."""

TEST_STATUSES = frozenset({"PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL"})


def swebench_module(name: str) -> Any:
    """`swebench.<name>`, imported with the root logger left as it was: some of its modules call
    `logging.basicConfig(level=INFO)` at import, which would print every HTTP request we make."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        return importlib.import_module(f"swebench.{name}")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@functools.cache
def _python_constants() -> Any:
    return swebench_module("harness.constants.python")


def swebench_spec(repo: str, version: str | None) -> dict[str, Any] | None:
    """SWE-bench's spec for `repo` at `version` (a copy), or None where it has none."""
    if version is None:
        return None
    specs = _python_constants().MAP_REPO_VERSION_TO_SPECS_PY.get(repo, {})
    spec = specs.get(str(version))
    return dict(spec) if spec is not None else None


def requirements_paths(repo: str) -> list[str]:
    """Where SWE-bench looks for `repo`'s requirements file (first found wins)."""
    return list(_python_constants().MAP_REPO_TO_REQS_PATHS.get(repo, []))


def environment_yml_paths(repo: str) -> list[str]:
    """Where SWE-bench looks for `repo`'s conda environment file."""
    return list(_python_constants().MAP_REPO_TO_ENV_YML_PATHS.get(repo, []))


def test_directives(repo: str, test_patch: str) -> list[str]:
    """What SWE-bench appends to the test command: the test files the test patch touches (data
    files left out), as Django labels (`cache.tests`) for Django."""
    get_test_directives = swebench_module("harness.test_spec.python").get_test_directives
    return list(get_test_directives({"repo": repo, "test_patch": test_patch}))


def log_parser(repo: str) -> Callable[[str], dict[str, str]] | None:
    """SWE-bench's parser of `repo`'s test log (test name -> status), or None where it has none."""
    parse = swebench_module("harness.log_parsers").MAP_REPO_TO_PARSER.get(repo)
    if parse is None:
        return None
    return lambda log: {name: status for name, status in parse(log, None).items() if status in TEST_STATUSES}


def passed(status: str | None) -> bool:
    """SWE-bench's pass rule: PASSED and XFAIL pass."""
    return status in ("PASSED", "XFAIL")


def failed(status: str | None) -> bool:
    """SWE-bench's fail rule: FAILED, ERROR and missing fail (SKIPPED and XPASS do neither)."""
    return status is None or status in ("FAILED", "ERROR", "MISSING")


PYTEST = re.compile(
    r"(?P<lead>(?:^|[;&|(]|\bthen\b|\bdo\b)\s*(?:[A-Za-z_][A-Za-z0-9_]*=(?:'[^']*'|\"[^\"]*\"|\S*)\s+)*)"
    r"(?:python[\d.]*\s+-m\s+)?pytest\b"
)
"""pytest as a command of a test command (`pytest -rA`, `python -m pytest`, `X=1 pytest`, after `;`,
`&&`, ...): where it runs, the grader starts its own runner and reads the results it sends."""


def is_pytest(test_cmd: str) -> bool:
    """Whether `test_cmd` runs pytest (else its output is read with SWE-bench's log parser)."""
    return PYTEST.search(test_cmd) is not None


@dataclass(frozen=True)
class Environment:
    """How one task's image is made and its tests are run: SWE-bench's spec for its repository
    and version, with the row's own fields on top (`orchard.recipes.swe.task.SWETask.environment`)."""

    source: str
    """Where it came from, for logs and reports: `swebench 4.1.0 django/django 4.2`, or `row`."""
    python: str | None = None
    """The Python the task wants (`3.9`); None: whatever the default base image has."""
    requirements: tuple[str, ...] = ()
    """Candidate paths (in the repository at `environment_setup_commit`) of a requirements file
    to install; the first that exists is used, its `-r` includes merged as SWE-bench does."""
    environment_yml: tuple[str, ...] = ()
    """Candidate paths of a conda environment file whose packages to install."""
    packages: tuple[str, ...] = ()
    """SWE-bench's conda packages (`mpmath flake8`), installed with pip under the same names."""
    pip_packages: tuple[str, ...] = ()
    pre_install: tuple[str, ...] = ()
    """Shell commands run in the repository before the packages (SWE-bench's `pre_install`)."""
    install: tuple[str, ...] = ()
    """Shell commands that install the repository itself, run when the image is built and again
    before the tests (as SWE-bench's evaluation script does)."""
    test_cmd: str = ""
    eval_commands: tuple[str, ...] = ()
    """Shell commands run before the tests (SWE-bench's `eval_commands`: locales, variables)."""
    parser: str | None = None
    """The repository whose SWE-bench log parser reads the test output; None: a pytest command,
    read from what the grader's runner sends (`grading.read_channel`)."""


CONDA_ACTIVATE = (
    "if [ -f /opt/miniconda3/bin/activate ] && [ -d /opt/miniconda3/envs/testbed ]; "
    "then . /opt/miniconda3/bin/activate && conda activate testbed; fi"
)
"""Shell that puts the `testbed` conda env first in a prebuilt SWE-bench image (`--image-source
swebench`); does nothing in Orchard's own images, whose Python is first on PATH already."""
