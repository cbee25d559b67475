"""The `wordcount` kind: how many words does a file of the image hold? The answer goes in a file."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, ClassVar

from orchard.errors import OrchardError
from orchard.tasks.base import Grade, Prepare, Step, TaskBase

if TYPE_CHECKING:
    from orchard.env.client import Client, Sandbox


class WordCountTask(TaskBase):
    """Count the words of `/data/<file>`; graded by the number in `answer.txt`."""

    harnesses: ClassVar[tuple[str, ...]] = ("line",)

    kind: str = "wordcount"
    file: str
    words: int
    """The answer (hidden from the agent: not in `public`)."""

    def sandbox_image(self, prepare: Prepare) -> str:
        from toy.image import build_image

        return build_image()

    def start(self, box: Sandbox) -> None:
        box.exec(f"mkdir -p {shlex.quote(self.workdir)}")
        super().start(box)

    def submission(self, box: Sandbox) -> str:
        try:
            return box.read_file(f"{self.workdir}/answer.txt", max_bytes=64).decode(errors="replace")
        except OrchardError:
            return ""

    def grade(self, client: Client, submission: str, image: str) -> Grade:
        right = submission.strip() == str(self.words)
        return Grade(self.instance_id, "resolved" if right else "unresolved", score=float(right))

    def script(self, name: str) -> list[Step]:
        if name != "gold":
            return super().script(name)
        count = f"wc -w < /data/{self.file} > answer.txt"
        return [Step("bash", command=count, thought="Count the words."), Step("submit", thought="Done.")]
