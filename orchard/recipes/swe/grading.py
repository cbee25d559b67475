"""Grading: does a patch resolve a task? Decided by the task's tests in a fresh sandbox.

The patch (what an agent changed, or a prediction) is untrusted input, whoever made it: an agent
can replace `git` in its own sandbox and submit any text. So it is read on this host first, every
header form `git apply` or `patch` honours (`diff --git`, `---`/`+++`, `***`, `Index:`, renames,
copies, modes; past the indentation, `X` and `- ` dash escapes `patch` skips; a mode as either
applier parses it), and refused (`patch_failed`, with the reason) when any name it carries is
under `.git`, absolute, or climbs out with `..`, or when it makes a link that points out of the
tree or into `.git`. What passes is applied to a fresh checkout of the task's image (`git apply`,
else `patch --unified --fuzz`, for model patches with fuzz), and then held to what was read, in the
sandbox, before any `git` runs again (`check_applied`): the tree (`.git` included) is listed
before and after applying, and the patch is refused when anything changed that it does not
declare, or when any new or changed link points out of the tree or into `.git` (a link a rename
moved, a mode spelling, a write through a link in the tree). Every path it touched that is test
infrastructure (`orchard.recipes.swe.infra`: tests, conftest.py, pytest's config files, packaging
metadata, the runner the test command names, not what the task's own fix changes) is reset to
`base_commit`, or removed where `base_commit` has none, never through a link; then every file the
test patch touches is reset too and the test patch applied on top. Git runs with hooks and
fsmonitor disabled, without system or global configuration, throughout.

The tests run as SWE-bench's evaluation script runs them (`_run_tests`): the repository's
`install` again, then its test command with the test directives from the test patch
(`test_command`: `pytest -rA tests/test_cli.py`, Django's `./tests/runtests.py ... cache.tests`,
sympy's `bin/test ...`), FAIL_TO_PASS and PASS_TO_PASS in one run. Compiled files in the tree
(`__pycache__`, `*.pyc`: planted ones would be imported in place of their source) are deleted
before the run. Resolved is SWE-bench's rule: every FAIL_TO_PASS and every PASS_TO_PASS test passed
(PASSED or XFAIL) or was skipped, none failed, errored or went missing. A run in which no test ran
at all is `error` when the tests find none without the patch either (the task or its environment
is broken), else `unresolved` (the patch broke the test run).

Where the runner is pytest, it starts through `RUNNER` (`orchard.recipes.swe.pytest_runner`), and
the grade is read from nothing the code under test can rewrite after the fact. The working tree is last on
`sys.path`, so nothing in it stands in for pytest or the modules pytest imports late. Each test's
result is sent to this host while the tests run, over a channel the process cannot take back, and
sealed by an audit hook set before the tree is imported, which refuses what a fix has no business
doing in a test run (gc introspection, tracing, ctypes, memory writes, changing pytest, registering
plugins) and reports it on the channel. `read_channel` reads it: a violation, a channel out of
order, a process that left before pytest's end or exited otherwise than pytest said, is
`unresolved` and flagged. Other runners' output is read with SWE-bench's log parser for the
repository (`orchard.recipes.swe.specs`), which a test's own output can imitate; there,
`Grade.suspicious` still lists what in the patch reaches for the test run (`TaskInfra.suspicious`),
without deciding the outcome (the heuristics also flag honest fixes).

Every way of not resolving is an outcome, never an exception: `empty_patch`, `patch_failed` (it
does not apply, or it is refused), `unresolved` (tests ran), `timeout` (the tests hung), `error`
(the test patch does not apply, the sandbox died, the image could not be built: the task or the
machine is at fault, not the patch).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import posixpath
import re
import secrets
import shlex
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from orchard.errors import InvalidRequest, OrchardError
from orchard.recipes.swe import pytest_runner, specs
from orchard.recipes.swe.infra import TaskInfra
from orchard.tasks.base import Grade as BaseGrade
from orchard.tasks.base import task_sandbox

if TYPE_CHECKING:
    from orchard.env.client import Client, Sandbox
    from orchard.recipes.swe.task import SWETask

TestStatus = Literal["PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS", "MISSING"]

PATCH_FILE = "/tmp/orchard-model.patch"
TEST_PATCH_FILE = "/tmp/orchard-test.patch"
DEFAULT_TEST_TIMEOUT = 900.0
GRADING_NETWORK = "dropped"
"""Tests run with no network, as on one that drops packets: a test expecting a connect timeout
(requests' `TestTimeout`) gets one, instead of the immediate failure a `blocked` sandbox gives."""
INSTALL_OUTPUT = ">>>>> Install Output"
START_TEST_OUTPUT = ">>>>> Start Test Output"
END_TEST_OUTPUT = ">>>>> End Test Output"
"""Markers in a grade's log, as in SWE-bench's: what reinstalling printed, then the tests' output."""
GIT = (
    "GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null "
    "git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c safe.directory='*' --literal-pathspecs"
)
"""Git as the grader runs it: no hook and no fsmonitor runs, whatever the tree holds, only the
repository's own configuration is read (`check_applied` proves the patch left it as the image has
it; `safe.directory`, which images set globally, is given here); paths are never patterns."""
TREE_BEFORE = "/tmp/orchard-tree.before"
_LISTING = "find . -printf '%y %i %s %m %C@ %p\\0' | LC_ALL=C sort -z"
"""Every entry of the working tree, `.git` included, with what any write changes (inode, size,
mode, change time: `patch` and `git` write a new file, and no applier can set a change time)."""
APPLY = (
    f"{_LISTING} > {TREE_BEFORE} && "
    f"{{ {GIT} apply --verbose {PATCH_FILE} || "
    f"patch --batch --unified --fuzz=5 -p1 --no-backup-if-mismatch --reject-file=- -i {PATCH_FILE}; }}"
)
"""`git apply`, else `patch` (GNU's refuses `..` and absolute names, but not `.git`, so both run
only on what `read_patch` let through); `--unified` keeps `patch` to the form `read_patch`
follows hunk by hunk, and never hands an ed script to `ed`. The tree is listed first, for
`check_applied`: nothing of the patch's has run yet."""
CHANGED = (
    f"{_LISTING} > {TREE_BEFORE}.after && LC_ALL=C comm -z -3 {TREE_BEFORE} {TREE_BEFORE}.after && "
    "printf 'LINKS\\0' && find . -path ./.git -prune -o -type l -printf '%P\\0%l\\0' && printf 'END\\0'"
)
"""What the appliers changed (entries in one listing and not the other), then every link in the
tree and its target. Only `find`, `sort` and `comm` run: nothing the patch could have written."""
RUNNER = Path(pytest_runner.__file__).read_text()
"""The runner pytest starts through (`orchard.recipes.swe.pytest_runner`): the working tree last on
`sys.path`, the standard modules pytest imports late imported first, and each test's result sent
over the channel on fd 3, sealed against the code under test."""
CHANNEL = "3>&1 1>&2"
"""The runner's fd 3 is the command's stdout; everything else the command prints goes to stderr."""
STATUS_RANK = {"PASSED": 0, "XFAIL": 1, "SKIPPED": 2, "XPASS": 3, "FAILED": 4, "ERROR": 5}
_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
MAX_NAME = 4096
MAX_SPACES = 64
"""A header's name is read as each of its first `MAX_SPACES` splits at a space, within `MAX_NAME`."""
_HEADER = re.compile(
    r"diff --git |(?:---|\+\+\+|\*\*\*)[ \t]|Index:|==== |rename (?:from|to|old|new) |copy (?:from|to) "
)
"""Lines that name files, to `git apply` or to `patch` (GNU or BSD)."""
_OLD_NAME = re.compile(r"^(?:---|\*\*\*)[ \t]")
_NEW_NAME = re.compile(r"^\+\+\+[ \t]")
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_RANGE = re.compile(r"^[\d,]+ (?:\*{4}|-{4})$")
_LEAD = re.compile(r"[ \tX]*(?:- )*")
"""What `patch` skips before a header: indentation, `X`, and RFC 934 dash escapes (`- --- name`)."""
_MODE = re.compile(r"(?:new file mode|new mode|old mode|deleted file mode|index [0-9a-fA-F]*\.\.[0-9a-fA-F]*) ")
_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


@dataclass
class Grade(BaseGrade):
    """The verdict on one patch for one task: the generic grade plus each test's status."""

    fail_to_pass: dict[str, list[str]] = field(default_factory=lambda: {"success": [], "failure": []})
    pass_to_pass: dict[str, list[str]] = field(default_factory=lambda: {"success": [], "failure": []})
    tests: dict[str, str] = field(default_factory=dict)


class PatchRefused(InvalidRequest):
    """A patch that could write outside the task's files: under .git, out of the tree, through a link."""


@dataclass
class PatchFiles:
    """What a patch touches, as read on this host before anything applies it."""

    paths: list[str]
    """Every path an applier could write or delete for it (a superset: each name in every form)."""
    added: dict[str, list[str]]
    """Each changed file's added lines."""


def read_patch(patch: str) -> PatchFiles:
    """The paths a patch touches and the lines it adds; `PatchRefused` when it may not be applied.

    Every line that either applier could take for a header is checked, inside hunks too (a name
    there is refused only when it is dangerous, and a harmless one only widens `paths`), read as
    `patch` reads it: past indentation, `X` and dash escapes. This is the first check, not the
    last: `check_applied` holds the appliers to these paths."""
    paths: list[str] = []
    sections: list[tuple[str, list[str], bool, bool]] = []  # (path, added lines, is a link, binary)
    path, added, link, binary, fresh = "", [], False, False, False
    old = new = indent = 0  # lines left in the current unified hunk, and its indentation
    for raw in patch.split("\n"):
        line = raw.removesuffix("\r")
        names = _names(line)
        for name in names:
            _check_name(name)
            paths += [p for p in (_clean(name), _clean(_strip(name))) if p and p not in paths]
        if old > 0 or new > 0:
            body = line[indent:] if not line[:indent].strip(" \tX") else line
            tag = body[:1]
            if tag in ("", " ", "-", "+", "\\"):
                old -= tag in ("", " ", "-")
                new -= tag in ("", " ", "+")
                if tag == "+":
                    added.append(body[1:])
                continue
            old = new = 0  # not a hunk line: the hunk is over (an applier calls it corrupt)
        head = line[_LEAD.match(line).end() :]  # type: ignore[union-attr]  # it matches the empty string
        hunk = _HUNK.match(head)
        starts = head.startswith("diff --git ") or (_OLD_NAME.match(head) and not fresh and not _RANGE.match(head[4:]))
        if hunk or head.startswith("***************"):
            old, new = (int(n) if n is not None else 1 for n in hunk.groups()) if hunk else (0, 0)
            indent, fresh = len(line) - len(line.lstrip(" \tX")), False
        elif starts:
            sections.append((path, added, link, binary))
            path, added, link, binary, fresh = _section_path(names), [], False, False, True
        elif _NEW_NAME.match(head) and names:
            path = _clean(_strip(names[0]))
        elif _makes_link(head):
            link = True
        elif head.startswith("GIT binary patch"):
            binary = True
        elif head.startswith(("+ ", "! ")):  # a context diff's new or changed line
            added.append(head[2:])
    sections.append((path, added, link, binary))
    changed: dict[str, list[str]] = {}
    for path, lines, is_link, is_binary in sections:
        if is_link:
            _check_link(path, lines, is_binary)
        if path:
            changed.setdefault(path, []).extend(lines)
    return PatchFiles(paths, changed)


def _makes_link(head: str) -> bool:
    """Whether a git header line gives a link's mode, as `git apply` reads it (`strtoul`: spaces,
    a sign, any number of octal digits: `0120000`) or `patch` does (spaces, six octal digits); a
    link whichever reads it so."""
    key = _MODE.match(head)
    if key is None:
        return False
    rest = head[key.end() :].lstrip(" \t\v\f")
    git = re.match(r"([+-]?)([0-7]*)", rest)
    value = int(git.group(2) or "0", 8) * (-1 if git.group(1) == "-" else 1)  # type: ignore[union-attr]
    six = rest[:6]
    modes = [value % (1 << 64), int(six, 8) if re.fullmatch(r"[0-7]{6}", six) else 0]
    return any(mode & 0o170000 == 0o120000 for mode in modes)


def _names(line: str) -> list[str]:
    """Every name a header line could carry, as `git apply` or `patch` may read it (indented too:
    `patch` takes an indented patch; with or without the `a/` part). Not a header: none."""
    text = line[_LEAD.match(line).end() :]  # type: ignore[union-attr]
    key = _HEADER.match(text)
    if key is None:
        return []
    rest = text[key.end() :].strip(" \t") if key.group().startswith(("Index:", "====")) else text[key.end() :]
    rest = rest[:MAX_NAME]  # no system opens a longer path
    if key.group().startswith("diff"):
        words = [w for w in rest.split(" ", MAX_SPACES) if w]
        halves = [" ".join(words[:i]) for i in range(1, len(words))] + [" ".join(words[i:]) for i in range(len(words))]
        names = [*_quoted(rest), *words, *halves]
    elif rest.lstrip().startswith('"'):
        names = _quoted(rest)
    else:
        name = rest.lstrip(" ").split("\t", 1)[0]
        words = name.split(" ", MAX_SPACES)
        names = [name, *(" ".join(words[:i]) for i in range(1, len(words)))]
    return [n for n in (_unquote(n) for n in names) if n and n != "/dev/null"]


def _quoted(text: str) -> list[str]:
    return re.findall(r'"(?:[^"\\]|\\.)*"', text)


def _unquote(name: str) -> str:
    """Git's C-style quoting undone (`"a/\\303\\251"`); other names as they are."""
    if not (len(name) >= 2 and name.startswith('"') and name.endswith('"')):
        return name
    out, body, i = bytearray(), name[1:-1], 0
    while i < len(body):
        char = body[i]
        if char == "\\" and i + 1 < len(body):
            octal = re.match(r"[0-7]{1,3}", body[i + 1 :])
            if octal:
                out.append(int(octal.group(), 8) & 0xFF)
                i += 1 + len(octal.group())
                continue
            out.append(_ESCAPES.get(body[i + 1], ord(body[i + 1])))
            i += 2
            continue
        out += char.encode()
        i += 1
    return out.decode("utf-8", "replace")


def _check_name(name: str) -> None:
    parts = name.split("/")
    if any(ord(char) < 32 for char in name):
        raise PatchRefused(f"the patch names a file with a control character ({name!r})")
    if name.startswith("/") and name != "/dev/null":
        raise PatchRefused(f"the patch writes {name}, an absolute path")
    if ".." in parts:
        raise PatchRefused(f"the patch writes {name}, outside the working tree")
    if any(p.lower().rstrip(". ") in (".git", "git~1") for p in parts):
        raise PatchRefused(f"the patch writes {name}, inside .git")


def _strip(name: str) -> str:
    """The name with its first part gone, as `-p1` takes it (`a/x.py` -> `x.py`)."""
    return name.split("/", 1)[1] if "/" in name else name


def _clean(name: str) -> str:
    path = posixpath.normpath(name) if name and name != "/dev/null" else ""
    return "" if path in (".", "") else path.lstrip("/")


def _section_path(names: list[str]) -> str:
    """The new file's path from a section's first header (`+++` may still override it)."""
    names = [n for n in names if " " not in n] or names
    return _clean(_strip(names[-1])) if names else ""


def _check_link(path: str, lines: list[str], binary: bool) -> None:
    if binary or len(lines) != 1:
        raise PatchRefused(f"the patch makes {path} a link whose target cannot be read")
    target = lines[0]
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
        raise PatchRefused(f"the patch makes {path} a link out of the working tree ({target})")
    if any(p.lower().rstrip(". ") in (".git", "git~1") for p in resolved.split("/")):
        raise PatchRefused(f"the patch makes {path} a link into .git ({target})")


def touched_files(diff: str) -> list[str]:
    """The files a unified git diff changes (both sides of a rename); for the task's own diffs."""
    files: list[str] = []
    for a, b in _DIFF_FILE.findall(diff):
        for path in (a, b):
            if path not in files:
                files.append(path)
    return files


def test_command(task: SWETask) -> str:
    """The command that runs the task's tests as SWE-bench does (its `test_cmd`, then the test
    directives): the one place that decides how tests run (`_run_tests` is where they are read).
    pytest, whether named as a script or as `python -m pytest`, starts through `RUNNER`."""
    env = task.environment()
    directives = " ".join(shlex.quote(d) for d in task.directives)
    if env.parser is not None:
        return f"{env.test_cmd} {directives}"
    command = specs.PYTEST.sub(lambda m: f"{m['lead']}python3 -c {shlex.quote(RUNNER)}", env.test_cmd)
    return f"{command} {directives}"


@dataclass
class Channel:
    """What the runner sent: each test's status, how many tests had each, and what is wrong with it."""

    statuses: dict[str, str] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)
    ended: bool = False


def read_channel(text: str, exit_code: int | None, known: Sequence[str], key: str) -> Channel:
    """Each test's status from the runner's channel (`RUNNER`), for the ids in `known` (SWE-bench's
    ids, cut at the first space: `test_y[a` names `test_y[a b]`), and every sign that the process
    interfered with it: a record not signed with `key`, out of order, twice, after the end; a violation the
    runner refused; no end (the process left before pytest finished); an exit status other than
    pytest's. A phase maps to a status as pytest's own summary names it: a failed setup or
    teardown is ERROR, a failed call FAILED, a skip SKIPPED (XFAIL when expected to fail), a pass
    PASSED (XPASS when expected to fail); a test's status is the worst of its phases."""
    channel = Channel()
    wanted = set(known)
    phases: set[tuple[str, str]] = set()
    end: int | None = None
    for index, line in enumerate(text.splitlines()):
        payload, _, mac = line.encode().rpartition(b"\t")
        record = None
        if hmac.compare_digest(hmac.new(key.encode(), payload, "sha256").hexdigest().encode(), mac):
            with contextlib.suppress(ValueError):
                record = json.loads(payload)
        if not isinstance(record, dict) or record.get("n") != index:
            channel.problems.append(
                f"record {index} of the results channel is not the runner's (unsigned or out of order)"
            )
            break
        if end is not None:
            channel.problems.append("the results channel goes on after pytest's end")
            break
        if "violation" in record:
            channel.problems.append(f"the test process did what a graded run refuses: {str(record['violation'])[:200]}")
        elif "end" in record:
            end = record["end"] if isinstance(record["end"], int) else -1
        else:
            test, when = str(record.get("id", "")), str(record.get("when"))
            if (test, when) in phases:
                channel.problems.append(f"the results channel reports {test} ({when}) twice")
                break
            phases.add((test, when))
            status = _phase_status(when, record.get("outcome"), bool(record.get("xfail")))
            if status is None:
                continue
            channel.counts[status] += 1
            for name in {test, test.split(" ", 1)[0]} & wanted:
                old = channel.statuses.get(name, status)
                channel.statuses[name] = max(old, status, key=STATUS_RANK.__getitem__)
    channel.ended = end is not None
    if end is None and phases:
        channel.problems.append(f"the test process ended before pytest finished (it exited {exit_code})")
    elif end is not None and end != exit_code:
        channel.problems.append(f"the test process exited {exit_code} after pytest finished with {end}")
    elif end == 1 and not channel.counts["FAILED"] + channel.counts["ERROR"]:
        channel.problems.append("pytest exited 1, for failures, but no test failed")
    return channel


def _phase_status(when: object, outcome: object, xfail: bool) -> str | None:
    if outcome == "failed":
        return "FAILED" if when == "call" else "ERROR"
    if outcome == "skipped":
        return "XFAIL" if xfail else "SKIPPED"
    if outcome == "passed" and when == "call":
        return "XPASS" if xfail else "PASSED"
    return None


def grade_in(box: Sandbox, task: SWETask, patch: str, *, timeout: float = DEFAULT_TEST_TIMEOUT) -> Grade:
    """Grade `patch` in `box`, a fresh sandbox of the task's image (it is left as the tests left it)."""
    started = time.monotonic()
    grade = Grade(task.instance_id, "unresolved")
    try:
        _grade(box, task, patch, timeout, grade)
    except OrchardError as exc:  # the sandbox died, the agent went away, ...
        grade.outcome, grade.error = "error", f"grading failed: {exc}"
    grade.score = 1.0 if grade.resolved else 0.0
    grade.duration = time.monotonic() - started
    return grade


def _grade(box: Sandbox, task: SWETask, patch: str, timeout: float, grade: Grade) -> None:
    cwd = task.workdir
    if not patch.strip():
        grade.outcome, grade.error = "empty_patch", "the patch is empty"
        return
    try:
        files = read_patch(patch)
    except PatchRefused as exc:
        grade.outcome, grade.error = "patch_failed", f"the patch is refused: {exc}"
        return
    judge = TaskInfra.of(task.environment().test_cmd, touched_files(task.patch))
    grade.suspicious = judge.suspicious(files.added)
    box.write_file(PATCH_FILE, patch if patch.endswith("\n") else patch + "\n")
    applied = box.exec(APPLY, cwd=cwd, timeout=120)
    if applied.exit_code != 0:
        grade.outcome, grade.error = "patch_failed", "the patch does not apply"
        grade.log = applied.stdout + applied.stderr
        return
    try:
        check_applied(box, cwd, files.paths)
    except PatchRefused as exc:
        grade.outcome, grade.error = "patch_failed", f"the patch is refused: {exc}"
        return
    reset = [_reset(path, task.base_commit) for path in files.paths if path in judge]
    if reset:
        done = box.exec('set -e\nroot="$(pwd -P)"\n' + "\n".join(reset), cwd=cwd, timeout=120)
        if done.exit_code != 0:
            grade.outcome, grade.error = "error", "the test infrastructure could not be reset to base_commit"
            grade.fault = "task"
            grade.log = done.stdout + done.stderr
            return
    if _setup_tests(box, task, grade):
        _run_tests(box, task, timeout, grade, reinstall=needs_reinstall(task, files.paths))


def _setup_tests(box: Sandbox, task: SWETask, grade: Grade) -> bool:
    """Reset the files the test patch touches to `base_commit` and apply it; False (an `error`
    grade) when it does not apply: the task is broken."""
    if not task.test_patch.strip():
        return True
    box.write_file(TEST_PATCH_FILE, task.test_patch if task.test_patch.endswith("\n") else task.test_patch + "\n")
    setup = ['root="$(pwd -P)"', *(_reset(path, task.base_commit) for path in touched_files(task.test_patch))]
    setup.append(f"{GIT} apply --verbose {TEST_PATCH_FILE}")
    done = box.exec("\n".join(setup), cwd=task.workdir, timeout=120)
    if done.exit_code != 0:
        grade.outcome, grade.error = "error", "the task's test patch does not apply (the task is broken)"
        grade.fault = "task"
        grade.log = done.stdout + done.stderr
        return False
    return True


def check_applied(box: Sandbox, cwd: str, paths: Sequence[str]) -> None:
    """`PatchRefused` unless what the appliers changed in the tree is what `read_patch` read:
    nothing under `.git`, no path but `paths` (and the folders above them), no new or changed link
    out of the tree or into `.git`. Whatever `read_patch` missed in a patch (a header form, a mode
    spelling, a write through a link in the tree) stops here, before any `git` reads the tree."""
    records = box.exec(CHANGED, cwd=cwd, timeout=120).stdout.split("\0")
    if records[-2:] != ["END", ""] or "LINKS" not in records:
        raise PatchRefused("what the patch changed could not be listed")
    split = records.index("LINKS")
    allowed = {"."}  # each path and the folders above it, as `find` names them
    for declared in paths:
        entry = f"./{declared}"
        while entry not in allowed:
            allowed.add(entry)
            entry = posixpath.dirname(entry)
    changed = set()
    for record in records[:split]:
        path = record.lstrip("\t").split(" ", 5)[-1]
        if path not in allowed:
            raise PatchRefused(f"the patch changed {path.removeprefix('./')}, which it does not declare")
        changed.add(path.removeprefix("./"))
    links = records[split + 1 : -2]
    for path, target in zip(links[0::2], links[1::2], strict=False):
        if path in changed:
            _check_link(path, [target], False)


def _reset(path: str, base_commit: str) -> str:
    """Shell: `path` as `base_commit` has it, or gone where it has none; untouched where a link
    lies above it (what a write through that link changed has its own path, and `check_applied`
    made sure the patch declares it). `$root` is the tree's physical path."""
    quoted, parent = shlex.quote(path), posixpath.dirname(path)
    guard = f'[ "$(realpath -m -- {shlex.quote(parent)})" = "$root"/{shlex.quote(parent)} ] && ' if parent else ""
    return (
        f"if {guard}{GIT} cat-file -e {base_commit}:{quoted} 2>/dev/null; "
        f"then {GIT} checkout -q {base_commit} -- {quoted}; "
        f"elif {guard}true; then rm -rf -- {quoted}; fi"
    )


FORGET_COMPILED = (
    r"find . -path ./.git -prune -o \( -name __pycache__ -type d -o -name '*.py[co]' \) -exec rm -rf -- {} +"
)
"""Compiled files planted in the tree are never read: deleted before the tests run. (Not a cache
prefix outside the tree: that recompiles pytest and the standard library at every grade, ~0.7 s.)"""


def needs_reinstall(task: SWETask, paths: Sequence[str]) -> bool:
    """Whether the repository's `install` must run again before the tests, as SWE-bench's evaluation
    script always runs it: when it copies the package (`pip install .`), or the patch touches
    `setup.py`. An editable install already sees the patched source, and sparing the run keeps the
    patch's setup code from running with write access to the environment before the tests."""
    install = task.environment().install
    editable = all(re.search(r"(?:^|\s)(?:-e|--editable)(?:\s|=)", command) for command in install)
    return bool(install) and (not editable or any(posixpath.basename(p) == "setup.py" for p in paths))


def _run_tests(box: Sandbox, task: SWETask, timeout: float, grade: Grade, *, reinstall: bool = False) -> None:
    """Run the task's tests as SWE-bench's evaluation script does (its `eval_commands`, `install`
    again where `needs_reinstall` says so, then the test command) and read each test's status:
    from what the sealed pytest runner sent (`read_channel`; any sign of interference is
    `unresolved`), else with SWE-bench's log parser for the repository. SWE-bench's rule decides:
    PASSED and XFAIL pass, FAILED, ERROR and missing fail, SKIPPED and XPASS do neither. No test
    found at all is `error` (`checks["tests_found"]` is False; `grade_patch` then asks whether the
    patch did it)."""
    env = task.environment()
    parse = specs.log_parser(env.parser) if env.parser is not None else None
    if env.parser is not None and parse is None:
        grade.outcome = "error"
        grade.error = f"{task.repo}'s test command is not pytest and SWE-bench has no log parser for it"
        grade.fault = "task"
        return
    prelude = "\n".join([specs.CONDA_ACTIVATE, *env.eval_commands])
    if reinstall:
        setup = box.exec(prelude + "\n" + "\n".join(env.install), cwd=task.workdir, timeout=timeout)
        grade.log += f"{INSTALL_OUTPUT}\n{setup.stdout}{setup.stderr}"
        if setup.timed_out:
            grade.outcome, grade.error = "timeout", f"installing the repository took longer than {timeout:g} s"
            return
    redirect = "2>&1" if parse is not None else CHANNEL
    key = secrets.token_hex(32)
    if parse is None:  # the runner reads it, and deletes it, before the tree is imported
        box.write_file(pytest_runner.KEY_FILE, key + "\n" + json.dumps(task.tests))
    command = f"{FORGET_COMPILED} && {{\n{prelude}\n{test_command(task)}\n}} {redirect}"
    run = box.exec(command, cwd=task.workdir, timeout=timeout)
    output = run.stdout + run.stderr if parse is not None else run.stderr
    grade.log += f"{START_TEST_OUTPUT}\n{output}\n{END_TEST_OUTPUT}\n"
    if run.timed_out:
        grade.outcome, grade.error = "timeout", f"the tests ran longer than {timeout:g} s"
        return
    if parse is None:
        channel = read_channel(run.stdout, run.exit_code, task.tests, key)
        seen, counts = channel.statuses, channel.counts
        problems = channel.problems
    else:
        parsed = parse(output)
        seen, counts = {t: parsed[t] for t in task.tests if t in parsed}, Counter(parsed.values())
        problems = []
    for names, bucket in ((task.fail_to_pass, grade.fail_to_pass), (task.pass_to_pass, grade.pass_to_pass)):
        for name in names:
            grade.tests[name] = status = seen.get(name, "MISSING")
            if specs.passed(status):
                bucket["success"].append(name)
            elif specs.failed(status):
                bucket["failure"].append(name)
    grade.checks["tests_found"] = sum(counts.values()) > 0
    if problems:  # the test process interfered with its runner: whatever it reported, not resolved
        grade.outcome, grade.error = "unresolved", problems[0]
        grade.suspicious += problems
        return
    if not grade.checks["tests_found"]:
        grade.outcome = "error"
        grade.error = f"no test ran: the test command found none (it exited {run.exit_code})"
        return
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
        with task_sandbox(client, task, image, network=GRADING_NETWORK) as box:
            grade = grade_in(box, task, patch, timeout=timeout)
    except OrchardError as exc:
        grade = Grade(task.instance_id, "error", error=f"could not start the task's sandbox: {exc}")
    if grade.outcome == "error" and grade.checks.get("tests_found") is False:
        baseline = Grade(task.instance_id, "unresolved")
        try:
            with task_sandbox(client, task, image, network=GRADING_NETWORK) as box:
                if _setup_tests(box, task, baseline):
                    _run_tests(box, task, timeout, baseline)
        except OrchardError as exc:
            baseline.outcome, baseline.error, baseline.fault = "error", str(exc), "machine"
        if baseline.checks.get("tests_found"):
            grade.outcome = "unresolved"
            grade.error = "with the patch no test ran (without it they do): the patch breaks the test run"
        elif baseline.fault != "machine":
            grade.error = "no test ran, with the patch or without it: the task or its image is broken"
            grade.fault = "task"
    grade.duration = time.monotonic() - started
    return grade
