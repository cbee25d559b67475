"""`bash`: one shell command per turn in a fenced block, a sentinel to submit (mini-swe-agent's way).

No tool schemas at all: the model writes a thought and exactly one ```bash block; the output comes
back as the next user message. The command `submit` (or mini-swe-agent's
`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`) ends the episode. This file is also the example of
a complete harness: copy it to write your own.
"""

from __future__ import annotations

import re
import shlex
from typing import TYPE_CHECKING, Any

from orchard.agents.base import Action, FormatError, Message, Reply, Step, run_shell, task_text

if TYPE_CHECKING:
    from orchard.env.client import Sandbox

SENTINELS = ("submit", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
_BLOCK = re.compile(r"(`{3,})(?:bash|sh)[ \t]*\n(.*?)\n?\1(?!`)", re.DOTALL)
"""A fenced block; as in CommonMark, a longer fence may hold lines with three backticks."""

SYSTEM = """You are a software engineer fixing an issue in a repository, working in a Linux shell.
Every reply has a short thought, then exactly one shell command in a fenced block:

```bash
grep -rn "def parse" src/
```

The command runs in a persistent bash session (cd and variables carry over), and you see its
output in the next message. Commands are not interactive: no editors, no pagers. Edit files with
sed, cat <<'EOF' > file, python3 -c, or patch. When the fix is done and checked, reply with:

```bash
submit
```"""


class BashHarness:
    name = "bash"
    command_timeout = 120.0

    def system_prompt(self, task: dict[str, Any]) -> str:
        return SYSTEM

    def task_prompt(self, task: dict[str, Any]) -> str:
        return task_text(task)

    def tools(self) -> list[dict[str, Any]] | None:
        return None

    def parse(self, reply: Reply) -> list[Action]:
        blocks = [body for _fence, body in _BLOCK.findall(reply.content or "")]
        if len(blocks) != 1:
            raise FormatError(
                f"found {len(blocks)} ```bash blocks; reply with a thought and exactly one ```bash block "
                "(`submit` in it when you are done)"
            )
        command = blocks[0].strip()
        if command in SENTINELS:
            return [Action("submit")]
        if not command:
            raise FormatError("the ```bash block is empty")
        return [Action("bash", {"command": command})]

    def execute(self, action: Action, box: Sandbox, workdir: str) -> str:
        return run_shell(box, action.arguments["command"], workdir, self.command_timeout)

    def observation_messages(self, action: Action, observation: str) -> list[Message]:
        return [{"role": "user", "content": f"<output>\n{observation}\n</output>"}]

    def format_error_messages(self, reply: Reply, error: FormatError) -> list[Message]:
        return [{"role": "user", "content": f"Format error: {error}"}]

    def encode(self, step: Step, index: int) -> Reply:
        thought = step.thought or "Next step."
        if step.kind == "submit":
            command = "submit"
        elif step.kind == "write":
            content = step.content if step.content.endswith("\n") else step.content + "\n"
            command = f"cat <<'ORCHARD_EOF' > {shlex.quote(step.path)}\n{content}ORCHARD_EOF"
        else:
            command = step.command
        fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", command)), default=0))
        return Reply(content=f"{thought}\n\n{fence}bash\n{command}\n{fence}")
