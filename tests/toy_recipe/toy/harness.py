"""The `line` harness: each reply is one shell command, or `DONE` to submit."""

from __future__ import annotations

from typing import Any

from orchard.agents.base import Action, FormatError, Reply, Step, run_shell, task_text


class LineHarness:
    name = "line"

    def system_prompt(self, task: dict[str, Any]) -> str:
        return "Reply with one shell command per message, nothing else; reply DONE when the task is done."

    def task_prompt(self, task: dict[str, Any]) -> str:
        return task_text(task)

    def tools(self) -> list[dict[str, Any]] | None:
        return None

    def parse(self, reply: Reply) -> list[Action]:
        lines = [line for line in (reply.content or "").strip().splitlines() if line.strip()]
        if len(lines) != 1:
            raise FormatError(f"your reply has {len(lines)} lines; send exactly one command, or DONE")
        return [Action("submit")] if lines[0].strip() == "DONE" else [Action("bash", {"command": lines[0]})]

    def execute(self, action: Action, box: Any, workdir: str) -> str:
        return run_shell(box, action.arguments["command"], workdir, timeout=30)

    def observation_messages(self, action: Action, observation: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": observation}]

    def format_error_messages(self, reply: Reply, error: FormatError) -> list[dict[str, Any]]:
        return [{"role": "user", "content": f"Format error: {error}"}]

    def encode(self, step: Step, index: int) -> Reply:
        return Reply(content="DONE" if step.kind == "submit" else step.command)
