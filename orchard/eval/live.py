"""What a running evaluation is doing, attempt by attempt: `live.json` in its run folder.

The store records an attempt once it ends. Meanwhile the runner keeps a small file in the run's
folder listing the attempts in flight: each one's task, harness and sample, when it started,
whether it is being solved or graded, its steps so far and its last action. The file is rewritten
whole on each change (a new file renamed over the old, so a reader never sees half of one) and
removed when the run ends. `orchard tui` reads it (`read`).

An agent's steps reach it through `on_step`, which `played` calls after each step: it notes the
step for the attempt its thread works on (`Live.attempt` says which, in a context variable), and
does nothing outside a run.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Any

FILE = "live.json"
MAX_BYTES = 1 << 20
"""A larger file is not read (it is not one the runner wrote)."""
LAST_ACTION = 200
"""Characters kept of an attempt's last action."""

_current: ContextVar[tuple[Live, str] | None] = ContextVar("orchard_live_attempt", default=None)


class Live:
    """The attempts in flight of one run, kept in `folder / FILE`. Thread-safe."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / FILE
        self._lock = threading.Lock()
        self._attempts: dict[str, dict[str, Any]] = {}
        self._closed = False

    @contextlib.contextmanager
    def attempt(self, key: str, task: str, harness: str, sample: int) -> Iterator[None]:
        """Within the block, attempt `key` is in flight, and this thread's steps are its."""
        entry = {"task": task, "harness": harness, "sample": sample, "started": time.time()}
        self._change(key, {**entry, "phase": "solving", "steps": 0, "last": ""})
        token = _current.set((self, key))
        try:
            yield
        finally:
            _current.reset(token)
            self._change(key, None)

    def close(self) -> None:
        """The run ended: nothing is in flight (work abandoned at Ctrl-C writes nothing after)."""
        with self._lock:
            self._closed = True
            self._attempts.clear()
            self.path.unlink(missing_ok=True)

    def _change(self, key: str, fields: dict[str, Any] | None) -> None:
        with self._lock:
            if self._closed:
                return
            if fields is None:
                self._attempts.pop(key, None)
            elif key in self._attempts or "task" in fields:
                self._attempts[key] = {**self._attempts.get(key, {}), **fields}
            else:
                return
            partial = self.path.with_name(f".{FILE}.partial")
            with contextlib.suppress(OSError):  # a folder gone: the view is lost, not the run
                partial.write_text(json.dumps({"updated": time.time(), "attempts": self._attempts}))
                os.replace(partial, self.path)


def on_step(index: int, box: object, episode: Any) -> None:
    """`played`'s `on_step`: the step count and last action of the attempt this thread works on."""
    current = _current.get()
    if current is not None and episode.steps:
        live, key = current
        step = episode.steps[-1]
        last = "; ".join(action_text(a) for a in step.actions if isinstance(a, dict)) or step.format_error or ""
        live._change(key, {"steps": len(episode.steps), "last": last[:LAST_ACTION]})


def grading() -> None:
    """The attempt this thread works on is being graded."""
    current = _current.get()
    if current is not None:
        current[0]._change(current[1], {"phase": "grading"})


def action_text(action: dict[str, Any]) -> str:
    """One action as a list shows it: its name and its command or path (else its arguments)."""
    arguments = action.get("arguments")
    if isinstance(arguments, dict):
        inner = arguments.get("command") or arguments.get("path") or json.dumps(arguments)
        return f"{action.get('name')}: {inner if isinstance(inner, str) else json.dumps(inner)}"
    return str(action.get("name"))


def read(folder: Path) -> list[dict[str, Any]]:
    """The attempts in flight that `folder`'s `live.json` lists, oldest first; [] without one (or
    with one that is not what the runner writes)."""
    try:
        with open(folder / FILE, "rb") as f:
            text = f.read(MAX_BYTES + 1)
        data = json.loads(text) if len(text) <= MAX_BYTES else None
    except (OSError, ValueError):
        return []
    attempts = data.get("attempts") if isinstance(data, dict) else None
    if not isinstance(attempts, dict):
        return []
    fields: dict[str, Any] = {
        "task": str, "harness": str, "sample": int, "started": (int, float), "phase": str, "steps": int, "last": str,
    }  # fmt: skip
    found = []
    for entry in attempts.values():
        if isinstance(entry, dict) and all(isinstance(entry.get(k), kind) for k, kind in fields.items()):
            found.append({k: entry[k] for k in fields})
    return sorted(found, key=lambda entry: entry["started"])
