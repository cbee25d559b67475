"""Finding the `orchard up` service of this ORCHARD_HOME: its state file, and whether it answers.

The service writes where it runs (pid, URL, API key) to `settings().service_state`, mode 0600,
when it starts, and removes it when it stops; the CLI and the SDK read it to find the service
and its key. This module owns that file: the service writes it through here, and everything
else reads it through here. ORCHARD_URL (or SANDBOX_BASE_URL) names a service explicitly instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

from orchard.config import private_folder, settings
from orchard.process import process_alive


def read_state() -> dict | None:
    """What the state file says (pid, url, api_key, started_at), or None without a readable one."""
    try:
        state = json.loads(settings().service_state.read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def write_state(url: str, api_key: str, backend: dict | None = None) -> None:
    """Record that this process serves `url` with `api_key` over `backend` (its name and config, so
    `orchard down` reaps leftovers where they are), mode 0600, replaced atomically."""
    path = settings().service_state
    private_folder(path.parent)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    state = {"pid": os.getpid(), "url": url, "api_key": api_key, "started_at": time.time(), "backend": backend}
    with os.fdopen(fd, "w") as f:
        json.dump(state, f)
    os.replace(tmp, path)


def remove_state() -> None:
    """Remove the state file if it is this process's."""
    state = read_state()
    if state is not None and state.get("pid") == os.getpid():
        with contextlib.suppress(OSError):
            settings().service_state.unlink()


def running_service() -> dict | None:
    """The state of the `orchard up` service of this ORCHARD_HOME, if it runs and answers."""
    state = read_state()
    if state is None or not process_alive(state.get("pid", 0)):
        return None
    return state if service_healthy(state["url"]) else None


def running_service_url() -> str | None:
    """ORCHARD_URL / SANDBOX_BASE_URL, else the URL of a local running service, else None."""
    return settings().service_url or (running_service() or {}).get("url")


def service_healthy(url: str) -> bool:
    """Whether an Orchard service answers its health check at `url`."""
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def local_service_key(url: str) -> str | None:
    """The key `orchard up` stored when it serves `url` on this host (None for any other URL)."""
    state = read_state() or {}
    return state.get("api_key") if state.get("url", "").rstrip("/") == url.rstrip("/") else None
