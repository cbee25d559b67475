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
"""

from __future__ import annotations

import asyncio
import atexit
import io
import json
import math
import signal
import sys
import tarfile
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx

from orchard.config import settings
from orchard.env.archive import Download
from orchard.env.backends import BackendConfig
from orchard.env.backends.base import Network, SandboxSpec, parse_memory
from orchard.env.calls import (
    ARCHIVE_LIMIT,
    READ_LIMIT,
    AgentCalls,
    Call,
    Channel,
    ExecResult,
    FileInfo,
    PatchResult,
    ServiceCalls,
    ServiceSandboxes,
    asend,
    command_text,
    send,
)
from orchard.env.manager import SandboxInfo, SandboxManager, agent_http, async_agent_http
from orchard.env.pty import AgentFrames, Frames, ServiceFrames, Terminal, init_frame
from orchard.env.transport import AsyncAgentChannel, AsyncHttpxChannel, HttpxChannel
from orchard.errors import ConfigError, InvalidRequest, SandboxError

__all__ = [
    "AsyncClient",
    "AsyncSandbox",
    "Client",
    "ExecResult",
    "FileInfo",
    "PatchResult",
    "Sandbox",
]

_open_clients: weakref.WeakSet = weakref.WeakSet()

DEFAULT_EXEC_TIMEOUT = 300.0
"""Seconds a command may run unless told otherwise (the service API's default too)."""


class Sandbox:
    """One live sandbox: run commands, move files, apply patches. Use as a context manager."""

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

    def delete(self) -> None:
        """Delete the sandbox; idempotent (a failed delete may be retried)."""
        if self._deleted:
            return
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


class Client:
    """Creates sandboxes, embedded (a manager in this process) or through an `orchard up` service."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        backend: str | BackendConfig = "docker",
        db_url: str | None = None,
    ):
        self.url = url or settings().service_url
        self._api_key = api_key
        self._lock = threading.Lock()
        self._mine: dict[str, Sandbox] = {}
        self._closed = False
        if self.url:
            self._manager = None
            self._http = HttpxChannel(
                httpx.Client(base_url=self.url, headers=_auth_headers(self.url, api_key), timeout=60.0)
            )
        else:
            self._manager = SandboxManager(backend, db_url=db_url)
        _track(self)

    def create(
        self,
        image: str,
        *,
        network: Network = "blocked",
        cpu: float | None = None,
        memory: str | int | None = None,
        disk: str | int | None = None,
        tmpfs: dict[str, str | int] | None = None,
        ttl: float = 7200.0,
        env: dict[str, str] | None = None,
        sandbox_id: str | None = None,
        run_id: str | None = None,
        timeout: float = 120.0,
        keep: bool = False,
    ) -> Sandbox:
        """Start a sandbox from `image` and return it once its agent answers.

        With `keep`, the sandbox outlives this client (service mode only; it is still reaped at
        its TTL).
        """
        self._check_open()
        if keep and self._manager is not None:
            raise ConfigError("keep=True needs an `orchard up` service; embedded sandboxes end with their process")
        spec = make_spec(
            image, network=network, cpu=cpu, memory=memory, disk=disk, tmpfs=tmpfs, ttl=ttl, env=env, run_id=run_id
        )
        if self._manager is not None:
            if sandbox_id is None:
                info = self._manager.acquire(spec, timeout=timeout)
            else:
                info = self._manager.create(spec, sandbox_id=sandbox_id, timeout=timeout)
            box = self._direct(info)
        else:
            sandbox_id = send(self._http, ServiceSandboxes.create(service_body(spec, sandbox_id)))
            try:
                send(self._http, ServiceSandboxes.wait(sandbox_id, timeout))
            except BaseException:
                send(self._http, ServiceSandboxes.delete(sandbox_id))
                raise
            box = self.attach(sandbox_id)
        if not keep:
            with self._lock:
                self._mine[box.id] = box
        return box

    def warm(
        self,
        image: str,
        size: int,
        *,
        network: Network = "blocked",
        cpu: float | None = None,
        memory: str | int | None = None,
        ttl: float = 7200.0,
        env: dict[str, str] | None = None,
    ) -> None:
        """Keep `size` sandboxes of this kind started; `create` with the same arguments takes one at once."""
        self._check_open()
        spec = make_spec(image, network=network, cpu=cpu, memory=memory, ttl=ttl, env=env)
        if self._manager is not None:
            self._manager.pools.warm(spec, size)
        else:
            send(self._http, ServiceSandboxes.warm({**service_body(spec, None), "size": size}))

    def attach(self, sandbox_id: str) -> Sandbox:
        """A handle on an existing sandbox (of the service, or of this embedded client)."""
        self._check_open()
        if self._manager is not None:
            with self._lock:
                mine = self._mine.get(sandbox_id)
            return mine or self._direct(self._manager.get(sandbox_id))
        assert self.url is not None
        url, key = self.url, _auth_headers(self.url, self._api_key).get("X-API-Key")
        return Sandbox(
            sandbox_id,
            "",
            self._http,
            ServiceCalls(sandbox_id),
            self._forget_remote,
            owns_http=False,
            frames=lambda: ServiceFrames(url, sandbox_id, key),
        )

    def list(self) -> list[dict]:
        """Live sandboxes (of this client when embedded; of the service when remote)."""
        if self._manager is not None:
            return [_public(info) for info in self._manager.list()]
        return send(self._http, ServiceSandboxes.list())

    def close(self) -> None:
        """Delete every sandbox this client created; idempotent. Tries them all, then raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            boxes = list(self._mine.values())
        failures = []
        for box in boxes:
            try:
                box.delete()
            except Exception as exc:  # delete the others first
                failures.append(exc)
        try:
            if self._manager is not None:
                self._manager.close()
            else:
                self._http.close()
        finally:
            if failures:
                raise failures[0]

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- embedded ---------------------------------------------------------------------

    def _direct(self, info: SandboxInfo) -> Sandbox:
        assert info.endpoint is not None and self._manager is not None
        endpoint = info.endpoint
        return Sandbox(
            info.sandbox_id,
            info.spec.image,
            agent_http(info.endpoint),
            AgentCalls(),
            self._forget_local,
            on_exec=self._manager.record_exec,
            frames=lambda: AgentFrames(endpoint),
        )

    def _forget_local(self, sandbox_id: str) -> None:
        assert self._manager is not None
        self._manager.delete(sandbox_id)
        with self._lock:
            self._mine.pop(sandbox_id, None)

    # -- remote -----------------------------------------------------------------------

    def _forget_remote(self, sandbox_id: str) -> None:
        send(self._http, ServiceSandboxes.delete(sandbox_id))
        with self._lock:
            self._mine.pop(sandbox_id, None)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("this client is closed; create a new Client")


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
    ):
        self.id, self.image = sandbox_id, image
        self._http, self._calls, self._on_delete, self._on_exec = http, calls, on_delete, on_exec
        self._owns_http = owns_http
        self._deleted = False

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

    async def delete(self) -> None:
        """Delete the sandbox; idempotent (a failed delete may be retried)."""
        if self._deleted:
            return
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


class AsyncClient:
    """The async twin of `Client` (embedded lifecycle calls run in worker threads)."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        backend: str | BackendConfig = "docker",
        db_url=None,
    ):
        self.url = url or settings().service_url
        self._mine: dict[str, AsyncSandbox] = {}
        self._closed = False
        if self.url:
            self._manager = None
            self._http = AsyncHttpxChannel(
                httpx.AsyncClient(base_url=self.url, headers=_auth_headers(self.url, api_key), timeout=60.0)
            )
        else:
            self._manager = SandboxManager(backend, db_url=db_url)
        _track(self)

    async def create(
        self,
        image: str,
        *,
        network: Network = "blocked",
        cpu: float | None = None,
        memory: str | int | None = None,
        disk: str | int | None = None,
        tmpfs: dict[str, str | int] | None = None,
        ttl: float = 7200.0,
        env: dict[str, str] | None = None,
        sandbox_id: str | None = None,
        run_id: str | None = None,
        timeout: float = 120.0,
    ) -> AsyncSandbox:
        """Start a sandbox from `image` and return it once its agent answers."""
        if self._closed:
            raise SandboxError("this client is closed; create a new AsyncClient")
        spec = make_spec(
            image, network=network, cpu=cpu, memory=memory, disk=disk, tmpfs=tmpfs, ttl=ttl, env=env, run_id=run_id
        )
        if self._manager is not None:
            manager = self._manager
            if sandbox_id is None:
                info = await asyncio.to_thread(manager.acquire, spec, timeout=timeout)
            else:
                info = await asyncio.to_thread(manager.create, spec, sandbox_id=sandbox_id, timeout=timeout)
            assert info.endpoint is not None
            box = AsyncSandbox(
                info.sandbox_id,
                image,
                async_agent_http(info.endpoint),
                AgentCalls(),
                self._forget,
                on_exec=manager.record_exec,
            )
        else:
            sandbox_id = await asend(self._http, ServiceSandboxes.create(service_body(spec, sandbox_id)))
            box = AsyncSandbox(sandbox_id, image, self._http, ServiceCalls(sandbox_id), self._forget, owns_http=False)
            try:
                await asend(self._http, ServiceSandboxes.wait(sandbox_id, timeout))
            except BaseException:
                await box.delete()
                raise
        self._mine[box.id] = box
        return box

    async def _forget(self, sandbox_id: str) -> None:
        if self._manager is not None:
            await asyncio.to_thread(self._manager.delete, sandbox_id)
        else:
            await asend(self._http, ServiceSandboxes.delete(sandbox_id))
        self._mine.pop(sandbox_id, None)

    async def aclose(self) -> None:
        """Delete every sandbox this client created; idempotent. Tries them all, then raises."""
        if self._closed:
            return
        self._closed = True
        outcomes = await asyncio.gather(*(box.delete() for box in list(self._mine.values())), return_exceptions=True)
        try:
            if self._manager is not None:
                await asyncio.to_thread(self._manager.close)
            else:
                await self._http.aclose()
        finally:
            failures = [o for o in outcomes if isinstance(o, BaseException)]
            if failures:
                raise failures[0]

    def close(self) -> None:
        """Synchronous last-resort cleanup (interpreter exit): delete what is left."""
        if self._closed:
            return
        self._closed = True
        if self._manager is not None:
            self._manager.close()
        else:
            remote = self._http.client
            with httpx.Client(base_url=remote.base_url, headers=remote.headers) as http:
                for sandbox_id in list(self._mine):
                    send(HttpxChannel(http), ServiceSandboxes.delete(sandbox_id))

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# -- shared helpers ---------------------------------------------------------------------


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
    """Validate user input into a spec, with one clear error per mistake."""
    if not isinstance(image, str) or not image.strip():
        raise InvalidRequest("image must be a non-empty image reference such as orchard/base:bookworm")
    if network not in ("blocked", "open"):
        raise InvalidRequest(f"network must be 'blocked' or 'open', not {network!r}")
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


def service_body(spec: SandboxSpec, sandbox_id: str | None) -> dict:
    """The service's create body for a spec (field names of the Orchard Env API)."""
    body: dict[str, Any] = {
        "image": spec.image,
        "block_network": spec.network == "blocked",
        "ttl": math.ceil(spec.ttl),
    }
    if spec.cpu:
        body["cpu"] = str(spec.cpu)
    if spec.memory_bytes:
        body["memory"] = str(spec.memory_bytes)
    if spec.disk_bytes:
        body["disk"] = str(spec.disk_bytes)
    if spec.tmpfs:
        body["tmpfs"] = {path: str(size) for path, size in spec.tmpfs.items()}
    if sandbox_id:
        body["sandbox_id"] = sandbox_id
    if spec.env:
        body["env"] = spec.env
    if spec.run_id:
        body["run_id"] = spec.run_id
    return body


def running_service() -> dict | None:
    """The state of the `orchard up` service of this ORCHARD_HOME, if it runs and answers."""
    try:
        state = json.loads(settings().service_state.read_text())
    except (OSError, ValueError):
        return None
    if not process_alive(state.get("pid", 0)):
        return None
    return state if service_healthy(state["url"]) else None


def service_healthy(url: str) -> bool:
    """Whether an Orchard service answers its health check at `url`."""
    try:
        return httpx.get(f"{url}/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def running_service_url() -> str | None:
    """ORCHARD_URL / SANDBOX_BASE_URL, else the URL of a local running service, else None."""
    return settings().service_url or (running_service() or {}).get("url")


def process_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as dead)."""
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _auth_headers(url: str, api_key: str | None) -> dict[str, str]:
    key = api_key or settings().api_key or _key_of_local_service(url)
    return {"X-API-Key": key} if key else {}


def _key_of_local_service(url: str) -> str | None:
    """The key `orchard up` stored (mode 0600) when it serves `url` on this host."""
    try:
        state = json.loads(settings().service_state.read_text())
    except (OSError, ValueError):
        return None
    return state.get("api_key") if state.get("url", "").rstrip("/") == url.rstrip("/") else None


def _public(info: SandboxInfo) -> dict:
    return {
        "sandbox_id": info.sandbox_id,
        "image": info.spec.image,
        "status": info.status,
        "block_network": info.spec.network == "blocked",
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
