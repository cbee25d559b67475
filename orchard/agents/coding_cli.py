"""`cli`: a coding-CLI agent's interface (Codex CLI's way): `shell`, `read_file`, `write_file`,
`apply_patch`, and the episode ends when the model answers in plain text without a tool call.

Unlike the other two harnesses, every `shell` call is a fresh process (an argv list, with its own
working folder), not a persistent session, and observations are JSON with the exit code.
"""

from __future__ import annotations

import json
import shlex
import uuid
from typing import TYPE_CHECKING, Any

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
    task_text,
)
from orchard.errors import NotFound, OrchardError

if TYPE_CHECKING:
    from orchard.env.client import Sandbox

SYSTEM = """You are a coding agent working in a repository on the user's behalf. You have four
tools: `shell` runs one command (an argv list, e.g. ["bash", "-lc", "pytest -q"]) in a fresh
process; `read_file` and `write_file` read and write whole files; `apply_patch` applies a unified
diff to the repository. Work step by step with tool calls. When you are done, answer with a short
summary of your change and no tool call: that ends your turn."""

PATCH_FILE = "/tmp/orchard-cli.patch"

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a command and return its output and exit code.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "array", "items": {"type": "string"}},
                    "workdir": {"type": "string"},
                    "timeout_ms": {"type": "integer"},
                },
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file (lines offset.. offset+limit-1, 1-based).",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "offset": {"type": "integer"},
                    "limit": {"type": "integer"},
                },
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a whole file (created with its folders if missing).",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "apply_patch",
            "description": "Apply a unified diff (as `git diff` prints it) to the repository.",
            "parameters": {
                "type": "object",
                "properties": {"patch": {"type": "string"}},
                "required": ["patch"],
            },
        },
    },
]
_REQUIRED = {"shell": ("command", list), "read_file": ("path", str), "write_file": ("path", str)}
_REQUIRED["apply_patch"] = ("patch", str)


class CliHarness(ToolCalling):
    name = "cli"
    default_timeout = 120.0

    def system_prompt(self, task: dict[str, Any]) -> str:
        return SYSTEM

    def task_prompt(self, task: dict[str, Any]) -> str:
        return task_text(task)

    def tools(self) -> list[dict[str, Any]] | None:
        return TOOLS

    def parse(self, reply: Reply) -> list[Action]:
        if not reply.tool_calls:
            if not (reply.content or "").strip():
                raise FormatError("an empty reply: call a tool, or summarise your change to finish")
            return [Action("submit")]
        actions: list[Action] = []
        for call in reply.tool_calls:
            if call.name not in _REQUIRED:
                raise FormatError(f"unknown tool {call.name!r}: use shell, read_file, write_file or apply_patch")
            arguments = json_arguments(call)
            field, kind = _REQUIRED[call.name]
            value = arguments.get(field)
            if not isinstance(value, kind) or (kind is list and not all(isinstance(a, str) for a in value)):
                raise FormatError(f"{call.name} needs `{field}` as a {'list of strings' if kind is list else 'string'}")
            if call.name == "write_file" and not isinstance(arguments.get("content"), str):
                raise FormatError("write_file needs `content` as a string")
            for name, kinds in (("workdir", str), ("timeout_ms", int), ("offset", int), ("limit", int)):
                if arguments.get(name) is not None and not isinstance(arguments[name], kinds):
                    raise FormatError(f"{call.name}: `{name}` must be a {kinds.__name__}")
            actions.append(Action(call.name, arguments, call.id))
        return actions

    def execute(self, action: Action, box: Sandbox, workdir: str) -> str:
        args = action.arguments
        try:
            if action.name == "shell":
                return self._shell(box, workdir, args)
            path = _resolve(args.get("path", ""), workdir)
            if action.name == "read_file":
                return self._read(box, path, args)
            if action.name == "write_file":
                size = box.write_file(path, args["content"])
                return _result(f"wrote {size} bytes to {path}", 0)
            box.write_file(PATCH_FILE, args["patch"] if args["patch"].endswith("\n") else args["patch"] + "\n")
            applied = box.exec(f"git apply --verbose {PATCH_FILE}", cwd=workdir, timeout=60)
            return _result(applied.stdout + applied.stderr, applied.exit_code)
        except NotFound as exc:
            return _result(f"error: {exc}", 1)
        except OrchardError as exc:
            return _result(f"error: {exc}", None)

    def _shell(self, box: Sandbox, workdir: str, args: dict[str, Any]) -> str:
        cwd = _resolve(args.get("workdir") or workdir, workdir)
        timeout = args.get("timeout_ms")
        seconds = timeout / 1000 if isinstance(timeout, int) and timeout > 0 else self.default_timeout
        command = args["command"]
        shell = len(command) == 3 and command[0] in SHELLS and command[1] in ("-c", "-lc")
        script = command[2] if shell else shlex.join(command)  # a script runs as itself, of any size
        result = box.exec(script, cwd=cwd, timeout=min(seconds, 600.0), login_shell=shell and command[1] == "-lc")
        output = result.stdout + result.stderr
        if result.timed_out:
            output += f"\n[timed out after {seconds:g} s]"
        elif result.error:
            output += f"\n[{result.error}]"
        return _result(output, result.exit_code)

    @staticmethod
    def _read(box: Sandbox, path: str, args: dict[str, Any]) -> str:
        lines = box.read_file(path).decode("utf-8", errors="replace").splitlines()
        offset, limit = args.get("offset"), args.get("limit")
        offset = offset if isinstance(offset, int) else 1
        limit = limit if isinstance(limit, int) else 2000
        start = max(1, offset)
        chosen = lines[start - 1 : start - 1 + max(1, limit)]
        return _result("\n".join(chosen), 0)

    def format_error_messages(self, reply: Reply, error: FormatError) -> list[Message]:
        answers: list[Message] = [
            {"role": "tool", "tool_call_id": call.id, "content": _result(f"error: {error}", None)}
            for call in reply.tool_calls
        ]
        return answers or [{"role": "user", "content": f"Format error: {error}"}]

    def encode(self, step: Step, index: int) -> Reply:
        call_id = f"call_{index}_{uuid.uuid4().hex[:8]}"
        if step.kind == "submit":
            return Reply(content=step.thought or "Done: the fix is in place.")
        if step.kind == "write":
            written = json.dumps({"path": step.path, "content": step.content})
            return Reply(content=step.thought, tool_calls=[ToolCall(call_id, "write_file", written)])
        shell = json.dumps({"command": ["bash", "-lc", step.command]})
        return Reply(content=step.thought, tool_calls=[ToolCall(call_id, "shell", shell)])


SHELLS = frozenset({"bash", "/bin/bash", "/usr/bin/bash"})
"""`["bash", "-lc", SCRIPT]`, as coding CLIs send a command, runs SCRIPT itself (no argv limit), as
the agent runs a command: under bash. `sh -c` forms are run as written (`sh` need not be bash)."""


def _resolve(path: str, workdir: str) -> str:
    return path if path.startswith("/") else f"{workdir}/{path}"


def _result(output: str, exit_code: int | None) -> str:
    return json.dumps({"output": clip(output), "metadata": {"exit_code": exit_code}})
