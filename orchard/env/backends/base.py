"""The Backend protocol and the plain data it speaks (`make_spec` checks what a user asks for into a spec)."""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Literal, Protocol

from orchard.errors import InvalidRequest

Network = Literal["blocked", "dropped", "open"]

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
    """`blocked`: no interface but loopback (the host still reaches the agent), so a connection out fails at
    once; `dropped`: as `blocked`, but a connection out times out, as on a network that drops packets
    (what tests of timeouts expect: graders use it); `open`: out to other hosts only (neither other
    sandboxes nor this host's services: see the backend's docstring)."""
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


def make_spec(
    image: str,
    *,
    network: Network = "blocked",
    cpu: float | None = None,
    memory: str | int | None = None,
    disk: str | int | None = None,
    tmpfs: dict[str, str | int] | None = None,
    ttl: float = 7200.0,
    env: dict[str, str] | None = None,
    run_id: str | None = None,
) -> SandboxSpec:
    """Validate what a user asks for (SDK arguments, a service request) into a spec, one clear error per mistake."""
    if not isinstance(image, str) or not image.strip():
        raise InvalidRequest("image must be a non-empty image reference such as orchard/base:bookworm")
    if network not in ("blocked", "dropped", "open"):
        raise InvalidRequest(f"network must be 'blocked', 'dropped' or 'open', not {network!r}")
    if cpu is not None and not (math.isfinite(cpu) and cpu > 0):
        raise InvalidRequest(f"cpu must be a positive number of cores, not {cpu}")
    if not (math.isfinite(ttl) and ttl > 0):
        raise InvalidRequest(f"ttl must be positive seconds, not {ttl}")
    folders: dict[str, int] = {}
    for path, size in (tmpfs or {}).items():
        if (
            not isinstance(path, str)
            or not path.startswith("/")
            or path.rstrip("/") in ("", "/.orchard", "/.orchard-run")
        ):
            raise InvalidRequest(f"tmpfs path {path!r} must be an absolute folder other than / and Orchard's own")
        parsed = parse_memory(size)
        if not parsed:
            raise InvalidRequest(f"tmpfs {path} needs a size such as 512Mi, not {size!r}")
        folders[path] = parsed
    return SandboxSpec(
        image=image,
        network=network,
        cpu=cpu,
        memory_bytes=parse_memory(memory),
        disk_bytes=parse_memory(disk),
        tmpfs=folders,
        ttl=ttl,
        env=dict(env or {}),
        run_id=run_id,
    )


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
