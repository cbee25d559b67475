"""Grading: does a patch resolve a task? Decided by the task's tests in a fresh sandbox.

The patch (what an agent changed, or a prediction) is applied to a fresh checkout of the task's
image; every file the test patch touches is then reset to `base_commit` and the test patch applied
on top, so an agent can neither weaken nor delete the tests that judge it. Then FAIL_TO_PASS and
PASS_TO_PASS run in one test command, and each test's outcome is read from pytest's `-rA` summary
(a test that does not appear there counts as failed). Resolved means every FAIL_TO_PASS and
every PASS_TO_PASS test passed.

Every way of not resolving is an outcome, never an exception: `empty_patch`, `patch_failed` (it
does not apply), `unresolved` (tests ran), `timeout` (the tests hung), `error` (the test patch
does not apply, the sandbox died, the image could not be built: the task or the machine is at
fault, not the patch).
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from orchard.errors import OrchardError

if TYPE_CHECKING:
    from orchard.env.client import Client, Sandbox
    from orchard.tasks.schema import SWETask

Outcome = Literal["resolved", "unresolved", "empty_patch", "patch_failed", "timeout", "error"]
TestStatus = Literal["PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS", "MISSING"]

PATCH_FILE = "/tmp/orchard-model.patch"
TEST_PATCH_FILE = "/tmp/orchard-test.patch"
DEFAULT_TEST_TIMEOUT = 900.0
_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\s+(\S+)(?:\s+-\s.*)?$")
_STATUSES = frozenset({"PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS"})
_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


@dataclass
class Grade:
    """The verdict on one patch for one task."""

    instance_id: str
    outcome: Outcome
    fail_to_pass: dict[str, list[str]] = field(default_factory=lambda: {"success": [], "failure": []})
    pass_to_pass: dict[str, list[str]] = field(default_factory=lambda: {"success": [], "failure": []})
    tests: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    log: str = ""
    duration: float = 0.0

    @property
    def resolved(self) -> bool:
        return self.outcome == "resolved"

    def public(self) -> dict[str, Any]:
        return {**asdict(self), "resolved": self.resolved}


def parse_pytest_summary(log: str, known: Sequence[str] = ()) -> dict[str, str]:
    """Test id -> status from the `-rA` short summary of a pytest log. Ids in `known` are matched
    whole, so parametrized ids with spaces (`test_x[a b]`) are found too."""
    statuses: dict[str, str] = {}
    by_length = sorted(known, key=len, reverse=True)
    for raw in log.splitlines():
        line = raw.strip()
        match = _SUMMARY.match(line)
        status = match.group(1) if match else line.split(" ", 1)[0]
        if status not in _STATUSES:
            continue
        rest = line[len(status) :].strip()
        name = next((k for k in by_length if rest == k or rest.startswith(k + " - ")), None)
        if name is not None:
            statuses[name] = status
        elif match:
            statuses[match.group(2)] = status
    return statuses


def touched_files(diff: str) -> list[str]:
    """The files a unified git diff changes (both sides of a rename)."""
    files: list[str] = []
    for a, b in _DIFF_FILE.findall(diff):
        for path in (a, b):
            if path not in files:
                files.append(path)
    return files


def grade_in(box: Sandbox, task: SWETask, patch: str, *, timeout: float = DEFAULT_TEST_TIMEOUT) -> Grade:
    """Grade `patch` in `box`, a fresh sandbox of the task's image (it is left as the tests left it)."""
    started = time.monotonic()
    grade = Grade(task.instance_id, "unresolved")
    try:
        _grade(box, task, patch, timeout, grade)
    except OrchardError as exc:  # the sandbox died, the agent went away, ...
        grade.outcome, grade.error = "error", f"grading failed: {exc}"
    grade.duration = time.monotonic() - started
    return grade


def _grade(box: Sandbox, task: SWETask, patch: str, timeout: float, grade: Grade) -> None:
    cwd = task.workdir
    if not patch.strip():
        grade.outcome, grade.error = "empty_patch", "the patch is empty"
        return
    box.write_file(PATCH_FILE, patch if patch.endswith("\n") else patch + "\n")
    applied = box.exec(
        f"git apply --verbose {PATCH_FILE} || patch --batch --fuzz=5 -p1 -i {PATCH_FILE}", cwd=cwd, timeout=120
    )
    if applied.exit_code != 0:
        grade.outcome, grade.error = "patch_failed", "the patch does not apply"
        grade.log = applied.stdout + applied.stderr
        return
    if task.test_patch.strip():
        reset = []
        for path in touched_files(task.test_patch):
            quoted = shlex.quote(path)
            reset.append(
                f"if git cat-file -e {task.base_commit}:{quoted} 2>/dev/null; "
                f"then git checkout -q {task.base_commit} -- {quoted}; else rm -rf -- {quoted}; fi"
            )
        box.write_file(TEST_PATCH_FILE, task.test_patch if task.test_patch.endswith("\n") else task.test_patch + "\n")
        setup = box.exec("\n".join([*reset, f"git apply --verbose {TEST_PATCH_FILE}"]), cwd=cwd, timeout=120)
        if setup.exit_code != 0:
            grade.outcome, grade.error = "error", "the task's test patch does not apply (the task is broken)"
            grade.log = setup.stdout + setup.stderr
            return
    command = f"{task.test_cmd} {' '.join(shlex.quote(t) for t in task.tests)}"
    run = box.exec(command, cwd=cwd, timeout=timeout)
    grade.log = run.stdout + run.stderr
    if run.timed_out:
        grade.outcome, grade.error = "timeout", f"the tests ran longer than {timeout:g} s"
        return
    seen = parse_pytest_summary(grade.log, task.tests)
    for names, bucket in ((task.fail_to_pass, grade.fail_to_pass), (task.pass_to_pass, grade.pass_to_pass)):
        for name in names:
            grade.tests[name] = status = seen.get(name, "MISSING")
            bucket["success" if status in ("PASSED", "XPASS") else "failure"].append(name)
    failed = grade.fail_to_pass["failure"] or grade.pass_to_pass["failure"]
    grade.outcome = "unresolved" if failed else "resolved"


def grade_patch(
    client: Client, task: SWETask, patch: str, image: str, *, timeout: float = DEFAULT_TEST_TIMEOUT
) -> Grade:
    """Grade `patch` for `task` in a fresh sandbox of `image`, deleted afterwards."""
    if not patch.strip():
        return Grade(task.instance_id, "empty_patch", error="the patch is empty")
    started = time.monotonic()
    try:
        with client.create(image, memory="4Gi") as box:
            grade = grade_in(box, task, patch, timeout=timeout)
    except OrchardError as exc:
        grade = Grade(task.instance_id, "error", error=f"could not start the task's sandbox: {exc}")
    grade.duration = time.monotonic() - started
    return grade
