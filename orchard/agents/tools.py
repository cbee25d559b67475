"""`tools`: function calling with `execute_bash`, a file editor and `finish` (OpenHands' way).

The editor (`str_replace_editor`) views files with line numbers and folders two levels deep,
creates files, replaces a unique string, inserts after a line and undoes its own last edit of a
file. Tool failures (a missing file, a non-unique string) are observations the model can act on;
a reply without a tool call, or with an unknown tool or bad arguments, is a format error.
"""

from __future__ import annotations

import shlex
import uuid
from typing import TYPE_CHECKING, Any

from orchard.agents.base import (
    Action,
    FormatError,
    Reply,
    Step,
    ToolCall,
    ToolCalling,
    clip,
    json_arguments,
    run_shell,
    task_text,
)
from orchard.errors import NotFound, OrchardError

if TYPE_CHECKING:
    from orchard.env.client import Sandbox

SYSTEM = """You are a software engineer fixing an issue in a repository. Use the tools: run shell
commands with execute_bash (a persistent, non-interactive bash session), read and edit files with
str_replace_editor, and call finish when the fix is done and checked. Make the smallest change that
resolves the issue; do not change the tests."""

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "execute_bash",
            "description": "Run a bash command in a persistent session and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command."}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "str_replace_editor",
            "description": (
                "View, create and edit files. `view` shows a file with line numbers (or a folder two "
                "levels deep); `create` writes a new file; `str_replace` replaces old_str, which must "
                "occur exactly once, by new_str; `insert` adds new_str after line insert_line; "
                "`undo_edit` reverts the last edit of the file."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
                    "path": {"type": "string", "description": "Absolute path, or relative to the repository."},
                    "file_text": {"type": "string"},
                    "old_str": {"type": "string"},
                    "new_str": {"type": "string"},
                    "insert_line": {"type": "integer"},
                    "view_range": {"type": "array", "items": {"type": "integer"}},
                },
                "required": ["command", "path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "finish",
            "description": "Submit: the fix is complete.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]


class ToolsHarness(ToolCalling):
    name = "tools"
    command_timeout = 120.0

    def __init__(self) -> None:
        self._history: dict[str, list[str | None]] = {}

    def system_prompt(self, task: dict[str, Any]) -> str:
        return SYSTEM

    def task_prompt(self, task: dict[str, Any]) -> str:
        return task_text(task)

    def tools(self) -> list[dict[str, Any]] | None:
        return TOOLS

    def parse(self, reply: Reply) -> list[Action]:
        if not reply.tool_calls:
            raise FormatError("no tool call: call execute_bash, str_replace_editor, or finish when done")
        actions = []
        for call in reply.tool_calls:
            if call.name not in ("execute_bash", "str_replace_editor", "finish"):
                raise FormatError(f"unknown tool {call.name!r}: use execute_bash, str_replace_editor or finish")
            arguments = json_arguments(call)
            if call.name == "execute_bash" and not isinstance(arguments.get("command"), str):
                raise FormatError("execute_bash needs a string `command`")
            if call.name == "str_replace_editor" and not (
                isinstance(arguments.get("command"), str) and isinstance(arguments.get("path"), str)
            ):
                raise FormatError("str_replace_editor needs string `command` and `path`")
            name = "submit" if call.name == "finish" else call.name
            actions.append(Action(name, arguments, call.id))
        return actions

    def execute(self, action: Action, box: Sandbox, workdir: str) -> str:
        if action.name == "execute_bash":
            return run_shell(box, action.arguments["command"], workdir, self.command_timeout)
        try:
            return self._edit(box, workdir, action.arguments)
        except OrchardError as exc:
            return f"Error: {exc}"

    def _edit(self, box: Sandbox, workdir: str, args: dict[str, Any]) -> str:
        command, path = args["command"], args["path"]
        path = path if path.startswith("/") else f"{workdir}/{path}"
        if command == "view":
            return self._view(box, path, args.get("view_range"))
        if command == "create":
            text = args.get("file_text")
            if not isinstance(text, str):
                return "Error: create needs `file_text`"
            if self._read(box, path) is not None:
                return f"Error: {path} exists already; edit it with str_replace"
            self._write(box, path, text, previous=None)
            return f"File created: {path}"
        current = self._read(box, path)
        if command == "undo_edit":
            history = self._history.get(path)
            if not history:
                return f"Error: no edit of {path} to undo"
            previous = history.pop()
            if previous is None:
                box.exec(f"rm -f -- {shlex.quote(path)}")
            else:
                box.write_file(path, previous)
            return f"Last edit of {path} undone"
        if current is None:
            return f"Error: {path} does not exist"
        if command == "str_replace":
            old, new = args.get("old_str"), args.get("new_str", "")
            if not isinstance(old, str) or not old or not isinstance(new, str):
                return "Error: str_replace needs a non-empty `old_str` and a string `new_str`"
            count = current.count(old)
            if count != 1:
                return f"Error: old_str occurs {count} times in {path}; it must occur exactly once"
            updated = current.replace(old, new, 1)
        elif command == "insert":
            line, new = args.get("insert_line"), args.get("new_str")
            lines = current.splitlines(keepends=True)
            if not isinstance(line, int) or not 0 <= line <= len(lines) or not isinstance(new, str):
                return f"Error: insert needs `new_str` and `insert_line` between 0 and {len(lines)}"
            updated = "".join([*lines[:line], new if new.endswith("\n") else new + "\n", *lines[line:]])
        else:
            return f"Error: unknown command {command!r}"
        self._write(box, path, updated, previous=current)
        start = updated.count("\n", 0, updated.find(new)) + 1 if new else 1
        return f"Edited {path}. Around the change:\n" + _numbered(updated, max(1, start - 3), start + 6)

    def _view(self, box: Sandbox, path: str, view_range: Any) -> str:
        listing = box.exec(f"test -d {shlex.quote(path)}")
        if listing.exit_code == 0:
            found = box.exec(
                f"find {shlex.quote(path)} -maxdepth 2 -not -path '*/.*' -not -name '__pycache__' | sort | head -400"
            )
            return clip(found.stdout) or "[empty folder]"
        text = self._read(box, path)
        if text is None:
            return f"Error: {path} does not exist"
        first, last = 1, text.count("\n") + 1
        if isinstance(view_range, list) and len(view_range) == 2 and all(isinstance(n, int) for n in view_range):
            first, last = max(1, view_range[0]), (last if view_range[1] == -1 else view_range[1])
        return clip(_numbered(text, first, last))

    @staticmethod
    def _read(box: Sandbox, path: str) -> str | None:
        try:
            return box.read_file(path).decode("utf-8", errors="replace")
        except NotFound:
            return None

    def _write(self, box: Sandbox, path: str, text: str, previous: str | None) -> None:
        box.write_file(path, text)
        self._history.setdefault(path, []).append(previous)

    def encode(self, step: Step, index: int) -> Reply:
        call_id = f"call_{index}_{uuid.uuid4().hex[:8]}"
        if step.kind == "submit":
            call = ToolCall(call_id, "finish", "{}")
        elif step.kind == "write":
            call = ToolCall(call_id, "execute_bash", _json({"command": _heredoc(step.path, step.content)}))
        else:
            call = ToolCall(call_id, "execute_bash", _json({"command": step.command}))
        return Reply(content=step.thought, tool_calls=[call])


def _numbered(text: str, first: int, last: int) -> str:
    lines = text.splitlines()
    return "\n".join(f"{n:6}\t{lines[n - 1]}" for n in range(first, min(last, len(lines)) + 1))


def _heredoc(path: str, content: str) -> str:
    return f"cat <<'ORCHARD_EOF' > {shlex.quote(path)}\n{content if content.endswith(chr(10)) else content + chr(10)}ORCHARD_EOF"


def _json(value: dict[str, Any]) -> str:
    import json

    return json.dumps(value)
