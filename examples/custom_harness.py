"""A harness of your own, in one file: commands in XML tags instead of fenced blocks.

    orchard eval --tasks examples/tasks/tasks.jsonl --repos DIR \\
        --model scripted:gold --harness examples/custom_harness.py:XmlHarness

A harness says what the model is told (`system_prompt`, `task_prompt`, `tools`), how a reply
becomes actions (`parse`, raising `FormatError` for the model to see), how an action runs in the
sandbox (`execute`), how results go back (`observation_messages`, `format_error_messages`), and
how a harness-neutral `Step` is written in its format (`encode`, which lets the scripted model play
it). Everything else (limits, storage, grading) is the agent loop's.
"""

from __future__ import annotations

import re
from typing import Any

from orchard.agents.base import Action, FormatError, Reply, Step, run_shell, task_text

_COMMAND = re.compile(r"<command>(.*?)</command>", re.DOTALL)


class XmlHarness:
    name = "xml"

    def system_prompt(self, task: dict[str, Any]) -> str:
        return (
            "You fix issues in repositories. Reply with one shell command inside <command></command> "
            "tags; its output comes back in <observation> tags. Reply <command>submit</command> when done."
        )

    def task_prompt(self, task: dict[str, Any]) -> str:
        return task_text(task)

    def tools(self) -> list[dict[str, Any]] | None:
        return None

    def parse(self, reply: Reply) -> list[Action]:
        commands = _COMMAND.findall(reply.content or "")
        if len(commands) != 1:
            raise FormatError(f"found {len(commands)} <command> tags; use exactly one")
        command = commands[0].strip()
        return [Action("submit")] if command == "submit" else [Action("bash", {"command": command})]

    def execute(self, action: Action, box, workdir: str) -> str:
        return run_shell(box, action.arguments["command"], workdir, timeout=120)

    def observation_messages(self, action: Action, observation: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"<observation>\n{observation}\n</observation>"}]

    def format_error_messages(self, reply: Reply, error: FormatError) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"Format error: {error}"}]

    def encode(self, step: Step, index: int) -> Reply:
        if step.kind == "submit":
            command = "submit"
        elif step.kind == "write":
            command = f"cat <<'EOF' > {step.path}\n{step.content}EOF"
        else:
            command = step.command
        return Reply(content=f"{step.thought}\n<command>{command}</command>")
