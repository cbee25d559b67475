"""Trajectories as JSONL in the shape of the published Orchard dataset, both ways.

One line per trajectory: `tools` (the tool schemas offered, as a JSON string; `null` for a
text-only harness), `messages` (OpenAI-style chat messages with `tool_calls`), and `metadata` (a
JSON string: instance id, harness, model, status, `verify_status` and `resolved` from the
grader, steps, tokens, the final patch). Images the store keeps as files are inlined again (`data:`
URLs), so a line stands alone. Import accepts `tools` and `metadata` as strings or
objects, rebuilds the steps from the messages, and skips trajectories already in the store.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlmodel import col, select

from orchard.agents.loop import load_images
from orchard.errors import ConfigError
from orchard.store import StepRecord, Store, TrajectoryRecord, session


def export_lines(*, run_id: str | None = None, store: Store | None = None) -> Iterator[str]:
    """The trajectories of `run_id` (all when None), one JSON line each."""
    with session(store) as db:
        query = select(TrajectoryRecord).order_by(col(TrajectoryRecord.created_at))
        if run_id:
            query = query.where(TrajectoryRecord.run_id == run_id)
        records = list(db.exec(query))
    for record in records:
        metadata = {
            "trajectory_id": record.id,
            "run_id": record.run_id,
            "instance_id": record.instance_id,
            "harness": record.harness,
            "model": record.model,
            "sample": record.sample,
            "status": record.status,
            "verify_status": record.outcome,
            "resolved": record.resolved,
            "steps": record.steps,
            "prompt_tokens": record.prompt_tokens,
            "completion_tokens": record.completion_tokens,
            "format_errors": record.format_errors,
            "error": record.error,
            "patch": record.patch,
        }
        yield json.dumps(
            {
                "tools": record.tools,
                "messages": load_images(json.loads(record.messages)),
                "metadata": json.dumps(metadata),
            }
        )


def export_file(path: Path, *, run_id: str | None = None, store: Store | None = None) -> int:
    """Write the trajectories of `run_id` (all when None) to `path` as JSONL; how many."""
    if not path.parent.is_dir():
        raise ConfigError(f"cannot write {path}: there is no folder {path.parent}")
    try:
        out = path.open("w", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
    count = 0
    with out:
        for line in export_lines(run_id=run_id, store=store):
            out.write(line + "\n")
            count += 1
    return count


def import_file(path: Path, *, run_id: str | None = None, store: Store | None = None) -> tuple[int, int]:
    """Import a JSONL of trajectories; (imported, skipped as already present)."""
    if not path.is_file():
        raise ConfigError(f"no trajectory file {path}")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            records.append(_record(line, f"{path}:{number}", run_id))
    imported = skipped = 0
    with session(store) as db:
        for trajectory, steps in records:
            if db.get(TrajectoryRecord, trajectory.id) is not None:
                skipped += 1
                continue
            db.add(trajectory)
            for step in steps:
                db.add(step)
            imported += 1
    return imported, skipped


def _record(line: str, where: str, run_id: str | None) -> tuple[TrajectoryRecord, list[StepRecord]]:
    try:
        row = json.loads(line)
        messages = row["messages"]
        metadata = _object(row.get("metadata"))
        tools = row.get("tools")
        tools = json.loads(tools) if isinstance(tools, str) else tools
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{where}: not a trajectory ({type(exc).__name__}: {exc})") from None
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ConfigError(f"{where}: messages must be a list of chat messages with a role")
    if not isinstance(metadata.get("instance_id"), str):
        raise ConfigError(f"{where}: metadata needs the task's instance_id")
    trajectory_id = str(metadata.get("trajectory_id") or uuid.uuid4().hex)
    steps = list(_steps(trajectory_id, messages))
    verify = metadata.get("verify_status")
    resolved = metadata.get("resolved")
    if resolved is None and isinstance(verify, str):
        resolved = verify == "resolved"
    trajectory = TrajectoryRecord(
        id=trajectory_id,
        run_id=run_id or metadata.get("run_id"),
        instance_id=metadata["instance_id"],
        harness=str(metadata.get("harness") or "unknown"),
        model=str(metadata.get("model") or "unknown"),
        sample=int(metadata.get("sample") or 0),
        status=str(metadata.get("status") or "completed"),
        error=metadata.get("error"),
        messages=json.dumps(messages),
        tools=json.dumps(tools),
        patch=str(metadata.get("patch") or ""),
        outcome=verify if isinstance(verify, str) else None,
        resolved=resolved if isinstance(resolved, bool) else None,
        steps=len(steps),
        prompt_tokens=int(metadata.get("prompt_tokens") or 0),
        completion_tokens=int(metadata.get("completion_tokens") or 0),
        format_errors=int(metadata.get("format_errors") or 0),
        created_at=time.time(),
    )
    return trajectory, steps


def _object(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        value = json.loads(value)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError("metadata must be a JSON object")
    return value


def _steps(trajectory_id: str, messages: list[dict[str, Any]]) -> Iterator[StepRecord]:
    """A step per assistant message; what follows it until the next one is its observation."""
    index = 0
    current: StepRecord | None = None
    for message in messages:
        if message["role"] == "assistant":
            if current is not None:
                yield current
            calls = message.get("tool_calls") or []
            actions = [
                {"name": c.get("function", {}).get("name"), "arguments": c.get("function", {}).get("arguments")}
                for c in calls
            ]
            current = StepRecord(
                id=f"{trajectory_id}/{index}",
                trajectory_id=trajectory_id,
                index=index,
                reply=str(message.get("content") or ""),
                actions=json.dumps(actions),
            )
            index += 1
        elif current is not None and message["role"] in ("tool", "user"):
            text = message.get("content")
            text = text if isinstance(text, str) else json.dumps(text)
            current.observation = f"{current.observation}\n{text}" if current.observation else text
    if current is not None:
        yield current
