"""Three harnesses for personal-assistant tasks (the `claw` kind), with really different interfaces.

* `functions` (Claw-Eval's way): every endpoint of the task's services is a function tool of its
  own (`mail_send`, `calendar_list`, ...); the model sees the tools, never the endpoints. A reply
  without a tool call is the assistant's message to the user: its answer, or a question.
* `assistant` (OpenClaw's and ZeroClaw's way): a general assistant's few tools, `shell`,
  `read_file`, `write_file`, `http_request` (to the services by URL, as their short reference in
  the system prompt gives them) and `memory` (notes kept across its turns, in MEMORY.md); a reply
  without a tool call is again the message to the user.
* `react` (ReAct's text protocol): no function calling at all; the tools are described in the
  system prompt, and each reply is one `Action:` with its `Action Input:` JSON, or a `Final Answer:`.

Both reach the services inside the sandbox through the exec agent (`Sandbox.http`), never through
a host port. Both read the task's public view at `system_prompt`, which the loop asks for first:
its `tools` (`name`, `description`, `input_schema`, and the `url` on the sandbox's loopback that
serves it: a task's services may listen on several ports), the user's `address` and `now`.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from orchard.agents.base import (
    Action,
    FormatError,
    Message,
    Reply,
    Step,
    ToolCall,
    ToolCalling,
    clip,
    json_arguments,
    run_shell,
    task_text,
)
from orchard.errors import ConfigError, NotFound, OrchardError

if TYPE_CHECKING:
    from orchard.env.client import Sandbox

SYSTEM = """You are the personal assistant of {address}; today is {today}. You work their mail,
calendar, to-dos, contacts, notes and files for them{how}. Do what they asked, and only that:
never send, share, delete or change anything they did not ask you to, and never write to people
outside the conversation's own contacts unless told to. If a request is unclear, ask them. A
service may fail for a moment (rate limits, server errors): wait and try again. When you are done,
reply to the user without calling a tool: say briefly what you did and answer what they asked."""

CALL_SECONDS = 30.0


def _function(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def _answer_text(status: int, body: str) -> str:
    return clip(body) if status < 400 else f"Error (HTTP {status}): {clip(body, 2000)}"


def _call_tool(tool: dict[str, Any], arguments: dict[str, Any], box: Sandbox) -> str:
    """A tool's call: its arguments as the JSON body to its URL on the sandbox's loopback."""
    port, path = _local(tool["url"])
    try:
        answer = box.http(path, port=port, method=tool.get("method", "POST"), json=arguments, timeout=CALL_SECONDS)
    except OrchardError as exc:
        return f"Error: the service could not be reached: {exc}"
    return _answer_text(answer.status, answer.text)


class FunctionsHarness(ToolCalling):
    """Each service endpoint a function tool (the task's `tools`)."""

    name = "functions"

    def __init__(self) -> None:
        self._tools: dict[str, dict[str, Any]] = {}

    def system_prompt(self, task: dict[str, Any]) -> str:
        self._tools = {t["name"]: t for t in task.get("tools", [])}
        return SYSTEM.format(
            address=task.get("address", "the user"), today=task.get("now", "today"), how=" with the tools"
        )

    def task_prompt(self, task: dict[str, Any]) -> str:
        return task_text(task)

    def tools(self) -> list[dict[str, Any]] | None:
        return [_function(t["name"], t["description"], t["input_schema"]) for t in self._tools.values()] or [
            _function("mail_list", "List messages.", {"type": "object", "properties": {}})
        ]  # a list before the task is known: the run offers tools either way

    def parse(self, reply: Reply) -> list[Action]:
        if not reply.tool_calls:
            if not (reply.content or "").strip():
                raise FormatError("an empty reply: call a tool, or answer the user in text")
            return [Action("submit", {"answer": reply.content})]
        actions = []
        for call in reply.tool_calls:
            if call.name not in self._tools:
                raise FormatError(f"unknown tool {call.name!r}; the tools are {', '.join(self._tools)}")
            actions.append(Action(call.name, json_arguments(call), call.id))
        return actions

    def execute(self, action: Action, box: Sandbox, workdir: str) -> str:
        return _call_tool(self._tools[action.name], action.arguments, box)

    def encode(self, step: Step, index: int) -> Reply:
        if step.kind == "call":
            call = ToolCall(f"call_{index}_{uuid.uuid4().hex[:8]}", step.tool, json.dumps(step.arguments))
            return Reply(content=step.thought, tool_calls=[call])
        if step.kind in ("say", "submit"):
            return Reply(content=step.content or step.thought or "Done.")
        raise ConfigError(f"the functions harness has no shell or files: it cannot play a {step.kind!r} step")


MEMORY = "MEMORY.md"

ASSISTANT_TOOLS: list[dict[str, Any]] = [
    _function(
        "shell",
        "Run a shell command in your workspace (a persistent bash session) and see its output.",
        {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    ),
    _function(
        "read_file",
        "Read a text file of your workspace.",
        {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    ),
    _function(
        "write_file",
        "Write a text file of your workspace (replacing it).",
        {
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        },
    ),
    _function(
        "http_request",
        "Send an HTTP request to one of the user's services; `body` is sent as JSON.",
        {
            "type": "object",
            "properties": {
                "method": {"type": "string", "enum": ["GET", "POST", "PUT", "PATCH", "DELETE"]},
                "url": {"type": "string"},
                "body": {"type": "object"},
            },
            "required": ["method", "url"],
        },
    ),
    _function(
        "memory",
        f"Keep a note for later (`save`) or read your notes back (`recall`); they live in {MEMORY}.",
        {
            "type": "object",
            "properties": {"action": {"type": "string", "enum": ["save", "recall"]}, "text": {"type": "string"}},
            "required": ["action"],
        },
    ),
]


class AssistantHarness(ToolCalling):
    """A general assistant: shell, files, HTTP to the services by URL, memory."""

    name = "assistant"
    command_timeout = 60.0

    def __init__(self) -> None:
        self._urls: dict[str, str] = {}

    def system_prompt(self, task: dict[str, Any]) -> str:
        self._urls = {t["name"]: t["url"] for t in task.get("tools", [])}
        reference = "\n".join(_reference(t) for t in task.get("tools", []))
        how = (
            " through their services' HTTP APIs (http_request: every call is a POST of a JSON object to the "
            "endpoint's URL, answered in JSON), your shell and your files"
        )
        intro = SYSTEM.format(address=task.get("address", "the user"), today=task.get("now", "today"), how=how)
        return f"{intro}\n\nThe services' endpoints:\n{reference}"

    def task_prompt(self, task: dict[str, Any]) -> str:
        return task_text(task)

    def tools(self) -> list[dict[str, Any]] | None:
        return ASSISTANT_TOOLS

    def parse(self, reply: Reply) -> list[Action]:
        if not reply.tool_calls:
            if not (reply.content or "").strip():
                raise FormatError("an empty reply: call a tool, or answer the user in text")
            return [Action("submit", {"answer": reply.content})]
        names = [t["function"]["name"] for t in ASSISTANT_TOOLS]
        actions = []
        for call in reply.tool_calls:
            if call.name not in names:
                raise FormatError(f"unknown tool {call.name!r}; the tools are {', '.join(names)}")
            arguments = json_arguments(call)
            need = {"shell": "command", "read_file": "path", "write_file": "path", "http_request": "url"}.get(call.name)
            if need and not isinstance(arguments.get(need), str):
                raise FormatError(f"{call.name} needs a string `{need}`")
            actions.append(Action(call.name, arguments, call.id))
        return actions

    def execute(self, action: Action, box: Sandbox, workdir: str) -> str:
        args = action.arguments
        try:
            if action.name == "shell":
                return run_shell(box, args["command"], workdir, self.command_timeout)
            if action.name == "http_request":
                return self._http(box, str(args.get("method") or "POST").upper(), args["url"], args.get("body"))
            if action.name == "memory":
                return self._memory(box, workdir, str(args.get("action")), str(args.get("text") or ""))
            path = args["path"] if args["path"].startswith("/") else f"{workdir}/{args['path']}"
            if action.name == "read_file":
                return clip(box.read_file(path).decode("utf-8", errors="replace")) or "[empty file]"
            content = args.get("content")
            if not isinstance(content, str):
                return "Error: write_file needs a string `content`"
            return f"wrote {box.write_file(path, content)} bytes to {path}"
        except OrchardError as exc:  # a missing file, a service not reached: the model can act on it
            return f"Error: {exc}"

    def _http(self, box: Sandbox, method: str, url: str, body: Any) -> str:
        try:
            port, path = _local(url)
        except ValueError:
            return "Error: only the user's services are reachable, at the URLs of the endpoint list"
        answer = box.http(path, port=port, method=method, json=body, timeout=CALL_SECONDS)
        return f"HTTP {answer.status}\n{_answer_text(answer.status, answer.text)}"

    def _memory(self, box: Sandbox, workdir: str, action: str, text: str) -> str:
        path = f"{workdir}/{MEMORY}"
        try:
            notes = box.read_file(path).decode("utf-8", errors="replace")
        except NotFound:
            notes = ""
        if action == "recall":
            return clip(notes) or "[no notes yet]"
        if action != "save" or not text.strip():
            return "Error: memory takes action save (with a text) or recall"
        box.write_file(path, f"{notes}- {text.strip()}\n")
        return "Saved."

    def encode(self, step: Step, index: int) -> Reply:
        call_id = f"call_{index}_{uuid.uuid4().hex[:8]}"
        if step.kind == "call":
            if step.tool not in self._urls:
                raise ConfigError(f"the script calls {step.tool!r}, which is none of the task's tools")
            arguments = {"method": "POST", "url": self._urls[step.tool], "body": step.arguments}
            return Reply(content=step.thought, tool_calls=[ToolCall(call_id, "http_request", json.dumps(arguments))])
        if step.kind in ("say", "submit"):
            return Reply(content=step.content or step.thought or "Done.")
        if step.kind == "write":
            arguments = {"path": step.path, "content": step.content}
            return Reply(content=step.thought, tool_calls=[ToolCall(call_id, "write_file", json.dumps(arguments))])
        command = {"command": step.command}
        return Reply(content=step.thought, tool_calls=[ToolCall(call_id, "shell", json.dumps(command))])


def _reference(tool: dict[str, Any]) -> str:
    """One endpoint in a line: `POST /mail/send {to*: array, subject*: string, ...}: Send a new email.`"""
    schema = tool.get("input_schema", {})
    required = set(schema.get("required", []))
    fields = ", ".join(
        f"{name}{'*' if name in required else ''}: {spec.get('type', 'any')}"
        for name, spec in schema.get("properties", {}).items()
    )
    return f"{tool.get('method', 'POST')} {tool['url']} {{{fields}}}: {tool.get('description', '')}"


def _local(url: str) -> tuple[int, str]:
    """(port, path with query) of a URL on the sandbox's loopback; ValueError for any other."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in ("localhost", "127.0.0.1") or not parts.port:
        raise ValueError(f"{url} is not on the sandbox's loopback")
    return parts.port, (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


REACT_SYSTEM = """{intro}

You have no function calling. Each reply is a short thought, then either one action:

Action: <tool name>
Action Input: <the tool's arguments, one JSON object on one line>

whose result comes back in the next message as `Observation: ...`, or, when you are done or need to
ask the user something, your message to them:

Final Answer: <your message>

The tools:
{tools}"""

_ACTION = re.compile(r"^Action:\s*(\S+)\s*\nAction Input:\s*(.*)$", re.MULTILINE | re.DOTALL)
_FINAL = re.compile(r"^Final Answer:\s*(.*)$", re.MULTILINE | re.DOTALL)


class ReactHarness:
    """`react`: a text protocol, ReAct's (`Action:` / `Action Input:` / `Final Answer:`), no tool
    schemas in the API: the tools are described in the system prompt. A third interface, so that one
    harness can be held out of training."""

    name = "react"

    def __init__(self) -> None:
        self._tools: dict[str, dict[str, Any]] = {}

    def system_prompt(self, task: dict[str, Any]) -> str:
        self._tools = {t["name"]: t for t in task.get("tools", [])}
        intro = SYSTEM.format(address=task.get("address", "the user"), today=task.get("now", "today"), how="")
        intro = intro.replace("reply to the user without calling a tool", "give your Final Answer")
        tools = "\n".join(
            f"- {t['name']}: {t.get('description', '')} Arguments: {json.dumps(t.get('input_schema', {}).get('properties', {}))}"
            for t in self._tools.values()
        )
        return REACT_SYSTEM.format(intro=intro, tools=tools)

    def task_prompt(self, task: dict[str, Any]) -> str:
        return task_text(task)

    def tools(self) -> list[dict[str, Any]] | None:
        return None

    def parse(self, reply: Reply) -> list[Action]:
        text = reply.content or ""
        final, action = _FINAL.search(text), _ACTION.search(text)
        if final and (not action or final.start() < action.start()):
            return [Action("submit", {"answer": final.group(1).strip()})]
        if not action:
            raise FormatError("no `Action:` with an `Action Input:` line, and no `Final Answer:`")
        name, raw = action.group(1), action.group(2).strip().splitlines()[0] if action.group(2).strip() else "{}"
        if name not in self._tools:
            raise FormatError(f"unknown tool {name!r}; the tools are {', '.join(self._tools)}")
        return [Action(name, json_arguments(ToolCall("react", name, raw)))]

    def execute(self, action: Action, box: Sandbox, workdir: str) -> str:
        return _call_tool(self._tools[action.name], action.arguments, box)

    def observation_messages(self, action: Action, observation: str) -> list[Message]:
        return [{"role": "user", "content": f"Observation: {observation}"}]

    def format_error_messages(self, reply: Reply, error: FormatError) -> list[Message]:
        return [{"role": "user", "content": f"Format error: {error}"}]

    def encode(self, step: Step, index: int) -> Reply:
        thought = step.thought or "Next step."
        if step.kind == "call":
            return Reply(content=f"{thought}\nAction: {step.tool}\nAction Input: {json.dumps(step.arguments)}")
        if step.kind in ("say", "submit"):
            return Reply(content=f"{thought}\nFinal Answer: {step.content or 'Done.'}")
        raise ConfigError(f"the react harness has no shell or files: it cannot play a {step.kind!r} step")
