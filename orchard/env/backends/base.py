"""The Backend protocol and the plain data it speaks (`make_spec` checks what a user asks for into a spec)."""

from __future__ import annotations

import decimal
import math
import re
import time
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypedDict, overload

from orchard.errors import InvalidRequest

Network = Literal["blocked", "dropped", "open"]
DEFAULT_TTL = 7200.0
"""Seconds a sandbox lives unless it says otherwise, then the reaper deletes it."""

LABEL_PREFIX = "org.orchard."

SANDBOX_ID = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*")
"""The shape of a sandbox id, as Kubernetes takes it for the published service's pods: a DNS-1123
subdomain (dot-separated labels of lowercase letters, digits and '-', each starting and ending with a
letter or digit). Its length is bounded apart (`SANDBOX_ID_MAX_LENGTH`: this pattern is also handed
to pydantic, whose regex engine has no look-ahead); use `is_sandbox_id` for the whole rule.

An id names a container (`orchard-<id>`), a folder on the host and a URL path segment, so nothing
path-like may pass: no '/', and no empty label, hence no '.' or '..' of its own."""

SANDBOX_ID_MAX_LENGTH = 63
"""The longest sandbox id: the published service puts it in a Kubernetes label value (at most 63)."""


def is_sandbox_id(text: object) -> bool:
    """Whether `text` is a sandbox id Kubernetes would take: `SANDBOX_ID`, at most 63 characters."""
    return isinstance(text, str) and len(text) <= SANDBOX_ID_MAX_LENGTH and SANDBOX_ID.fullmatch(text) is not None


def check_sandbox_id(sandbox_id: str) -> str:
    """`sandbox_id` if it is one (`is_sandbox_id`), else a one-line InvalidRequest that says what an id is."""
    if not is_sandbox_id(sandbox_id):
        raise InvalidRequest(
            f"sandbox id {sandbox_id!r} is invalid: use up to {SANDBOX_ID_MAX_LENGTH} lowercase letters, "
            "digits, '-' or '.', starting and ending with a letter or digit"
        )
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
    ttl: float = DEFAULT_TTL
    """Seconds after which the reaper deletes the sandbox."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for every command."""
    workdir: str = "/workspace"
    """Default working directory of commands (created if missing)."""
    owner: str = ""
    """Who owns it: the manager's owner string (for orphan recovery)."""
    run_id: str | None = None
    """The run it belongs to, if any."""
    init: str | None = None
    """A shell command run once through the agent when the sandbox is ready, before it is handed
    out or held in a warm pool (a browser started, a service warmed up); one that fails fails the
    sandbox. Specs with different inits are different pools."""
    init_timeout: float = 60.0
    """Seconds `init` may run before it is killed, and the sandbox failed."""
    tools: bool = False
    """Mount the agent CLIs' bundle (`orchard.env.tools`, `orchard image build-tools`) read-only at
    `/.orchard-tools`; built on first use when missing (minutes)."""


MAX_INIT = 16 * 1024
"""The longest `init` command, in characters."""
MAX_INIT_TIMEOUT = 3600.0


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
    address: str | None = None
    """The agent's base URL once the backend knows it (a Pod's IP with its container ready), for a
    backend whose `create` returns an endpoint without one (`url` ""); None otherwise."""
    starting: bool = False
    """Not running yet, with nothing wrong so far (a Pod pending: scheduled, pulling, starting): keep
    waiting. False with `running` False is a failure, and `message` says why."""


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

    def pod_name(self, sandbox_id: str) -> str:
        """The name of what runs the sandbox in the engine (a container, a Pod), as operators see it."""
        ...

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


_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?", re.ASCII
)
"""A Kubernetes quantity (`k8s.io/apimachinery/pkg/api/resource`), case-sensitive: a signed decimal
number, then a binary suffix (`Ki` = 2^10 ... `Ei` = 2^60), a decimal one (`n u m` = 10^-9, 10^-6,
10^-3; `k M G T P E` = 10^3 ... 10^18) or an exponent (`e3`, `E-2`), never two of them (`1e3m` is
refused, as Kubernetes refuses it). So `16gi`, `2g`, `512MB` and `1_000` are not quantities."""

_SUFFIXES: dict[str, tuple[int, int]] = {"": (10, 0), "n": (10, -9), "u": (10, -6), "m": (10, -3)}
_SUFFIXES |= {unit: (10, 3 * power) for power, unit in enumerate("kMGTPE", start=1)}
_SUFFIXES |= {f"{unit}i": (2, 10 * power) for power, unit in enumerate("KMGTPE", start=1)}

_MAX_INT64 = 2**63 - 1
_NANO = decimal.Decimal("1e-9")


def _quantity(text: object, what: str, examples: str, most: str) -> decimal.Decimal:
    """The exact value of the Kubernetes quantity `text` (an int is its digits), rounded up to 10^-9.

    Kubernetes trims surrounding whitespace and rounds a finer value away from zero to 10^-9 (so
    a tiny positive quantity stays positive); so does this. A value beyond 10^20 is refused here as
    too large before it is built (an exponent may be huge), as is a non-positive one.
    """
    match = _QUANTITY.fullmatch(str(text).strip())
    if match is None:
        raise InvalidRequest(f"{what} {text!r} is not a Kubernetes quantity: use e.g. {examples}")
    number = decimal.Decimal(match["number"])
    suffix = match["suffix"] or ""
    base, power = _SUFFIXES.get(suffix) or (10, int(suffix[1:]) if len(suffix) < 40 else 2**63)
    if not -(2**63) <= power < 2**63:  # Kubernetes reads the exponent as an int64
        raise InvalidRequest(f"{what} {text!r} is not a Kubernetes quantity: its exponent is out of range")
    if number <= 0:
        raise InvalidRequest(f"{what} must be positive, not {text!r}")
    magnitude = number.adjusted() + (power if base == 10 else power * 0.302)  # log10 of the value, about
    if magnitude > 20:
        raise InvalidRequest(f"{what} {text!r} is too large: {most}")
    if magnitude < -10:
        return _NANO  # below 10^-9: Kubernetes rounds it up to 10^-9
    digits = len(number.as_tuple().digits)
    with decimal.localcontext(prec=digits + 40):  # enough for every digit: exact
        value = number.scaleb(power) if base == 10 else number * 2**power
        return value.quantize(_NANO, rounding=decimal.ROUND_UP)


@overload
def parse_memory(memory: str | int, what: str = "memory") -> int: ...
@overload
def parse_memory(memory: None, what: str = "memory") -> None: ...
def parse_memory(memory: str | int | None, what: str = "memory") -> int | None:
    """Bytes from a Kubernetes quantity (`16Gi`, `512Mi`, `1G`, `1e9`, an int); None for None.

    Kubernetes' spellings exactly (see `_QUANTITY`: `m` is milli, `M` mega; `16gi` is refused), so a
    size means here what it means to the published service's pods. A quantity that is not a whole
    number of bytes rounds up, as Kubernetes rounds it; at most 2^63-1 bytes. `what` names the
    value in errors (`disk`, `tmpfs /scratch`).
    """
    if memory is None:
        return None
    most = "at most 2^63-1 bytes"
    value = math.ceil(_quantity(memory, what, "512Mi, 16Gi or 1G", most))
    if value > _MAX_INT64:
        raise InvalidRequest(f"{what} {memory!r} is too large: {most}")
    return value


@overload
def parse_cpu(cpu: str | float) -> float: ...
@overload
def parse_cpu(cpu: None) -> None: ...
def parse_cpu(cpu: str | float | None) -> float | None:
    """CPU cores from a Kubernetes quantity (`2`, `0.5`, `2000m`, `1e3`, a number); None for None.

    Rounded up to a whole millicore, the finest share the kubelet gives a container (`100u` is 1m).
    """
    if cpu is None:
        return None
    most = "at most 2^63-1 millicores"
    millicores = math.ceil(_quantity(cpu, "cpu", "2, 0.5 or 500m", most) * 1000)
    if millicores > _MAX_INT64:
        raise InvalidRequest(f"cpu {cpu!r} is too large: {most}")
    return millicores / 1000


class SandboxOptions(TypedDict, total=False):
    """What a sandbox is made with besides its image, as `Client.create` and `Client.warm` (and
    their async twins) take it: keywords, each optional, its default `make_spec`'s."""

    network: Network
    """`blocked` (loopback only, the default), `dropped` (as blocked, connections out time out) or `open`."""
    cpu: str | float | None
    """CPU cores (a number or a Kubernetes quantity); none: no limit."""
    memory: str | int | None
    """Memory limit (bytes or a quantity such as `2Gi`); none: no limit."""
    disk: str | int | None
    """Cap on what the sandbox writes to its filesystem, where the backend can cap it."""
    tmpfs: dict[str, str | int] | None
    """In-memory folders: path -> size cap."""
    ttl: float
    """Seconds until the reaper deletes it (`DEFAULT_TTL`)."""
    env: dict[str, str] | None
    """Extra environment for every command."""
    run_id: str | None
    """The run it belongs to."""
    init: str | None
    """A shell command run once before the sandbox is handed out (a warm pool's sandboxes ran it)."""
    init_timeout: float
    """Seconds `init` may run (60)."""
    tools: bool
    """Mount the agent CLIs (codex, claude, opencode, pi, hermes, mini) read-only at `/.orchard-tools`."""


def make_spec(
    image: str,
    *,
    network: Network = "blocked",
    cpu: str | float | None = None,
    memory: str | int | None = None,
    disk: str | int | None = None,
    tmpfs: dict[str, str | int] | None = None,
    ttl: float = DEFAULT_TTL,
    env: dict[str, str] | None = None,
    run_id: str | None = None,
    init: str | None = None,
    init_timeout: float = 60.0,
    tools: bool = False,
) -> SandboxSpec:
    """Validate what a user asks for (SDK arguments, a service request: `SandboxOptions`) into a
    spec, one clear error per mistake. The defaults here are every entry point's."""
    check_init(init, init_timeout)
    if not isinstance(image, str) or not image.strip():
        raise InvalidRequest("image must be a non-empty image reference such as orchard/base:bookworm")
    if network not in ("blocked", "dropped", "open"):
        raise InvalidRequest(f"network must be 'blocked', 'dropped' or 'open', not {network!r}")
    if not (math.isfinite(ttl) and ttl > 0):
        raise InvalidRequest(f"ttl must be positive seconds, not {ttl}")
    folders: dict[str, int] = {}
    for path, size in (tmpfs or {}).items():
        if (
            not isinstance(path, str)
            or not path.startswith("/")
            or path.rstrip("/") in ("", "/.orchard", "/.orchard-run", "/.orchard-tools")
        ):
            raise InvalidRequest(f"tmpfs path {path!r} must be an absolute folder other than / and Orchard's own")
        if size is None:
            raise InvalidRequest(f"tmpfs {path} needs a size such as 512Mi")
        folders[path] = parse_memory(size, f"tmpfs {path}")
    return SandboxSpec(
        image=image,
        network=network,
        cpu=parse_cpu(cpu),
        memory_bytes=parse_memory(memory),
        disk_bytes=parse_memory(disk, "disk"),
        tmpfs=folders,
        ttl=ttl,
        env=dict(env or {}),
        run_id=run_id,
        init=init,
        init_timeout=float(init_timeout),
        tools=bool(tools),
    )


def check_init(init: object, init_timeout: object) -> None:
    """An init command is None or a non-blank string of at most `MAX_INIT` characters without NUL,
    and its timeout positive seconds up to `MAX_INIT_TIMEOUT`."""
    if init is not None and not (isinstance(init, str) and init.strip() and "\0" not in init and len(init) <= MAX_INIT):
        raise InvalidRequest(f"init must be a shell command of 1 to {MAX_INIT} characters (no NUL), or None")
    if (
        isinstance(init_timeout, bool)
        or not isinstance(init_timeout, int | float)
        or not (math.isfinite(init_timeout) and 0 < init_timeout <= MAX_INIT_TIMEOUT)
    ):
        raise InvalidRequest(f"init_timeout must be positive seconds up to {MAX_INIT_TIMEOUT:g}, not {init_timeout!r}")


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
