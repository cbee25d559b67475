"""A task kind in one file: make files' SHA-256 checksums equal the given ones.

The smallest complete kind, to copy from. A task names files and the checksum each must have; the
agent works in a plain sandbox of the base image, and what it submits is each file's bytes (read
out of the sandbox, base64 in a JSON object). The grader hashes those bytes itself: a submission
is untrusted, so one that merely claims the right checksums (a predictions file can say anything)
gets nothing. The grade is the share of files that match (a kind that grades with scores): it
passes when all do, and that share after each step is the progress that credit by replay
measures. `scripted:gold` writes each file's known solution; `scripted:regress` writes them and
then puts the initial contents back; `--predictions gold` grades the solution itself.

Use it from a task file with `"kind": "checksum.py:ChecksumTask"` (a path relative to the task
file), or register it: `orchard.tasks.kinds.KINDS["checksum"] = "path/to/checksum.py:ChecksumTask"`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import posixpath
import shlex
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field, field_validator

from orchard.config import BASE_IMAGE
from orchard.errors import ImageNotFound, OrchardError
from orchard.tasks.base import Grade, Metric, Prepare, Step, TaskBase

if TYPE_CHECKING:
    from orchard.env.client import Client, Sandbox

MAX_FILE = 1 << 20


class ChecksumTask(TaskBase):
    """Files to write, each judged by its SHA-256."""

    metric: ClassVar[Metric] = "score"
    kind: str = "checksum"
    files: dict[str, str] = Field(min_length=1, description="relative path -> the SHA-256 (hex) its content must have")
    initial: dict[str, str] = Field(default_factory=dict, description="relative path -> its content at the start")
    solution: dict[str, str] = Field(
        default_factory=dict, description="relative path -> a content that matches (hidden)"
    )

    @field_validator("files", "initial", "solution")
    @classmethod
    def _relative(cls, value: dict[str, str]) -> dict[str, str]:
        for path in value:
            if path.startswith("/") or ".." in path.split("/"):
                raise ValueError(f"{path!r} must be a path inside the working folder")
        return value

    @field_validator("files")
    @classmethod
    def _checksums(cls, value: dict[str, str]) -> dict[str, str]:
        return {path: wanted.lower() for path, wanted in value.items()}

    def public(self) -> dict[str, Any]:
        return {**super().public(), "files": self.files}

    def sandbox_image(self, prepare: Prepare) -> str:
        from orchard.env.images import image_exists

        if not image_exists(BASE_IMAGE):
            raise ImageNotFound(f"base image {BASE_IMAGE} is missing: run `orchard image build-base`")
        return BASE_IMAGE

    def start(self, box: Sandbox) -> None:
        box.exec(f"mkdir -p {shlex.quote(self.workdir)}")
        for path, content in self.initial.items():
            box.write_file(posixpath.join(self.workdir, path), content)
        super().start(box)

    def submission(self, box: Sandbox) -> str:
        """Each file's bytes (null where it cannot be read, or is over `MAX_FILE`), as JSON."""
        contents: dict[str, str | None] = {}
        for path in self.files:
            try:
                data = box.read_file(posixpath.join(self.workdir, path), max_bytes=MAX_FILE)
                contents[path] = base64.b64encode(data).decode()
            except OrchardError:
                contents[path] = None
        return json.dumps(contents)

    def gold(self) -> str:
        return json.dumps({path: base64.b64encode(c.encode()).decode() for path, c in self.solution.items()})

    def grade(self, client: Client, submission: str, image: str) -> Grade:
        try:
            contents = json.loads(submission) if submission.strip() else {}
        except ValueError:
            return Grade(self.instance_id, "unresolved", error="the submission is not JSON")
        if not isinstance(contents, dict):
            return Grade(self.instance_id, "unresolved", error="the submission is not a JSON object")
        checks = {path: _sha256(contents.get(path)) == wanted for path, wanted in self.files.items()}
        score = sum(checks.values()) / len(checks)
        return Grade(self.instance_id, "resolved" if score == 1 else "unresolved", score=score, checks=checks)

    def script(self, name: str) -> list[Step]:
        if name not in ("gold", "regress"):
            return super().script(name)
        steps = [Step("bash", command="ls -la", thought="Let me see what is here.")]
        steps += [Step("write", path=p, content=c, thought=f"Writing {p}.") for p, c in self.solution.items()]
        if name == "regress":
            steps += [Step("write", path=p, content=self.initial.get(p, ""), thought="Undo.") for p in self.solution]
        return [*steps, Step("submit", thought="Done.")]


def _sha256(encoded: object) -> str | None:
    """The checksum of a submitted file's bytes (base64, at most `MAX_FILE`); None for anything else."""
    if not isinstance(encoded, str) or len(encoded) > 2 * MAX_FILE:
        return None
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    return hashlib.sha256(data).hexdigest() if len(data) <= MAX_FILE else None
