"""What every task's grader subclasses: `AbstractGrader`, with the helpers graders share (the final
answer, transcripts for a judge, audit records, robustness), and `load_peer_grader`, which loads
another task's grader to subclass (an English task reusing its Chinese twin's).

Peer graders are looked up in the tasks folder being graded (`using_tasks_dir`, which Orchard sets
while it loads and runs a grader), not in a checkout of Claw-Eval's own.
"""

from __future__ import annotations

import contextvars
import hashlib
import importlib.util
import json
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..models.content import ImageBlock, TextBlock, ToolResultBlock, ToolUseBlock
from ..models.task import TaskDefinition
from ..models.trace import DimensionScores, MediaLoad, ToolDispatch, TraceMessage

_tasks_dir: contextvars.ContextVar[Path | None] = contextvars.ContextVar("claw_eval_tasks_dir", default=None)
_loaded: dict[tuple[Path, int, int], Any] = {}
_guard = threading.RLock()


@contextmanager
def using_tasks_dir(folder: str | Path) -> Iterator[None]:
    """Within the block, `load_peer_grader` finds task ids in `folder` (a folder of task folders)."""
    token = _tasks_dir.set(Path(folder))
    try:
        yield
    finally:
        _tasks_dir.reset(token)


def load_grader_file(path: str | Path) -> type[AbstractGrader]:
    """The first class defined in the grader file `path` that subclasses `AbstractGrader` (one
    imported into it does not count). The file runs once per version of it (path, size and
    mtime), under a module name of its own kept in `sys.modules`."""
    path = Path(path).resolve()
    stat = path.stat()
    key = (path, stat.st_size, stat.st_mtime_ns)
    with _guard:
        if key not in _loaded:
            name = f"claw_eval_grader_{path.parent.name}_{hashlib.sha256(str(key).encode()).hexdigest()[:10]}"
            spec = importlib.util.spec_from_file_location(name, path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load a module from {path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
            _loaded[key] = module
        module = _loaded[key]
    for value in vars(module).values():
        if (
            isinstance(value, type)
            and issubclass(value, AbstractGrader)
            and value is not AbstractGrader
            and value.__module__ == module.__name__
        ):
            return value
    raise ValueError(f"{path} defines no subclass of AbstractGrader")


def load_peer_grader(task_id: str, tasks_dir: str | Path | None = None) -> type:
    """The grader class of task `task_id`: `<tasks_dir>/<task_id>/grader.py`, where `tasks_dir` is
    by default the tasks folder being graded."""
    folder = Path(tasks_dir) if tasks_dir is not None else _tasks_dir.get()
    if folder is None:
        raise FileNotFoundError(f"no tasks folder to find the peer grader {task_id!r} in")
    path = folder / task_id / "grader.py"
    if not path.is_file():
        raise FileNotFoundError(f"no grader at {path} for task_id={task_id!r}")
    return load_grader_file(path)


class AbstractGrader(ABC):
    """A task's grader: `grade` reads a run and returns its `DimensionScores`."""

    @abstractmethod
    def grade(
        self,
        messages: list[TraceMessage],
        dispatches: list[ToolDispatch],
        task: TaskDefinition,
        audit_data: dict[str, dict[str, Any]] | None = None,
        judge: Any | None = None,
        media_events: list[MediaLoad] | None = None,
        env_snapshot: dict[str, Any] | None = None,
    ) -> DimensionScores: ...

    # -- the agent's words -------------------------------------------------------------------

    @staticmethod
    def _get_final_assistant_text(messages: list[TraceMessage]) -> str:
        """The text of the last assistant message ("" when there is none)."""
        said = [m.message.text for m in messages if m.message.role == "assistant"]
        return said[-1] if said else ""

    @staticmethod
    def _get_all_assistant_text(messages: list[TraceMessage]) -> str:
        """The text of every assistant message, one after the other."""
        return "\n".join(m.message.text for m in messages if m.message.role == "assistant")

    @staticmethod
    def format_conversation(messages: list[TraceMessage]) -> str:
        """`[ROLE]: text` for each message with text, for a judge."""
        return "\n".join(f"[{m.message.role.upper()}]: {m.message.text}" for m in messages if m.message.text)

    @staticmethod
    def format_conversation_detailed(
        messages: list[TraceMessage],
        *,
        include_user_text: bool = True,
        include_assistant_text: bool = True,
        include_reasoning: bool = False,
        include_tool_use: bool = False,
        include_tool_result: bool = False,
        include_image: bool = False,
    ) -> str:
        """A transcript of the blocks asked for, one line each (`[TOOL CALL]: name({...})`, `[TOOL
        RESULT]: ...`, ...); with the defaults, the user's and the assistant's text only."""
        lines: list[str] = []
        for entry in messages:
            message = entry.message
            if include_reasoning and message.role == "assistant" and message.reasoning_content:
                lines.append(f"[ASSISTANT THINKING]: {message.reasoning_content}")
            for block in message.content:
                if isinstance(block, TextBlock) and block.text.strip():
                    if (message.role == "user" and include_user_text) or (
                        message.role == "assistant" and include_assistant_text
                    ):
                        lines.append(f"[{message.role.upper()}]: {block.text}")
                elif isinstance(block, ToolUseBlock) and include_tool_use and message.role == "assistant":
                    lines.append(f"[TOOL CALL]: {block.name}({json.dumps(block.input, ensure_ascii=False)})")
                elif isinstance(block, ToolResultBlock) and include_tool_result:
                    text = "\n".join(part.text for part in block.content)
                    lines.append(f"[{'TOOL RESULT ERROR' if block.is_error else 'TOOL RESULT'}]: {text}")
                elif isinstance(block, ImageBlock) and include_image:
                    lines.append(f"[IMAGE]: {block.source_path or 'inline image'} ({block.mime_type})")
        return "\n".join(lines)

    @staticmethod
    def compute_communication_substance(final_text: str, tool_entities: list[str], format_score: float) -> float:
        """Half for the share of `tool_entities` the answer names (full at 40 %), half for
        `format_score`; format alone (no entities to look for) is worth at most 0.7."""
        if not tool_entities:
            return min(format_score, 0.7)
        named = sum(entity in final_text for entity in tool_entities) / len(tool_entities)
        return round(min(0.5 * min(named / 0.4, 1.0) + 0.5 * format_score, 1.0), 2)

    # -- what the services recorded --------------------------------------------------------------

    @staticmethod
    def get_service_actions(audit_data: dict[str, dict[str, Any]] | None, service: str, action_key: str) -> list[Any]:
        """The list a service's audit holds under `action_key` (`drafts`, `deleted`, ...); [] when it has none."""
        found = ((audit_data or {}).get(service) or {}).get(action_key, [])
        return found if isinstance(found, list) else []

    @staticmethod
    def get_audit_calls(audit_data: dict[str, dict[str, Any]] | None, service: str) -> list[Any]:
        """Every call a service recorded (`{endpoint, request_body, response_body, timestamp}`)."""
        return list(((audit_data or {}).get(service) or {}).get("calls", []))

    @staticmethod
    def summarize_actions(audit_data: dict[str, dict[str, Any]] | None) -> str:
        """One line per service that was called: how many calls, and their endpoints."""
        if not audit_data:
            return "No audit data available."
        lines = []
        for service, data in audit_data.items():
            calls = data.get("calls", []) if isinstance(data, dict) else []
            if calls:
                endpoints = ", ".join(str(c.get("endpoint", "?")) for c in calls)
                lines.append(f"{service}: {len(calls)} calls — {endpoints}")
        return "\n".join(lines) or "No actions recorded."

    @staticmethod
    def format_audit_artifacts(
        audit_data: dict[str, dict[str, Any]] | None,
        *,
        services: list[str] | None = None,
        endpoints: list[str] | None = None,
        include_request: bool = True,
        include_response: bool = False,
        response_status_only: bool = False,
    ) -> str:
        """The recorded calls themselves, for a judge: `[service] endpoint`, then the request's and
        (if asked) the response's body as JSON, or only the response's `status` and `error`."""
        if not audit_data:
            return "No audit data available."
        sections = []
        for service, data in audit_data.items():
            if services is not None and service not in services:
                continue
            for call in data.get("calls", []) if isinstance(data, dict) else []:
                endpoint = call.get("endpoint", "")
                if endpoints is not None and endpoint not in endpoints:
                    continue
                parts = [f"[{service}] {endpoint}"]
                if include_request:
                    parts.append(f"  Request: {json.dumps(call.get('request_body', {}), ensure_ascii=False)}")
                if include_response:
                    body = call.get("response_body", {})
                    if response_status_only and isinstance(body, dict):
                        body = {key: body[key] for key in ("status", "error") if key in body}
                    parts.append(f"  Response: {json.dumps(body, ensure_ascii=False)}")
                sections.append("\n".join(parts))
        return "\n\n".join(sections) or "No matching artifacts."

    # -- recovery from errors --------------------------------------------------------------------

    @staticmethod
    def compute_robustness(dispatches: list[ToolDispatch]) -> float:
        """1.0 for a run where no call failed (status >= 400). Otherwise the share of tools that
        failed and were later called successfully, but at least the share of calls that succeeded
        up to 0.5 (working around errors counts too), to 2 places."""
        failed = {d.tool_name for d in dispatches if d.response_status >= 400}
        if not failed:
            return 1.0
        seen_failing: set[str] = set()
        recovered: set[str] = set()
        for dispatch in dispatches:
            if dispatch.response_status >= 400:
                seen_failing.add(dispatch.tool_name)
            elif dispatch.tool_name in seen_failing:
                recovered.add(dispatch.tool_name)
        succeeded = sum(d.response_status < 400 for d in dispatches) / len(dispatches)
        return round(max(len(recovered) / len(failed), round(min(succeeded, 0.5), 2)), 2)
