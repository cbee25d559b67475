"""The Backend protocol and the plain data it speaks."""

from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Literal, Protocol

from orchard.errors import InvalidRequest

Network = Literal["blocked", "open"]

LABEL_PREFIX = "org.orchard."

SANDBOX_ID = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
"""What a sandbox id may be: it names a container, a folder and a URL path, so nothing path-like."""


def check_sandbox_id(sandbox_id: str) -> str:
    """Refuse ids that are not 1-40 of [a-z0-9-] (no `..`, no `/`), with a clear message."""
    if not isinstance(sandbox_id, str) or not SANDBOX_ID.fullmatch(sandbox_id):
        raise InvalidRequest(f"sandbox id {sandbox_id!r} is invalid: use 1-40 lowercase letters, digits or '-'")
    return sandbox_id


@dataclass(frozen=True)
class SandboxSpec:
    """What to start: an unmodified image plus policy and limits."""

    image: str
    network: Network = "blocked"
    """`blocked`: no interface but loopback (the host still reaches the agent); `open`: out to other hosts only
    (neither other sandboxes nor this host's services: see the backend's docstring)."""
    cpu: float | None = None
    """CPU cores (fractions allowed); None = no limit."""
    memory_bytes: int | None = None
    """Memory limit in bytes; None = no limit."""
    pids: int | None = 4096
    """Most processes at once (a fork bomb stops here)."""
    disk_bytes: int | None = None
    """Cap on what the sandbox writes to its filesystem, where the backend can cap it."""
    tmpfs: dict[str, int] = field(default_factory=dict)
    """In-memory folders (path: size cap in bytes); they count against the memory limit."""
    ttl: float = 7200.0
    """Seconds after which the reaper deletes the sandbox."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for every command."""
    workdir: str = "/workspace"
    """Default working directory of commands (created if missing)."""
    owner: str = ""
    """Who owns it: the manager's owner string (for orphan recovery)."""
    run_id: str | None = None
    """The run it belongs to, if any."""


@dataclass(frozen=True)
class AgentEndpoint:
    """How to reach the exec agent of one sandbox: a Unix socket or a URL, and its token."""

    token: str
    uds: str | None = None
    """Path of the agent's Unix socket on this host, when routed by socket."""
    url: str = "http://agent"
    """Base URL (the host part is ignored for a Unix socket)."""


@dataclass(frozen=True)
class SandboxState:
    """What the backend knows of a sandbox's container."""

    running: bool
    exists: bool = True
    message: str | None = None
    """Why it is not running (exit code, last log lines), if it is not."""


@dataclass(frozen=True)
class BackendSandbox:
    """A sandbox found in the backend by its labels."""

    sandbox_id: str
    labels: dict[str, str]

    @property
    def owner(self) -> str:
        return self.labels.get(LABEL_PREFIX + "owner", "")

    @property
    def expires_at(self) -> float:
        created = float(self.labels.get(LABEL_PREFIX + "created", "0") or 0)
        ttl = float(self.labels.get(LABEL_PREFIX + "ttl", "0") or 0)
        return created + ttl


class Backend(Protocol):
    """Lifecycle of sandboxes in one engine: create, inspect, delete, list. Thread-safe."""

    name: str

    def create(self, sandbox_id: str, spec: SandboxSpec, token: str) -> AgentEndpoint:
        """Start the sandbox with the agent injected; return at once, before the agent answers."""
        ...

    def state(self, sandbox_id: str) -> SandboxState:
        """Whether the sandbox's container runs, and why not."""
        ...

    def seal(self, sandbox_id: str) -> None:
        """Close what the sandbox could still write on the host, once its agent answers."""
        ...

    def delete(self, sandbox_id: str, owner: str | None = None) -> None:
        """Remove the sandbox and everything it holds; idempotent.

        Acts only on what the backend made for `sandbox_id` (for `owner`, when given): anything
        else of that name raises NotFound and is left alone.
        """
        ...

    def list(self) -> list[BackendSandbox]:
        """Every sandbox Orchard created in this engine, whoever owns it."""
        ...


_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_UNITS |= {f"{unit}i": 2 ** (10 * power) for power, unit in enumerate("kmgt", start=1)}


def parse_memory(memory: str | int | None) -> int | None:
    """Bytes from `16Gi`, `512Mi`, `2g`, `1000000` or an int (Kubernetes and Docker spellings)."""
    if memory is None:
        return None
    text = str(memory).strip().lower()
    number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(number) :].removesuffix("b")
    try:
        value = int(float(number) * _UNITS[unit])
    except (ValueError, KeyError, OverflowError):
        raise InvalidRequest(f"memory {memory!r} is not a size: use e.g. 512Mi, 2Gi or a number of bytes") from None
    if value <= 0:
        raise InvalidRequest(f"memory must be positive, not {memory!r}")
    return value


def labels_for(sandbox_id: str, spec: SandboxSpec) -> dict[str, str]:
    """Labels that let any later process find, expire and adopt a sandbox."""
    labels = {
        "managed": "true",
        "sandbox": sandbox_id,
        "owner": spec.owner,
        "created": f"{time.time():.3f}",
        "ttl": f"{spec.ttl:.0f}",
        "network": spec.network,
    }
    if spec.run_id:
        labels["run"] = spec.run_id
    return {LABEL_PREFIX + k: v for k, v in labels.items()}


def process_owner(pid: int | None = None) -> str:
    """An owner string naming this process uniquely over time: host, pid and start time."""
    pid = pid or os.getpid()
    return f"{socket.gethostname()}:{pid}:{_start_time(pid)}"


def owner_alive(owner: str) -> bool:
    """False only when `owner` names a process of this host that is gone (pid reuse included)."""
    host, _, rest = owner.partition(":")
    pid_text, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return True  # not ours to judge: another host, or a named owner such as a service
    return _start_time(int(pid_text)) == started != ""


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' if no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return ""
    return stat.rsplit(b")", 1)[1].split()[19].decode()
