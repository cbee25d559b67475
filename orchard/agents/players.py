"""How a scripted model plays a CLI it does not know: it reads the tools the CLI offers in the
request and writes a step with them. A shell step becomes a call of the offered shell tool (its
command as a string, or as an argv list `["bash", "-lc", ...]` where the schema wants an array),
a file step a call of the offered write tool (or the shell, writing the file, when there is
none), the end of the episode a plain answer without a tool call, which is how every CLI ends
its turn. Required arguments the step has no value for (a description, a timeout) get a short
filler of their type."""

from __future__ import annotations

import json
import re
import shlex
import uuid
from typing import Any

from orchard.agents.base import Reply, Step, ToolCall

SHELL_NAMES = ("shell", "bash", "exec_command", "terminal", "run_shell_command", "execute_command", "local_shell")
"""Shell tools by name (compared case-blind); of several offered, the first in this list wins."""
WRITE_NAMES = ("write", "write_file", "create_file", "file_write")
COMMAND_KEYS = ("command", "cmd", "script")
PATH_KEYS = ("file_path", "filepath", "path", "filename")
CONTENT_KEYS = ("content", "contents", "text", "file_text")


def play(step: Step, tools: list[dict[str, Any]], index: int) -> Reply:
    """`step` as a reply calling the offered `tools` (chat-completions tool schemas)."""
    if step.kind in ("submit", "say"):
        return Reply(content=step.content or step.thought or "Done: the fix is in place.")
    if step.kind == "write":
        write = _find(tools, WRITE_NAMES)
        if write is not None:
            try:
                return _call(write, index, step.thought, {PATH_KEYS: step.path, CONTENT_KEYS: step.content})
            except ValueError:  # a write tool of other arguments: the shell writes the file
                pass
        path = shlex.quote(step.path)
        command = f'mkdir -p "$(dirname {path})" && printf %s {shlex.quote(step.content)} > {path}'
        step = Step("bash", command=command, thought=step.thought)
    if step.kind != "bash":
        raise ValueError(f"a CLI cannot play a {step.kind!r} step")
    shell = _find(tools, SHELL_NAMES)
    if shell is None:
        names = ", ".join(_name(tool) for tool in tools) or "none"
        raise ValueError(f"no shell tool among the offered tools ({names})")
    return _call(shell, index, step.thought, {COMMAND_KEYS: step.command})


def _name(tool: dict[str, Any]) -> str:
    return str((tool.get("function") or tool).get("name", ""))


def _find(tools: list[dict[str, Any]], names: tuple[str, ...]) -> dict[str, Any] | None:
    by_name = {_name(tool).lower(): tool for tool in tools}
    return next((by_name[name] for name in names if name in by_name), None)


def _call(tool: dict[str, Any], index: int, thought: str, values: dict[tuple[str, ...], str]) -> Reply:
    function = tool.get("function") or tool
    schema = function.get("parameters") or {}
    properties = {k: v if isinstance(v, dict) else {} for k, v in (schema.get("properties") or {}).items()}
    arguments: dict[str, Any] = {}
    for keys, value in values.items():
        key = next((k for k in properties if k.lower() in keys), None)
        if key is None:
            if len(values) == 1 and len(properties) == 1:  # a tool of one argument (a freeform `input`)
                key = next(iter(properties))
            elif not properties:
                key = keys[0]
            else:
                raise ValueError(f"tool {_name(tool)} takes none of {', '.join(keys)}: {', '.join(properties)}")
        kind = properties.get(key, {}).get("type")
        arguments[key] = ["bash", "-lc", value] if kind == "array" else value
    for key in schema.get("required") or []:
        if key not in arguments:
            arguments[key] = _filler(key, properties.get(key) or {}, thought)
    name = str(function.get("name"))
    return Reply(
        content=thought, tool_calls=[ToolCall(f"call_{index}_{uuid.uuid4().hex[:8]}", name, json.dumps(arguments))]
    )


def _filler(key: str, schema: dict[str, Any], thought: str) -> Any:
    """A value of the schema's type for an argument the step does not set."""
    kind = schema.get("type")
    if schema.get("enum"):
        return schema["enum"][0]
    if kind in ("integer", "number"):
        return 120_000 if re.search("timeout", key, re.IGNORECASE) else 1
    if kind == "boolean":
        return False
    if kind == "array":
        return []
    if kind == "object":
        return {}
    return thought or key
