"""The SDK: `Client` / `AsyncClient` create sandboxes, `Sandbox` / `AsyncSandbox` use them.

    from orchard.env import Client

    with Client() as client:                      # embedded: a manager in this process
        with client.create("orchard/base:bookworm") as box:
            print(box.exec("python3 --version").stdout)

`Client()` runs an embedded manager on the local Docker engine, and commands go straight to each
sandbox's agent over a pooled keep-alive Unix socket connection. `Client(url=...)` (or
`ORCHARD_URL` / `SANDBOX_BASE_URL` in the environment) talks to an `orchard up` service instead;
the API is the same. Sandboxes a client created are deleted when it closes, at interpreter exit,
and on SIGTERM (SIGINT unwinds `with` blocks as KeyboardInterrupt does).

`AsyncClient` / `AsyncSandbox` are the asyncio twins, method for method. The two clients share
one core (`_Core`), as the two handles share the wire calls of `calls.py`: it holds where
sandboxes come from, and writes each lifecycle operation once as a plan of steps (a call to the
service, or work of the embedded manager) that `Client` runs in line and `AsyncClient` awaits,
the manager's work in a worker thread.
"""

from __future__ import annotations

import asyncio
import atexit
import builtins
import contextlib
import io
import json
import logging
import signal
import socket
import sys
import tarfile
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import httpx

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from orchard.env.backends.base import SandboxOptions

from orchard.config import settings
from orchard.env.agent.protocol import CONNECT_ROUTE, HTTP_DEFAULT_MAX_BYTES, TUNNEL_MAX_WAIT
from orchard.env.archive import Download
from orchard.env.backends import BackendConfig
from orchard.env.backends.base import AgentEndpoint, SandboxSpec, check_sandbox_id, make_spec
from orchard.env.calls import (
    ARCHIVE_LIMIT,
    READ_LIMIT,
    TUNNEL_MAX_HEAD,
    AgentCalls,
    Call,
    Channel,
    ExecResult,
    FileInfo,
    HttpAnswer,
    PatchResult,
    ServiceCalls,
    ServiceSandboxes,
    asend,
    check_port,
    command_text,
    http_content,
    send,
    tunnel_answer,
    tunnel_request,
)
from orchard.env.discovery import local_service_key
from orchard.env.manager import SandboxInfo, SandboxManager, agent_http, async_agent_http
from orchard.env.pty import (
    AgentFrames,
    AsyncAgentFrames,
    AsyncFrames,
    AsyncServiceFrames,
    AsyncTerminal,
    Frames,
    ServiceFrames,
    Terminal,
    init_frame,
)
from orchard.env.transport import AgentChannel, AsyncAgentChannel, AsyncHttpxChannel, HttpxChannel, connect_agent
from orchard.errors import AgentError, ConfigError, Conflict, InvalidRequest, OrchardError, SandboxError
from orchard.store import Store

__all__ = [
    "AsyncClient",
    "AsyncSandbox",
    "Client",
    "ExecResult",
    "Exposure",
    "FileInfo",
    "HttpAnswer",
    "PatchResult",
    "Sandbox",
]

_open_clients: weakref.WeakSet = weakref.WeakSet()

DEFAULT_EXEC_TIMEOUT = 300.0
"""Seconds a command may run unless told otherwise (the service API's default too)."""
EXPOSE_ACCEPTORS = 4
"""`/accept` calls kept waiting in the agent at once: connections made together are taken together."""
EXPOSE_MAX_CONNECTIONS = 64
EXPOSE_IDLE_SECONDS = 300.0
EXPOSE_WAIT_SECONDS = 30.0
"""How long one `/accept` waits in the agent before the host asks again."""
EXPOSE_CONNECT_SECONDS = 10.0
"""The most a connect to the target may take."""
EXPOSE_CHUNK = 256 * 1024
EXPOSE_REFUSAL = 64 * 1024
"""Bytes read of the agent's answer when it refuses an `/accept`."""


class Sandbox:
    """One live sandbox: run commands, move files, apply patches, call its services. Use as a context manager."""

    def __init__(
        self,
        sandbox_id: str,
        image: str,
        http: Channel,
        calls: AgentCalls | ServiceCalls,
        on_delete: Callable[[str], None],
        on_exec: Callable[[str, str, ExecResult, float], None] | None = None,
        owns_http: bool = True,
        frames: Callable[[], Frames] | None = None,
    ):
        self.id = sandbox_id
        self.image = image
        self._http, self._calls, self._on_delete, self._on_exec = http, calls, on_delete, on_exec
        self._owns_http = owns_http
        self._frames = frames
        self._deleted = False
        self._exposures = _Exposures()

    def exec(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = DEFAULT_EXEC_TIMEOUT,
        login_shell: bool = False,
        stdin: bytes | None = None,
        session: str | None = None,
    ) -> ExecResult:
        """Run `command` (a shell string, or a list quoted for the shell) and wait for it.

        After `timeout` seconds its whole process group is killed (exit code 124); None means no
        limit when talking to the agent directly, and the service's 300 s otherwise. With
        `session`, it runs in that persistent shell (started on first use), as in a terminal: cd,
        variables and functions carry over to the next command of the session, and a command
        costs no new shell. A timeout there kills the session, which starts afresh next time.
        """
        started = time.time()
        result = self._send(
            self._calls.exec(
                command, cwd=cwd, env=env, timeout=timeout, login_shell=login_shell, stdin=stdin, session=session
            )
        )
        if self._on_exec:
            self._on_exec(self.id, command_text(command), result, started)
        return result

    def close_session(self, session: str) -> bool:
        """End a persistent shell session and what it started; False if there was none."""
        return self._send(self._calls.close_session(session))

    def read_file(self, path: str, *, max_bytes: int = READ_LIMIT) -> bytes:
        """The bytes of a file (relative paths are under /workspace).

        It is held in memory, so one over `max_bytes` is refused (`TooLarge`); `download` streams.
        """
        return self._send(self._calls.read_file(path, max_bytes))

    def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> int:
        """Write a file, creating its folders; returns its size."""
        return self._send(self._calls.write_file(path, _bytes(data), mode))

    def list_files(self, path: str = ".") -> list[FileInfo]:
        """Entries of a folder, sorted by name."""
        return self._send(self._calls.list_files(path))

    def upload(self, local: str | Path, remote: str) -> None:
        """Copy a local file or folder to `remote` in the sandbox (a folder's contents go into `remote`)."""
        local = Path(local)
        if local.is_dir():
            self._send(self._calls.put_archive(remote, pack_folder(local)))
        else:
            self.write_file(remote, local.read_bytes(), mode=local.stat().st_mode & 0o777)

    def download(self, remote: str, local: str | Path, *, max_bytes: int = ARCHIVE_LIMIT) -> list[str]:
        """Copy a file or folder of the sandbox to `local` on this host (into it if it is a folder).

        Only files and folders are written, only there (see `orchard.env.archive`); links are
        skipped, with a warning, and their names returned. Past `max_bytes` (of the archive, and
        of its files in all) it raises `TooLarge` and writes nothing.
        """
        with Download(Path(local)) as download:
            self._send(self._calls.get_archive(remote, download.file, max_bytes))
            return download.finish(max_bytes)

    def apply_patch(self, patch: str, *, timeout: float = 30.0) -> PatchResult:
        """`git apply` a unified diff in /workspace."""
        return self._send(self._calls.apply_patch(patch, timeout))

    def http(
        self,
        path: str,
        *,
        port: int,
        method: str = "POST",
        json: Any = None,
        body: bytes | str | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
        max_bytes: int = HTTP_DEFAULT_MAX_BYTES,
    ) -> HttpAnswer:
        """One HTTP request to a service listening on the sandbox's own loopback, `127.0.0.1:port`.

        The sandbox's agent sends it (no port is published, nothing else is reached, and a
        `blocked` network is fine): `path` is the request target (`/notes/get?id=1`), never a URL.
        `json` sends a JSON body with `Content-Type: application/json`; `body` sends bytes as
        they are. Every status is an answer (a 404 or 500 is an `HttpAnswer`); nothing listening,
        no answer within `timeout` seconds, or one that is not HTTP raise `AgentError`. At most
        `max_bytes` of the body is kept (16 MiB at most; `truncated` says there was more).
        """
        content, headers = http_content(json, body, headers)
        call = self._calls.http(
            port, path, method=method, body=content, headers=headers, timeout=timeout, max_bytes=max_bytes
        )
        return self._send(call)

    def terminal(
        self,
        cmd: Sequence[str] | None = None,
        *,
        rows: int = 24,
        cols: int = 80,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        login_shell: bool = False,
    ) -> Terminal:
        """Start `cmd` (default: an interactive shell) on a pseudo-terminal; read it until `exit`.

        The process ends when the terminal is closed (TERM), or with the connection.
        """
        if self._deleted:
            raise SandboxError(f"sandbox {self.id} was deleted")
        if self._frames is None:
            raise ConfigError("this sandbox handle cannot open terminals")
        frames = self._frames()
        try:
            frames.send(init_frame(cmd, rows=rows, cols=cols, env=env, cwd=cwd, login_shell=login_shell))
        except BaseException:
            frames.close()
            raise
        return Terminal(frames)

    def expose(
        self,
        port: int,
        target: tuple[str, int],
        *,
        max_connections: int = EXPOSE_MAX_CONNECTIONS,
        idle_timeout: float = EXPOSE_IDLE_SECONDS,
    ) -> Exposure:
        """Make `127.0.0.1:port` inside the sandbox reach `target`, a `(host, port)` of this host.

        A process in the sandbox connects to `127.0.0.1:port` (an agent CLI calling a model
        server of this host, say `orchard proxy`) and its bytes arrive at `target`, sent from
        this host, while the sandbox's network stays `blocked`: the exec agent carries them (see
        `Exposure` for how, and for what the sandbox cannot make the host do). At most
        `max_connections` at once, each ended after `idle_timeout` seconds without a byte.
        Returns the open `Exposure`: close it, or use `with`; deleting the sandbox closes it too.
        `Conflict` when something in the sandbox holds the port. Needs a direct client (embedded,
        on Docker or Kubernetes); a sandbox of an `orchard up` service cannot, for now.
        """
        if self._deleted:
            raise SandboxError(f"sandbox {self.id} was deleted")
        if not isinstance(self._http, AgentChannel):
            raise ConfigError(_EXPOSE_NEEDS_AGENT)
        endpoint = self._http.endpoint
        return self._exposures.open(
            port,
            lambda: Exposure(endpoint, port, target, max_connections=max_connections, idle_timeout=idle_timeout),
        )

    def connect(self, port: int, *, timeout: float = 10.0) -> socket.socket:
        """A connected socket to `127.0.0.1:port` inside the sandbox: its agent connects there
        (`POST /connect`) and carries the raw bytes both ways, so nothing is published and a
        `blocked` network is fine (a browser's DevTools port is driven this way). The socket is
        yours to close; what comes through it is the sandbox's, to be taken as hostile input.
        `AgentError` when nothing listens there or no connection is made within `timeout` seconds.
        Needs a direct client, as `expose` does."""
        if self._deleted:
            raise SandboxError(f"sandbox {self.id} was deleted")
        if not isinstance(self._http, AgentChannel):
            raise ConfigError(_EXPOSE_NEEDS_AGENT.replace("expose", "connect", 1))
        if not (isinstance(timeout, int | float) and 0 < timeout <= TUNNEL_MAX_WAIT):
            raise InvalidRequest(f"timeout must be a number of seconds above 0, at most {TUNNEL_MAX_WAIT:g}")
        endpoint = self._http.endpoint
        sock = connect_agent(endpoint, EXPOSE_CONNECT_SECONDS)
        deadline = time.monotonic() + timeout + EXPOSE_CONNECT_SECONDS
        try:
            sock.settimeout(timeout + EXPOSE_CONNECT_SECONDS)
            sock.sendall(tunnel_request(port, timeout, f"Bearer {endpoint.token}", CONNECT_ROUTE))
            head = _read_head_exactly(sock, CONNECT_ROUTE, deadline)
            status, length = tunnel_answer(head, CONNECT_ROUTE)
            if status != 101:
                raise AgentError(f"HTTP {status}: {_refusal(sock, b'', length)}")
            sock.settimeout(None)
            return sock
        except AgentError:
            sock.close()
            raise
        except OSError as exc:  # a timeout, a reset: the agent's failure, not the caller's bug
            sock.close()
            raise AgentError(f"the sandbox's agent did not open a stream to port {port}: {exc}") from None
        except BaseException:
            sock.close()
            raise

    def delete(self) -> None:
        """Delete the sandbox, after closing what it exposes; idempotent (a failed delete may be retried)."""
        if self._deleted:
            return
        self._exposures.close()
        self._on_delete(self.id)
        self._deleted = True
        if self._owns_http:
            self._http.close()

    def _send(self, call: Call) -> Any:
        if self._deleted:
            raise SandboxError(f"sandbox {self.id} was deleted")
        return send(self._http, call)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.delete()

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.image}{' deleted' if self._deleted else ''}>"


class AsyncSandbox:
    """The async twin of `Sandbox`."""

    def __init__(
        self,
        sandbox_id: str,
        image: str,
        http: AsyncAgentChannel | AsyncHttpxChannel,
        calls: AgentCalls | ServiceCalls,
        on_delete: Callable[[str], Awaitable[None]],
        on_exec: Callable[[str, str, ExecResult, float], None] | None = None,
        owns_http: bool = True,
        frames: Callable[[], Awaitable[AsyncFrames]] | None = None,
    ):
        self.id, self.image = sandbox_id, image
        self._http, self._calls, self._on_delete, self._on_exec = http, calls, on_delete, on_exec
        self._owns_http = owns_http
        self._frames = frames
        self._deleted = False
        self._exposures = _Exposures()

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = DEFAULT_EXEC_TIMEOUT,
        login_shell: bool = False,
        stdin: bytes | None = None,
        session: str | None = None,
    ) -> ExecResult:
        """Run `command` and wait for it (see `Sandbox.exec`)."""
        started = time.time()
        result = await self._send(
            self._calls.exec(
                command, cwd=cwd, env=env, timeout=timeout, login_shell=login_shell, stdin=stdin, session=session
            )
        )
        if self._on_exec:
            self._on_exec(self.id, command_text(command), result, started)
        return result

    async def close_session(self, session: str) -> bool:
        """End a persistent shell session and what it started."""
        return await self._send(self._calls.close_session(session))

    async def read_file(self, path: str, *, max_bytes: int = READ_LIMIT) -> bytes:
        """The bytes of a file (see `Sandbox.read_file`)."""
        return await self._send(self._calls.read_file(path, max_bytes))

    async def write_file(self, path: str, data: bytes | str, *, mode: int | None = None) -> int:
        """Write a file, creating its folders."""
        return await self._send(self._calls.write_file(path, _bytes(data), mode))

    async def list_files(self, path: str = ".") -> list[FileInfo]:
        """Entries of a folder."""
        return await self._send(self._calls.list_files(path))

    async def upload(self, local: str | Path, remote: str) -> None:
        """Copy a local file or folder into the sandbox."""
        local = Path(local)
        if local.is_dir():
            await self._send(self._calls.put_archive(remote, await asyncio.to_thread(pack_folder, local)))
        else:
            await self.write_file(remote, local.read_bytes(), mode=local.stat().st_mode & 0o777)

    async def download(self, remote: str, local: str | Path, *, max_bytes: int = ARCHIVE_LIMIT) -> list[str]:
        """Copy a file or folder out of the sandbox (see `Sandbox.download`)."""
        with Download(Path(local)) as download:
            await self._send(self._calls.get_archive(remote, download.file, max_bytes))
            return await asyncio.to_thread(download.finish, max_bytes)

    async def apply_patch(self, patch: str, *, timeout: float = 30.0) -> PatchResult:
        """`git apply` a unified diff in /workspace."""
        return await self._send(self._calls.apply_patch(patch, timeout))

    async def http(
        self,
        path: str,
        *,
        port: int,
        method: str = "POST",
        json: Any = None,
        body: bytes | str | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
        max_bytes: int = HTTP_DEFAULT_MAX_BYTES,
    ) -> HttpAnswer:
        """One HTTP request to a service on the sandbox's loopback (see `Sandbox.http`)."""
        content, headers = http_content(json, body, headers)
        call = self._calls.http(
            port, path, method=method, body=content, headers=headers, timeout=timeout, max_bytes=max_bytes
        )
        return await self._send(call)

    async def terminal(
        self,
        cmd: Sequence[str] | None = None,
        *,
        rows: int = 24,
        cols: int = 80,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        login_shell: bool = False,
    ) -> AsyncTerminal:
        """Start `cmd` (default: an interactive shell) on a pseudo-terminal (see `Sandbox.terminal`)."""
        if self._deleted:
            raise SandboxError(f"sandbox {self.id} was deleted")
        if self._frames is None:
            raise ConfigError("this sandbox handle cannot open terminals")
        frames = await self._frames()
        try:
            await frames.send(init_frame(cmd, rows=rows, cols=cols, env=env, cwd=cwd, login_shell=login_shell))
        except BaseException:
            await frames.close()
            raise
        return AsyncTerminal(frames)

    async def expose(
        self,
        port: int,
        target: tuple[str, int],
        *,
        max_connections: int = EXPOSE_MAX_CONNECTIONS,
        idle_timeout: float = EXPOSE_IDLE_SECONDS,
    ) -> Exposure:
        """Make `127.0.0.1:port` inside the sandbox reach `target` of this host (see `Sandbox.expose`).

        The `Exposure` runs in threads of its own, not on the event loop; its `close()` blocks
        briefly (one call to the agent), so call it through `asyncio.to_thread` where that matters.
        """
        if self._deleted:
            raise SandboxError(f"sandbox {self.id} was deleted")
        if not isinstance(self._http, AsyncAgentChannel):
            raise ConfigError(_EXPOSE_NEEDS_AGENT)
        endpoint = self._http.endpoint
        return await asyncio.to_thread(
            self._exposures.open,
            port,
            lambda: Exposure(endpoint, port, target, max_connections=max_connections, idle_timeout=idle_timeout),
        )

    async def delete(self) -> None:
        """Delete the sandbox, after closing what it exposes; idempotent (a failed delete may be retried)."""
        if self._deleted:
            return
        if self._exposures:
            await asyncio.to_thread(self._exposures.close)
        await self._on_delete(self.id)
        self._deleted = True
        if self._owns_http:
            await self._http.aclose()

    async def _send(self, call: Call) -> Any:
        if self._deleted:
            raise SandboxError(f"sandbox {self.id} was deleted")
        return await asend(self._http, call)

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.delete()

    def __repr__(self) -> str:
        return f"<AsyncSandbox {self.id} {self.image}{' deleted' if self._deleted else ''}>"


# -- a port of the host inside the sandbox (Sandbox.expose) ------------------------------

log = logging.getLogger("orchard.env.expose")


def _target(target: Any) -> tuple[str, int]:
    if not (isinstance(target, tuple) and len(target) == 2 and isinstance(target[0], str) and target[0]):
        raise InvalidRequest(f"target must be a (host, port) pair of this host, not {target!r:.80}")
    return target[0], check_port(target[1], "the target's port")


class _Pair:
    """One connection of the sandbox carried to the target: its two sockets, and when a byte last moved."""

    __slots__ = ("agent", "last", "target")

    def __init__(self, agent: socket.socket):
        self.agent = agent
        self.target: socket.socket | None = None
        self.last = time.monotonic()

    def shut(self) -> None:
        """End both directions now (the threads blocked on either socket wake up)."""
        for sock in (self.agent, self.target):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class Exposure:
    """A port of a sandbox's loopback whose connections are carried to one address of this host.

    Made by `Sandbox.expose(port, target)`. The agent listens on `127.0.0.1:port` in the sandbox
    (`POST /listen`); the host keeps `EXPOSE_ACCEPTORS` upgraded `POST /accept` calls waiting
    there, and each connection a process of the sandbox makes comes back on one of them, raw.
    The host then connects to `target` and splices the bytes both ways until both ends are done
    (a half-close is passed on). The network of the sandbox stays as it is (`blocked` is fine):
    the host connects to the agent, never the reverse.

    The sandbox is hostile, its agent included, and it can make the host do nothing else:

    * the host connects to `target` only: no answer of the agent names an address, and none is
      read from one (what the sandbox sends is bytes for the target, which must take them as
      hostile input: they are a sandbox's requests);
    * at most `max_connections` connections at once (waiting `/accept` calls included: the
      host asks for no more while that many are open), each ended after `idle_timeout` seconds
      without a byte either way;
    * what the agent answers to `/accept` is bounded (`TUNNEL_MAX_HEAD`) and checked; an answer
      that is not one, or a failure, is logged once (a warning, no traceback) and the call is
      asked again after a pause that doubles up to 5 s (an agent answering at once cannot make
      the host spin).

    `close()` (or the end of a `with` block, or deleting the sandbox) stops listening in the
    sandbox (new connections are refused there) and ends every carried connection.
    """

    def __init__(
        self,
        endpoint: AgentEndpoint,
        port: int,
        target: tuple[str, int],
        *,
        max_connections: int = EXPOSE_MAX_CONNECTIONS,
        idle_timeout: float = EXPOSE_IDLE_SECONDS,
        wait: float = EXPOSE_WAIT_SECONDS,
    ):
        self.port, self.target = check_port(port), _target(target)
        if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
            raise InvalidRequest(f"max_connections must be a positive integer, not {max_connections!r:.40}")
        if not (isinstance(idle_timeout, int | float) and idle_timeout > 0):
            raise InvalidRequest(f"idle_timeout must be a positive number of seconds, not {idle_timeout!r:.40}")
        if not (isinstance(wait, int | float) and 0 < wait <= TUNNEL_MAX_WAIT):
            raise InvalidRequest(f"wait must be a number of seconds above 0, at most {TUNNEL_MAX_WAIT:g}")
        self.max_connections, self.idle_timeout, self.wait = max_connections, float(idle_timeout), float(wait)
        self.carried = 0
        """Connections of the sandbox carried to the target so far."""
        self._endpoint, self._auth = endpoint, f"Bearer {endpoint.token}"
        self._channel = AgentChannel(endpoint)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._waiting: set[socket.socket] = set()
        self._pairs: set[_Pair] = set()
        self._threads: set[threading.Thread] = set()
        self._logged: set[str] = set()
        try:
            send(self._channel, AgentCalls().listen(self.port))
        except BaseException:
            self._channel.close()
            raise
        for _ in range(min(EXPOSE_ACCEPTORS, max_connections)):
            self._start(self._accept_loop)
        self._start(self._reap_idle)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def active(self) -> int:
        """Connections of the sandbox carried right now."""
        with self._lock:
            return len(self._pairs)

    def close(self) -> None:
        """Stop listening in the sandbox and end every carried connection; idempotent."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
        with contextlib.suppress(OrchardError, OSError):
            send(self._channel, AgentCalls().unlisten(self.port))  # wakes the waiting /accept calls too
        self._channel.close()
        with self._lock:
            waiting, pairs, threads = list(self._waiting), list(self._pairs), list(self._threads)
        for sock in waiting:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for pair in pairs:
            pair.shut()
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(EXPOSE_CONNECT_SECONDS)

    def __enter__(self) -> Exposure:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.active} open"
        return f"<Exposure sandbox 127.0.0.1:{self.port} -> {self.target[0]}:{self.target[1]} {state}>"

    # the threads ----------------------------------------------------------------------

    def _start(self, run: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=self._run, args=(run, *args), name=f"orchard-expose-{self.port}", daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def _run(self, run: Callable[..., None], *args: Any) -> None:
        try:
            run(*args)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _accept_loop(self) -> None:
        """Keep one `/accept` waiting in the agent while there is room; hand each tunnel to a pair."""
        sock: socket.socket | None = None
        failures = 0
        try:
            while not self._closed.is_set():
                if not self._slots.acquire(timeout=1.0):
                    continue  # at the bound: wait for a connection to end
                try:
                    if sock is None:
                        sock = self._connect()
                    first = self._ask(sock)
                except (OSError, ValueError, OrchardError) as exc:
                    self._slots.release()
                    self._forget(sock)
                    sock = None
                    failures += 1
                    self._trouble("agent", f"the sandbox's agent failed an /accept: {exc}")
                    self._closed.wait(min(0.1 * 2 ** (failures - 1), 5.0))
                    continue
                failures = 0
                if first is None:  # nothing came in time: ask again on the same connection
                    self._slots.release()
                    continue
                self._forget(sock, close=False)
                self._start(self._carry_pair, sock, first)
                sock = None
        finally:
            self._forget(sock)

    def _connect(self) -> socket.socket:
        sock = connect_agent(self._endpoint, EXPOSE_CONNECT_SECONDS)
        with self._lock:
            if self._closed.is_set():
                sock.close()
                raise AgentError("the exposure is closed")
            self._waiting.add(sock)
        return sock

    def _forget(self, sock: socket.socket | None, close: bool = True) -> None:
        """Stop tracking a connection waiting on `/accept` (and close it, unless it became a tunnel)."""
        if sock is not None:
            with self._lock:
                self._waiting.discard(sock)
            if close:
                sock.close()

    def _ask(self, sock: socket.socket) -> bytes | None:
        """One `/accept`: the tunnel's first bytes (maybe none) once it is open, None if no
        connection came in time; AgentError for an answer that is neither."""
        started = time.monotonic()
        sock.settimeout(self.wait + EXPOSE_CONNECT_SECONDS)
        sock.sendall(tunnel_request(self.port, self.wait, self._auth))
        head, rest = _read_head(sock)
        status, length = tunnel_answer(head)
        if status == 101:
            return rest
        if status == 204:
            if rest:
                raise AgentError("the agent sent bytes after answering /accept with 204")
            if time.monotonic() - started < self.wait / 2:
                raise AgentError(f"the agent answered /accept with 204 before its {self.wait:g} s wait was over")
            return None
        raise AgentError(f"HTTP {status}: {_refusal(sock, rest, length)}")

    def _carry_pair(self, agent: socket.socket, first: bytes) -> None:
        """Connect to the target and splice it with the tunnel until both ends are done."""
        pair = _Pair(agent)
        try:
            with self._lock:
                if self._closed.is_set():
                    return
                self._pairs.add(pair)
                self.carried += 1
            try:
                target = socket.create_connection(self.target, timeout=EXPOSE_CONNECT_SECONDS)
            except OSError as exc:
                self._trouble("target", f"cannot connect to {self.target[0]}:{self.target[1]}: {exc}")
                return
            pair.target = target
            target.settimeout(None)
            target.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            agent.settimeout(None)
            if self._closed.is_set():
                return
            back = threading.Thread(target=_carry, args=(target, agent, pair), name="orchard-expose-back", daemon=True)
            back.start()
            _carry(agent, target, pair, first)
            back.join()
        finally:
            with self._lock:
                self._pairs.discard(pair)
            for sock in (agent, pair.target):
                if sock is not None:
                    sock.close()
            self._slots.release()

    def _reap_idle(self) -> None:
        """End the connections idle for `idle_timeout` (a peer that never reads is idle too)."""
        period = min(self.idle_timeout / 10, 5.0)
        while not self._closed.wait(period):
            now = time.monotonic()
            with self._lock:
                idle = [pair for pair in self._pairs if now - pair.last >= self.idle_timeout]
            for pair in idle:
                pair.shut()

    def _trouble(self, kind: str, message: str) -> None:
        """Log a kind of failure once (a warning, no traceback); nothing once closed."""
        with self._lock:
            if self._closed.is_set() or kind in self._logged:
                return
            self._logged.add(kind)
        log.warning("sandbox port %d -> %s:%d: %s", self.port, *self.target, message)


_EXPOSE_NEEDS_AGENT = (
    "expose needs a direct client (Client() embedded, on Docker or Kubernetes): "
    "a sandbox of an `orchard up` service cannot expose a port of this host"
)


class _Exposures:
    """The open exposures of one sandbox handle, closed with it. A port is exposed once at a time:
    two exposures would share the agent's listener, and closing either would end both."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ports: dict[int, Exposure | None] = {}
        """Exposures by port; None while one is being made."""

    def open(self, port: int, make: Callable[[], Exposure]) -> Exposure:
        """`make()` the exposure of `port`, unless that port is exposed already (`Conflict`)."""
        with self._lock:
            if port in self._ports and not getattr(self._ports[port], "closed", False):
                raise Conflict(f"port {port} of the sandbox is exposed already; close that exposure first")
            self._ports[port] = None
        try:
            exposure = make()
        except BaseException:
            with self._lock:
                self._ports.pop(port, None)
            raise
        with self._lock:
            self._ports[port] = exposure
        return exposure

    def __bool__(self) -> bool:
        return bool(self._ports)

    def close(self) -> None:
        with self._lock:
            exposures, self._ports = list(self._ports.values()), {}
        for exposure in exposures:
            if exposure is not None:
                exposure.close()


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """The head of the agent's answer (to its blank line, bounded) and the bytes read past it."""
    data = bytearray()
    start = 0
    while (end := data.find(b"\r\n\r\n", start)) < 0:
        if len(data) > TUNNEL_MAX_HEAD:
            raise AgentError(f"the agent's answer to /accept has a head over {TUNNEL_MAX_HEAD} bytes")
        start = max(len(data) - 3, 0)
        chunk = sock.recv(4096)
        if not chunk:
            raise AgentError("the agent closed the connection before answering /accept")
        data += chunk
    return bytes(data[:end]), bytes(data[end + 4 :])


def _read_head_exactly(sock: socket.socket, route: str, deadline: float) -> bytes:
    """The head of the agent's answer to `route`, read a byte at a time so that nothing past its
    blank line is taken from the socket (the head is about 90 bytes; bounded in size, and in time
    by `deadline`, however slowly it comes)."""
    data = bytearray()
    while not data.endswith(b"\r\n\r\n"):
        if len(data) > TUNNEL_MAX_HEAD:
            raise AgentError(f"the agent's answer to {route} has a head over {TUNNEL_MAX_HEAD} bytes")
        if (left := deadline - time.monotonic()) <= 0:
            raise AgentError(f"the agent did not answer {route} in time")
        sock.settimeout(left)
        byte = sock.recv(1)
        if not byte:
            raise AgentError(f"the agent closed the connection before answering {route}")
        data += byte
    return bytes(data[:-4])


def _refusal(sock: socket.socket, rest: bytes, length: int) -> str:
    """The message of the agent's refusal (its JSON body's `error`), read with a bound."""
    body = rest[: min(length, EXPOSE_REFUSAL)]
    with contextlib.suppress(OSError):
        while len(body) < min(length, EXPOSE_REFUSAL) and (chunk := sock.recv(EXPOSE_REFUSAL)):
            body += chunk
    try:
        message = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        message = body[:200].decode("utf-8", "replace")
    return str(message)[:200]


def _carry(source: socket.socket, dest: socket.socket, pair: _Pair, first: bytes = b"") -> None:
    """One direction of a pair: what `source` sends, to `dest`; at its end `dest` is shut for
    writing (a half-close passed on); a broken socket ends both directions."""
    try:
        if first:
            dest.sendall(first)
        while chunk := source.recv(EXPOSE_CHUNK):
            pair.last = time.monotonic()
            dest.sendall(chunk)
        dest.shutdown(socket.SHUT_WR)
    except OSError:
        pair.shut()


# -- the core both clients run -----------------------------------------------------------

T = TypeVar("T")
H = TypeVar("H", "Sandbox", "AsyncSandbox")

Step = Call | Callable[[], Any]
"""One step of a lifecycle operation: a call to the service, or blocking work of the embedded manager."""

Plan = Generator[Step, Any, T]
"""A lifecycle operation: it yields steps, gets each one's result (or exception) back, and returns its own."""


class _Core(Generic[H]):
    """What `Client` and `AsyncClient` share: where sandboxes come from, and the plan of each operation.

    Embedded (no URL), sandboxes come from a manager in this process, started here; otherwise
    from the `orchard up` service at `url`, with `api_key` (given, ORCHARD_API_KEY, or the key
    of this host's service at that URL).
    """

    def __init__(self, url: str | None, api_key: str | None, backend: str | BackendConfig, store: Store | None):
        self.url = url or settings().service_url
        self.api_key = api_key or settings().api_key or (local_service_key(self.url) if self.url else None)
        self.manager = None if self.url else SandboxManager(backend, store=store).start()
        self.lock = threading.Lock()
        self.mine: dict[str, H] = {}
        """Sandboxes to delete when the client closes (not those created with `keep`)."""
        self.closed = False

    @property
    def headers(self) -> dict[str, str]:
        return {"X-API-Key": self.api_key} if self.api_key else {}

    def check_open(self, kind: str) -> None:
        if self.closed:
            raise SandboxError(f"this client is closed; create a new {kind}")

    def create(self, spec: SandboxSpec, sandbox_id: str | None, timeout: float, keep: bool) -> Plan[SandboxInfo | str]:
        """A new sandbox, ready: its info when embedded, its id through the service."""
        manager = self.manager
        if manager is not None:
            if keep:
                raise ConfigError("keep=True needs an `orchard up` service; embedded sandboxes end with their process")
            if sandbox_id is None:
                return (yield lambda: manager.acquire(spec, timeout=timeout))
            return (yield lambda: manager.create(spec, sandbox_id=sandbox_id, timeout=timeout))
        created = yield ServiceSandboxes.create(spec, sandbox_id)
        try:
            yield ServiceSandboxes.wait(created, timeout)
        except BaseException:
            yield ServiceSandboxes.delete(created)
            raise
        return created

    def adopt(self, box: H, keep: bool) -> H:
        """Track a new sandbox, to delete it with the client unless it is kept. One whose create
        was still under way when the client closed (a worker abandoned at Ctrl-C) is missed by
        the close: it is deleted here, and SandboxError raised."""
        if keep:
            return box
        with self.lock:
            closed = self.closed
            if not closed:
                self.mine[box.id] = box
        if closed:
            self.discard(box.id)
            raise SandboxError(f"this client closed while sandbox {box.id} was being made; it is deleted")
        return box

    def discard(self, sandbox_id: str) -> None:
        """Delete a sandbox after the client closed, as well as can be (its channels are closed;
        what this misses, the manager's orphan reaping or the sandbox's TTL ends)."""
        with contextlib.suppress(Exception):
            if self.manager is not None:
                self.manager.delete(sandbox_id)
            else:
                with httpx.Client(base_url=self.url or "", headers=self.headers, timeout=30.0) as http:
                    send(HttpxChannel(http), ServiceSandboxes.delete(sandbox_id))

    def warm(self, spec: SandboxSpec, size: int, drain: bool) -> Plan[None]:
        manager = self.manager
        if manager is not None:
            yield lambda: manager.pools.warm(spec, size, drain=drain)
        else:
            yield ServiceSandboxes.warm(spec, size, drain)

    def attach(self, sandbox_id: str) -> H | SandboxInfo | str:
        """This client's handle on `sandbox_id`, else what a new handle needs (info embedded, id remote)."""
        if self.manager is None:
            return check_sandbox_id(sandbox_id)
        with self.lock:
            mine = self.mine.get(sandbox_id)
        return mine or self.manager.get(sandbox_id)

    def list(self) -> Plan[list[dict]]:
        if self.manager is not None:
            return [_public(info) for info in self.manager.list()]
        return (yield ServiceSandboxes.list())

    def delete(self, sandbox_id: str) -> Plan[None]:
        manager = self.manager
        if manager is not None:
            yield lambda: manager.delete(sandbox_id)
        else:
            yield ServiceSandboxes.delete(sandbox_id)
        with self.lock:
            self.mine.pop(sandbox_id, None)

    def close(self) -> builtins.list[H] | None:
        """Mark the client closed; the sandboxes to delete now (None if it was closed already)."""
        with self.lock:
            if self.closed:
                return None
            self.closed = True
            return list(self.mine.values())


def _run(plan: Plan[T], do: Callable[[Step], Any]) -> T:
    """Run a plan, each step by `do`; a step's exception goes back into the plan."""
    result: Any = None
    failure: BaseException | None = None
    while True:
        try:
            step = plan.send(result) if failure is None else plan.throw(failure)
        except StopIteration as done:
            return done.value
        try:
            result, failure = do(step), None
        except BaseException as exc:
            result, failure = None, exc


async def _arun(plan: Plan[T], do: Callable[[Step], Awaitable[Any]]) -> T:
    """The async twin of `_run`."""
    result: Any = None
    failure: BaseException | None = None
    while True:
        try:
            step = plan.send(result) if failure is None else plan.throw(failure)
        except StopIteration as done:
            return done.value
        try:
            result, failure = await do(step), None
        except BaseException as exc:
            result, failure = None, exc


# -- the clients --------------------------------------------------------------------------


class Client:
    """Creates sandboxes, embedded (a manager in this process) or through an `orchard up` service."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        backend: str | BackendConfig = "docker",
        store: Store | None = None,
    ):
        self._core: _Core[Sandbox] = _Core(url, api_key, backend, store)
        self.url = self._core.url
        self._manager = self._core.manager
        self._http: HttpxChannel | None = None
        if self.url:
            self._http = HttpxChannel(httpx.Client(base_url=self.url, headers=self._core.headers, timeout=60.0))
        _track(self)

    def create(
        self,
        image: str,
        *,
        sandbox_id: str | None = None,
        timeout: float = 120.0,
        keep: bool = False,
        **options: Unpack[SandboxOptions],
    ) -> Sandbox:
        """Start a sandbox from `image` and return it once its agent answers; `options` are
        `SandboxOptions` (`network`, `cpu`, `memory`, `disk`, `tmpfs`, `ttl`, `env`, `run_id`,
        `init`, `init_timeout`, `tools`; `orchard.env.backends.base`). With `tools=True` the agent
        CLIs (`orchard image build-tools`) are mounted read-only at `/.orchard-tools`.

        With `keep`, the sandbox outlives this client (service mode only; it is still reaped at
        its TTL). With `init`, that shell command runs once in the sandbox before it is returned
        (within `init_timeout` seconds); if it fails, the sandbox is deleted and SandboxError
        says why. A warm pool of the same arguments, `init` included, holds sandboxes that ran it.
        """
        self._core.check_open("Client")
        spec = make_spec(image, **options)
        made = self._run(self._core.create(spec, sandbox_id, timeout, keep))
        return self._core.adopt(self._handle(made, image), keep)

    def warm(self, image: str, size: int, *, drain: bool = False, **options: Unpack[SandboxOptions]) -> None:
        """Keep `size` sandboxes of this kind started (each ran `init`, if given); `create` with
        the same arguments takes one at once. With `drain`, the pool shrinks to `size` now: the
        ready sandboxes beyond it are deleted, and those still starting once they are up."""
        self._core.check_open("Client")
        spec = make_spec(image, **options)
        self._run(self._core.warm(spec, size, drain))

    def attach(self, sandbox_id: str) -> Sandbox:
        """A handle on an existing sandbox (of the service, or of this embedded client); sends nothing."""
        self._core.check_open("Client")
        found = self._core.attach(sandbox_id)
        return found if isinstance(found, Sandbox) else self._handle(found)

    def list(self) -> list[dict]:
        """Live sandboxes (of this client when embedded; of the service when remote)."""
        self._core.check_open("Client")
        return self._run(self._core.list())

    def close(self) -> None:
        """Delete every sandbox this client created; idempotent. Tries them all, then raises."""
        boxes = self._core.close()
        if boxes is None:
            return
        failures = []
        for box in boxes:
            try:
                box.delete()
            except Exception as exc:  # delete the others first
                failures.append(exc)
        try:
            if self._manager is not None:
                self._manager.close()
            elif self._http is not None:
                self._http.close()
        finally:
            if failures:
                raise failures[0]

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, plan: Plan[T]) -> T:
        return _run(plan, self._do)

    def _do(self, step: Step) -> Any:
        if isinstance(step, Call):
            assert self._http is not None
            return send(self._http, step)
        return step()

    def _handle(self, made: SandboxInfo | str, image: str = "") -> Sandbox:
        """A handle straight to an embedded sandbox's agent, or one through the service."""
        if isinstance(made, SandboxInfo):
            endpoint = made.endpoint
            assert endpoint is not None and self._manager is not None
            return Sandbox(
                made.sandbox_id,
                made.spec.image,
                agent_http(endpoint),
                AgentCalls(),
                self._forget,
                on_exec=self._manager.record_exec,
                frames=lambda: AgentFrames(endpoint),
            )
        assert self.url is not None and self._http is not None
        url, key = self.url, self._core.api_key
        return Sandbox(
            made,
            image,
            self._http,
            ServiceCalls(made),
            self._forget,
            owns_http=False,
            frames=lambda: ServiceFrames(url, made, key),
        )

    def _forget(self, sandbox_id: str) -> None:
        self._run(self._core.delete(sandbox_id))


class AsyncClient:
    """The async twin of `Client` (the embedded manager's work runs in worker threads)."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        backend: str | BackendConfig = "docker",
        store: Store | None = None,
    ):
        self._core: _Core[AsyncSandbox] = _Core(url, api_key, backend, store)
        self.url = self._core.url
        self._manager = self._core.manager
        self._http: AsyncHttpxChannel | None = None
        if self.url:
            self._http = AsyncHttpxChannel(
                httpx.AsyncClient(base_url=self.url, headers=self._core.headers, timeout=60.0)
            )
        _track(self)

    async def create(
        self,
        image: str,
        *,
        sandbox_id: str | None = None,
        timeout: float = 120.0,
        keep: bool = False,
        **options: Unpack[SandboxOptions],
    ) -> AsyncSandbox:
        """Start a sandbox from `image` and return it once its agent answers (see `Client.create`)."""
        self._core.check_open("AsyncClient")
        spec = make_spec(image, **options)
        made = await self._run(self._core.create(spec, sandbox_id, timeout, keep))
        return self._core.adopt(self._handle(made, image), keep)

    async def warm(self, image: str, size: int, *, drain: bool = False, **options: Unpack[SandboxOptions]) -> None:
        """Keep `size` sandboxes of this kind started (see `Client.warm`)."""
        self._core.check_open("AsyncClient")
        spec = make_spec(image, **options)
        await self._run(self._core.warm(spec, size, drain))

    def attach(self, sandbox_id: str) -> AsyncSandbox:
        """A handle on an existing sandbox (see `Client.attach`); sends nothing, so it is no coroutine."""
        self._core.check_open("AsyncClient")
        found = self._core.attach(sandbox_id)
        return found if isinstance(found, AsyncSandbox) else self._handle(found)

    async def list(self) -> list[dict]:
        """Live sandboxes (of this client when embedded; of the service when remote)."""
        self._core.check_open("AsyncClient")
        return await self._run(self._core.list())

    async def aclose(self) -> None:
        """Delete every sandbox this client created; idempotent. Tries them all, then raises."""
        boxes = self._core.close()
        if boxes is None:
            return
        outcomes = await asyncio.gather(*(box.delete() for box in boxes), return_exceptions=True)
        try:
            if self._manager is not None:
                await asyncio.to_thread(self._manager.close)
            elif self._http is not None:
                await self._http.aclose()
        finally:
            failures = [o for o in outcomes if isinstance(o, BaseException)]
            if failures:
                raise failures[0]

    def close(self) -> None:
        """Synchronous last-resort cleanup (interpreter exit): delete what is left."""
        boxes = self._core.close()
        if boxes is None:
            return
        if self._manager is not None:
            self._manager.close()
        elif self._http is not None:
            remote = self._http.client
            with httpx.Client(base_url=remote.base_url, headers=remote.headers) as http:
                for box in boxes:
                    send(HttpxChannel(http), ServiceSandboxes.delete(box.id))

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self, plan: Plan[T]) -> T:
        return await _arun(plan, self._do)

    async def _do(self, step: Step) -> Any:
        if isinstance(step, Call):
            assert self._http is not None
            return await asend(self._http, step)
        return await asyncio.to_thread(step)

    def _handle(self, made: SandboxInfo | str, image: str = "") -> AsyncSandbox:
        """The async twin of `Client._handle`."""
        if isinstance(made, SandboxInfo):
            endpoint = made.endpoint
            assert endpoint is not None and self._manager is not None
            return AsyncSandbox(
                made.sandbox_id,
                made.spec.image,
                async_agent_http(endpoint),
                AgentCalls(),
                self._forget,
                on_exec=self._manager.record_exec,
                frames=lambda: AsyncAgentFrames.open(endpoint),
            )
        assert self.url is not None and self._http is not None
        url, key = self.url, self._core.api_key
        return AsyncSandbox(
            made,
            image,
            self._http,
            ServiceCalls(made),
            self._forget,
            owns_http=False,
            frames=lambda: AsyncServiceFrames.open(url, made, key),
        )

    async def _forget(self, sandbox_id: str) -> None:
        await self._run(self._core.delete(sandbox_id))


def _public(info: SandboxInfo) -> dict:
    """A sandbox of the embedded manager as `list` shows it (the fields the service's listing has)."""
    return {
        "sandbox_id": info.sandbox_id,
        "image": info.spec.image,
        "status": info.status,
        "block_network": info.spec.network != "open",
        "network": info.spec.network,
        "created_at": info.created_at,
    }


def _bytes(data: bytes | str) -> bytes:
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    raise InvalidRequest(f"file content must be bytes or str, not {type(data).__name__}")


def pack_folder(folder: Path) -> bytes:
    """A tar of a folder's contents (members relative to it)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for child in sorted(folder.iterdir()):
            tar.add(child, arcname=child.name)
    return buffer.getvalue()


# -- cleanup at exit --------------------------------------------------------------------


def _track(client: Client | AsyncClient) -> None:
    _open_clients.add(client)
    _install_handlers()


_atexit_installed = False
_sigterm_installed = False


def _install_handlers() -> None:
    """atexit once; the SIGTERM handler as soon as a client is made in the main thread."""
    global _atexit_installed, _sigterm_installed
    if not _atexit_installed:
        _atexit_installed = True
        atexit.register(_close_all)
    if _sigterm_installed or threading.current_thread() is not threading.main_thread():
        return
    _sigterm_installed = True
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _exit_on_sigterm)


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    """Turn SIGTERM into SystemExit so `with` blocks and atexit delete our sandboxes."""
    raise SystemExit(128 + signum)


def _close_all() -> None:
    for client in list(_open_clients):
        try:
            client.close()
        except Exception as exc:  # best effort at exit: a later manager reaps what is left
            print(f"orchard: could not delete every sandbox at exit: {exc}", file=sys.stderr)
