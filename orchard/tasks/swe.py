"""The SWE task: SWE-bench's schema, plus where the repository lives in its image.

Fields are SWE-bench's (`instance_id`, `repo`, `base_commit`, `problem_statement`, `patch`,
`test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS`, ...); the test lists may be JSON strings, as in
the published datasets. Orchard adds:

* `image`: a ready image that already holds the repository at `workdir` (SWE-bench's prebuilt
  instance images, say); without it, Orchard builds one offline from the base image, the
  repository at `base_commit` and `install`;
* `workdir`: where the repository is checked out (default `/testbed`, as in SWE-bench);
* `install`: shell commands run in the image after checkout (no network);
* `test_cmd`: the command the grader runs, with the test ids appended (default pytest, verbose
  enough to name every test's outcome).

Unknown fields are kept in `extra`, so a dataset round-trips.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_WORKDIR = "/testbed"
DEFAULT_TEST_CMD = "python3 -m pytest -rA -p no:cacheprovider --no-header -o addopts="
COMMIT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
INSTANCE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


class SWETask(BaseModel):
    """One repository issue to resolve, with the tests that decide whether it was."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")

    instance_id: str
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
    install: list[str] = Field(default_factory=list)
    test_cmd: str = DEFAULT_TEST_CMD

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
        return self.model_dump(by_alias=True, exclude_none=True)
