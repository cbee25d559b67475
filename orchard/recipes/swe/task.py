"""The SWE task kind: SWE-bench's schema, run as SWE-bench runs it.

Fields are SWE-bench's (`instance_id`, `repo`, `base_commit`, `problem_statement`, `patch`,
`test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS`, `version`, `environment_setup_commit`, ...), exactly as
the published datasets ship them: the test lists may be JSON strings, and `None` in an optional
field means its default. How a task's image is made and its tests run is SWE-bench's spec for its
repository and version (`orchard.recipes.swe.specs`, from the `swebench` package); a row may override it
field by field:

* `image`: a ready image that already holds the repository at `workdir` (SWE-bench's prebuilt
  instance images, say); without it, Orchard builds one offline (`orchard.recipes.swe.environments`);
* `python`: the Python version the image needs (`3.9`);
* `install`: shell commands that install the repository (no network at build time);
* `test_cmd`: the command the grader runs, with the test directives appended;
* `workdir`: where the repository is checked out (default `/testbed`, as in SWE-bench).

Rows of repositories SWE-bench has no spec for run `python3 -m pytest -rA` on the test files.
Unknown fields are kept in `extra`, so a dataset round-trips.

An attempt's submission is the working tree's diff (`working_tree_patch`), graded by the task's
tests in a fresh sandbox (`orchard.recipes.swe.grading`); progress mid-episode is the share of
FAIL_TO_PASS tests a diff makes pass. `scripted:gold` plays `gold_script`: look around, apply the
gold patch, check, submit.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, field_validator, model_validator

from orchard.errors import OrchardError
from orchard.recipes.swe import specs
from orchard.tasks.base import Prepare, Step, TaskBase

if TYPE_CHECKING:
    from orchard.env.client import Client, Sandbox
    from orchard.recipes.swe.grading import Grade
    from orchard.tasks.base import Grade as BaseGrade

DEFAULT_WORKDIR = "/testbed"
DEFAULT_TEST_CMD = "python3 -m pytest -rA -p no:cacheprovider"
"""The test command of a repository SWE-bench has no spec for (the row's `test_cmd` overrides it)."""
COMMIT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
INSTANCE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


class SWETask(TaskBase):
    """One repository issue to resolve, with the tests that decide whether it was."""

    submission_file: ClassVar[str] = "patch.diff"
    empty_submission_fails: ClassVar[bool] = True

    instance_id: str
    kind: str = "swe"
    repo: str = Field(description="owner/name")
    base_commit: str
    problem_statement: str
    patch: str = Field(default="", description="the gold patch (hidden from agents)")
    test_patch: str = ""
    fail_to_pass: list[str] = Field(default_factory=list, alias="FAIL_TO_PASS")
    pass_to_pass: list[str] = Field(default_factory=list, alias="PASS_TO_PASS")
    version: str | None = None
    environment_setup_commit: str | None = None
    hints_text: str = ""
    created_at: str | None = None
    image: str | None = None
    workdir: str = DEFAULT_WORKDIR
    python: str | None = None
    install: list[str] | None = None
    test_cmd: str | None = None

    @field_validator("instance_id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not INSTANCE_ID.match(value):
            raise ValueError(f"instance_id {value!r} must be letters, digits, '.', '_' or '-' (at most 200)")
        return value

    @field_validator("base_commit")
    @classmethod
    def _commit(cls, value: str) -> str:
        if not COMMIT.match(value):
            raise ValueError(f"base_commit {value!r} must be a commit id or ref (letters, digits, '._/-')")
        return value

    @field_validator("repo")
    @classmethod
    def _repo(cls, value: str) -> str:
        owner, slash, name = value.partition("/")
        if not (owner and slash and name) or "/" in name or ".." in value:
            raise ValueError(f"repo {value!r} must be 'owner/name'")
        return value

    @field_validator("fail_to_pass", "pass_to_pass", "install", mode="before")
    @classmethod
    def _list(cls, value: Any) -> Any:
        """SWE-bench's datasets store these lists as JSON strings."""
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else []
            except ValueError:
                raise ValueError("must be a list of strings or a JSON string of one") from None
        return value

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> Any:
        """A version is a string in the dataset; a table that read it as a number (`3.1`) is taken
        at its word (a CSV folder is read with the version kept as text: `3.10` stays `3.10`)."""
        return str(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value

    @field_validator("python")
    @classmethod
    def _python(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"3\.\d{1,2}", value):
            raise ValueError(f"python {value!r} must be a Python 3 version such as '3.9'")
        return value

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str) -> str:
        if not value.startswith("/") or value.rstrip("/") == "":
            raise ValueError(f"workdir {value!r} must be an absolute folder other than /")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _has_tests(self) -> SWETask:
        if not self.fail_to_pass:
            raise ValueError("FAIL_TO_PASS is empty: a task needs at least one test that the fix makes pass")
        return self

    def environment(self) -> specs.Environment:
        """How this task's image is made and its tests run: SWE-bench's spec for the repository
        and version, each of the row's `python`, `install` and `test_cmd` taking its place."""
        spec = specs.swebench_spec(self.repo, self.version) or {}
        packages = spec.get("packages") or ""
        commands = spec.get("test_cmd") or DEFAULT_TEST_CMD
        commands = [commands] if isinstance(commands, str) else list(commands)
        test_cmd = self.test_cmd or commands[-1]
        return specs.Environment(
            source=f"swebench {specs.SWEBENCH_VERSION} {self.repo} {self.version}" if spec else "row",
            python=self.python or spec.get("python"),
            requirements=tuple(specs.requirements_paths(self.repo)) if packages == "requirements.txt" else (),
            environment_yml=tuple(specs.environment_yml_paths(self.repo)) if packages == "environment.yml" else (),
            packages=() if packages in ("requirements.txt", "environment.yml") else tuple(shlex.split(packages)),
            pip_packages=tuple(spec.get("pip_packages") or ()),
            pre_install=tuple(spec.get("pre_install") or ()),
            install=tuple(
                self.install if self.install is not None else [spec["install"]] if spec.get("install") else []
            ),
            test_cmd=test_cmd,
            eval_commands=(*spec.get("eval_commands", ()), *commands[:-1]),
            parser=None if specs.is_pytest(test_cmd) else self.repo,
        )

    @property
    def directives(self) -> list[str]:
        """What follows the test command: the test files the test patch touches (Django labels for
        Django), as SWE-bench derives them. A row SWE-bench has no spec for also runs the files its
        test ids name (`tests/test_a.py::test_x`), as its PASS_TO_PASS may come from any file."""
        directives = specs.test_directives(self.repo, self.test_patch) if self.test_patch.strip() else []
        if specs.swebench_spec(self.repo, self.version) is None:
            directives += [test.split("::", 1)[0] for test in self.tests if "::" in test]
        return list(dict.fromkeys(directives))

    @property
    def tests(self) -> list[str]:
        """Every test the grader runs: FAIL_TO_PASS, then PASS_TO_PASS."""
        return [*self.fail_to_pass, *(t for t in self.pass_to_pass if t not in self.fail_to_pass)]

    @property
    def extra(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def public(self) -> dict[str, Any]:
        """What an agent may see: the issue, not the fix or the tests that judge it."""
        return {
            "instance_id": self.instance_id,
            "repo": self.repo,
            "problem_statement": self.problem_statement,
            "hints_text": self.hints_text,
            "workdir": self.workdir,
        }

    def record(self) -> dict[str, Any]:
        """The task as a SWE-bench-style dict (the aliases, extra fields included)."""
        return self.model_dump(by_alias=True, exclude_none=True, exclude={"kind"})

    def prompt(self) -> str:
        return (
            f"<issue>\n{self.problem_statement.strip()}\n</issue>\n\n"
            f"The repository {self.repo} is checked out at {self.workdir} (your shell starts there). "
            "Change the source code so that the issue is resolved; do not change the tests."
        )

    def sandbox_image(self, prepare: Prepare) -> str:
        from orchard.recipes.swe.environments import task_image

        return task_image(self, prepare.mirror(), source=prepare.image_source)

    def image_facts(self, image: str) -> dict[str, Any]:
        from orchard.recipes.swe.environments import LABEL_PREFIX, build_seconds, image_labels

        try:
            ran = image_labels(image).get(LABEL_PREFIX + "python")
        except OrchardError:
            ran = None
        asked = self.environment().python
        other = bool(asked and ran and ran.split(".")[:2] != asked.split(".")[:2])
        return {"build": build_seconds(image), "python": {"asked": asked, "ran": ran, "other": other}}

    def start(self, box: Sandbox) -> None:
        """The agent's shell starts in the repository, with the `testbed` conda env active in a
        prebuilt SWE-bench image (a no-op in Orchard's images), as the grader runs."""
        box.exec(f"cd {shlex.quote(self.workdir)} && {specs.CONDA_ACTIVATE}", session="agent")

    def submission(self, box: Sandbox) -> str:
        return working_tree_patch(box, self.workdir)

    def grade(self, client: Client, submission: str, image: str, *, timeout: float | None = None) -> Grade:
        from orchard.recipes.swe.environments import image_warnings
        from orchard.recipes.swe.grading import DEFAULT_TEST_TIMEOUT, grade_patch

        grade = grade_patch(client, self, submission, image, timeout=timeout or DEFAULT_TEST_TIMEOUT)
        try:  # the image is not what the task asked for (another Python, ...): said with every grade
            warnings = image_warnings(image)
        except OrchardError:
            warnings = []
        if warnings:
            grade.checks["warnings"] = warnings
        return grade

    def attempt_report(self, grade: BaseGrade, submission: str, details: dict[str, Any]) -> dict[str, Any]:
        """SWE-bench's per-instance `report.json`: did the patch exist, apply, resolve, and each
        FAIL_TO_PASS and PASS_TO_PASS test's fate (when the tests ran)."""
        tests: dict[str, str] = getattr(grade, "tests", {})
        applied = grade.outcome in ("resolved", "unresolved", "timeout") or bool(tests)
        report: dict[str, Any] = {
            "patch_is_None": bool(details.get("submission_none")),
            "patch_exists": bool(submission.strip()),
            "patch_successfully_applied": applied,
            "resolved": grade.resolved,
        }
        if applied:
            empty: dict[str, list[str]] = {"success": [], "failure": []}
            report["tests_status"] = {
                "FAIL_TO_PASS": getattr(grade, "fail_to_pass", empty),
                "PASS_TO_PASS": getattr(grade, "pass_to_pass", empty),
                "FAIL_TO_FAIL": empty,
                "PASS_TO_FAIL": empty,
            }
        return {grade.instance_id: report}

    def progress(self, client: Client, submission: str, image: str) -> float:
        """The share of FAIL_TO_PASS tests the submission makes pass."""
        if not submission.strip():
            return 0.0
        grade = self.grade(client, submission, image, timeout=PROGRESS_TEST_TIMEOUT)
        return len(grade.fail_to_pass["success"]) / max(1, len(self.fail_to_pass))

    def gold(self) -> str:
        return self.patch

    def script(self, name: str) -> list[Step]:
        if name == "gold":
            return gold_script(self)
        if name == "regress":
            return regressing_script(self)
        if name == "sed":
            return sed_script(self)
        return super().script(name)


PROGRESS_TEST_TIMEOUT = 300.0
"""Seconds the tests of one replayed state may run (credit by replay grades many states)."""

PATCH_SCRIPT = (
    'index="$(mktemp)" && cp "$(git rev-parse --git-path index)" "$index" 2>/dev/null; '
    'GIT_INDEX_FILE="$index" git -c core.hooksPath=/dev/null add -A && GIT_INDEX_FILE="$index" git '
    "-c core.hooksPath=/dev/null diff --cached --binary --no-color --no-ext-diff --no-textconv "
    "--src-prefix=a/ --dst-prefix=b/ HEAD; "
    'status=$?; rm -f "$index"; exit $status'
)
"""`git add -A && git diff --cached HEAD` on a copy of the index, so taking a diff changes nothing
the agent (or a replay) sees: staged state, `git checkout -- .` and `git stash` behave as before.
The options keep the diff plain whatever the repository's configuration says (no colour, no
external diff or textconv driver, the usual `a/` `b/` prefixes)."""


def working_tree_patch(box: Sandbox, workdir: str) -> str:
    """Everything changed in the repository, untracked files included, as one git diff.

    It is what the sandbox answers, so it is untrusted: the agent may have replaced `git` there
    and hand back any text. The grader reads every patch as such (`orchard.recipes.swe.grading`)."""
    try:
        result = box.exec(PATCH_SCRIPT, cwd=workdir, timeout=120)
    except OrchardError:
        return ""
    return result.stdout if result.exit_code == 0 else ""


def gold_script(task: SWETask) -> list[Step]:
    """Explore a little, apply the gold patch, look at the result, submit."""
    files = re.findall(r"^diff --git a/(\S+) b/", task.patch, re.MULTILINE)
    first = files[0] if files else "."
    patch = task.patch if task.patch.endswith("\n") else task.patch + "\n"
    return [
        Step("bash", command="git status --short && ls", thought="Let me look at the repository first."),
        Step("bash", command=f"sed -n '1,60p' {first}", thought=f"The issue points at {first}; reading it."),
        Step(
            "bash",
            command=f"git apply <<'ORCHARD_EOF'\n{patch}ORCHARD_EOF",
            thought="I see the problem; applying the fix.",
        ),
        Step("bash", command="git diff --stat", thought="Checking what changed."),
        Step("submit", thought="The fix is in place."),
    ]


def sed_script(task: SWETask) -> list[Step]:
    """The gold fix as a small model can learn to write it: list each changed file with every
    line's number after it (`LISTING`), say which line is wrong, copying its text and then its
    number (read forward, as a model copies best), change it with one `sed` line edit per changed
    stretch (`N,Mc\\`, `N,Md`, `Na\\`, `1i\\`: no patterns to escape), submit. Files a patch adds
    or deletes are no line edits: such a task wants `scripted:gold`."""
    steps = []
    for path, edits in _line_edits(task.patch):
        name = shlex.quote(path)
        steps.append(Step("bash", command=f"{LISTING} {name}", thought=f"The issue points at {path}; reading it."))
        script = " ".join(f"-e {shlex.quote(edit)}" for edit, _ in edits)
        wrong = "; ".join(note for _, note in edits)
        steps.append(Step("bash", command=f"sed -i {script} {name}", thought=f"In {path}, {wrong}."))
    return [*steps, Step("submit", thought="The fix is in place.")]


LISTING = """awk '{print $0 "  # " NR}'"""
"""A file's lines, each with its number after it."""


def _line_edits(patch: str) -> list[tuple[str, list[tuple[str, str]]]]:
    """Per file a patch changes: sed line edits (numbered by the old file) doing its changes, each
    with a note naming the line it is about."""
    files: list[tuple[str, list[tuple[str, str]]]] = []
    old, header, before = 0, True, ""
    removed: list[tuple[int, str]] = []
    added: list[str] = []

    def flush() -> None:
        if removed or added:
            text = "\\n".join(line.replace("\\", "\\\\") for line in added)
            first, last = removed[0][0] if removed else 0, removed[-1][0] if removed else 0
            span = f"{first},{last}" if last > first else f"{first}"
            if removed:
                edit = f"{span}c\\{text}" if added else f"{span}d"
                note = f"`{removed[0][1].strip()}` (line {first}) is wrong"
            else:  # lines added after line `old`; before the first line: `1i`
                edit = f"{old}a\\{text}" if old else f"1i\\{text}"
                note = f"something is missing after `{before.strip()}` (line {old})" if old else "the start is missing"
            files[-1][1].append((edit, note))
        removed.clear()
        added.clear()

    for line in patch.splitlines():
        if line.startswith("diff --git "):
            flush()
            files.append((line.split(" b/", 1)[1], []))
            header = True
        elif line.startswith("@@"):
            flush()
            old, header = int(line.split()[1].lstrip("-").split(",")[0]) - 1, False
        elif header:
            continue
        elif line.startswith("-"):
            if added and not removed:
                flush()
            old += 1
            removed.append((old, line[1:]))
        elif line.startswith("+"):
            added.append(line[1:])
        elif not line.startswith("\\"):  # context ("\\ No newline at end of file" is none)
            flush()
            old, before = old + 1, line[1:]
    flush()
    return files


def regressing_script(task: SWETask) -> list[Step]:
    """The gold script, except that the fix is thrown away before submitting: unresolved, with one
    productive stretch (the fix) for credit assignment to find."""
    steps = gold_script(task)
    undo = Step(
        "bash", command="git checkout -- . && git status --short", thought="Let me start over from a clean tree."
    )
    return [*steps[:-1], undo, steps[-1]]
