"""What harnesses, models and the agent loop share.

Messages are OpenAI chat messages (`role`, `content`, `tool_calls`, `tool_call_id`), so any
OpenAI-compatible server, a local chat template and the published trajectory format all speak
them. A harness decides the interface the model gets: its system prompt, its tool schemas (or
none: a text protocol), how a reply becomes actions, how an action runs in the sandbox and how
its observation is shown back. A harness can also write a reply in its own format from an
abstract `Step` (`encode`): that is how the scripted model plays any harness.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from orchard.tasks.base import Step

if TYPE_CHECKING:
    from orchard.env.client import Sandbox

Message = dict[str, Any]
"""An OpenAI chat message."""

Observation = str | list[dict[str, Any]]
"""What an action shows the model: text, or OpenAI content parts (`{"type": "text", "text": ...}`,
`{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}`), so a browser's
screenshots travel through the same loop, store and trajectory export as a shell's output."""

MAX_OBSERVATION = 10_000
"""Characters of one observation shown to the model (head and tail kept)."""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str
    """JSON text, as the OpenAI API carries it."""

    def message(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class Reply:
    """One model turn."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None

    def message(self) -> Message:
        message: Message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.message() for call in self.tool_calls]
        return message


@dataclass
class Action:
    """What the model asked for in one reply (or one of its tool calls)."""

    name: str
    """A tool name, `submit`, or the harness's own (`bash` for the text protocol)."""
    arguments: dict[str, Any] = field(default_factory=dict)
    call_id: str | None = None

    @property
    def is_submit(self) -> bool:
        return self.name == "submit"


class FormatError(Exception):
    """The reply could not be turned into actions; the message is shown to the model."""


class Harness(Protocol):
    """The interface a model works through. See `orchard/agents/bash.py` for a complete one."""

    name: str

    def system_prompt(self, task: dict[str, Any]) -> str: ...
    def task_prompt(self, task: dict[str, Any]) -> str: ...
    def tools(self) -> list[dict[str, Any]] | None: ...
    def parse(self, reply: Reply) -> list[Action]: ...
    def execute(self, action: Action, box: Sandbox, workdir: str) -> Observation: ...
    def observation_messages(self, action: Action, observation: Any) -> list[Message]: ...  # what `execute` returned
    def format_error_messages(self, reply: Reply, error: FormatError) -> list[Message]: ...
    def encode(self, step: Step, index: int) -> Reply: ...

    # Optional, for harnesses that show a live page (`orchard.recipes.gui.harnesses`); the loop asks with getattr:
    #   opening(box) -> list of content parts    added to the first user turn, after the task's start
    #   after_actions(box) -> list[Message]       after a turn's actions (a screenshot), unless it submitted
    #   keep_images: int | None                   the newest images kept in the model's context


class ToolCalling:
    """What every function-calling harness shares: an observation is the answer to its tool call,
    and a format error answers every tool call of the reply (the API wants each one answered
    before the next user message), or comes as a user message when the reply made none."""

    def observation_messages(self, action: Action, observation: str) -> list[Message]:
        return [{"role": "tool", "tool_call_id": action.call_id, "content": observation}]

    def format_error_messages(self, reply: Reply, error: FormatError) -> list[Message]:
        answers: list[Message] = [
            {"role": "tool", "tool_call_id": call.id, "content": f"Error: {error}"} for call in reply.tool_calls
        ]
        return answers or [{"role": "user", "content": f"Format error: {error}"}]


def clip(text: str, limit: int = MAX_OBSERVATION) -> str:
    """At most `limit` characters: head and tail around a marker."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters elided ...]\n{text[-half:]}"


def run_shell(box: Sandbox, command: str, workdir: str, timeout: float) -> str:
    """A shell command in the agent's persistent session; what a terminal would show."""
    result = box.exec(command, session="agent", timeout=timeout, cwd=None)
    output = result.stdout + result.stderr
    if result.timed_out:
        output += f"\n[the command timed out after {timeout:g} s and was killed; the shell was restarted in {workdir}]"
        box.exec(f"cd {shlex.quote(workdir)}", session="agent")
    elif result.exit_code not in (0, None):
        output += f"\n[exit code {result.exit_code}]"
    elif result.error:
        output += f"\n[{result.error}]"
    return clip(output) or "[no output]"


def write_file(box: Sandbox, path: str, content: str, workdir: str) -> str:
    absolute = path if path.startswith("/") else f"{workdir}/{path}"
    size = box.write_file(absolute, content)
    return f"wrote {size} bytes to {absolute}"


def json_arguments(call: ToolCall) -> dict[str, Any]:
    """The arguments of a tool call (FormatError when they are not a JSON object)."""
    try:
        arguments = json.loads(call.arguments or "{}")
    except (ValueError, RecursionError):  # RecursionError: nested too deep to parse
        raise FormatError(f"the arguments of {call.name} are not valid JSON: {call.arguments[:200]!r}") from None
    if not isinstance(arguments, dict):
        raise FormatError(f"the arguments of {call.name} must be a JSON object")
    return arguments


def task_text(task: dict[str, Any]) -> str:
    """The task as the first user turn: its kind's `prompt()`, which the loop adds to the public view
    (a bare public view, without it, shows its problem statement)."""
    return str(task.get("prompt") or task["problem_statement"])


IMAGE_CHARS = 4000
"""What one image counts as in a rough count of a conversation's size (about 1000 tokens: a
1280x1000 screenshot, as vision models tile it)."""


def content_chars(content: Any) -> int:
    """A message content's size in characters, an image counted as `IMAGE_CHARS` (not its base64)."""
    if isinstance(content, list):
        return sum(IMAGE_CHARS if p.get("type") == "image_url" else len(str(p.get("text", ""))) for p in content)
    return len(str(content or ""))


def observation_text(observation: Observation) -> str:
    """The text of an observation; images are named, not inlined (the store keeps the messages whole)."""
    if isinstance(observation, str):
        return observation
    return "\n".join(
        str(part.get("text", "")) if part.get("type") == "text" else f"[{part.get('type', 'part')}]"
        for part in observation
    )
