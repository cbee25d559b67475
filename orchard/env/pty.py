"""Interactive terminals in sandboxes: the PTY frames, their two transports and a terminal loop.

A terminal speaks the JSON frames of `docs/api.md` (client: `init`, `stdin`, `signal`,
`resize`, `close`; server: `ready`, `stdout`, `exit`, `error`). Straight to an agent they travel
one per line over an upgraded HTTP connection (`POST /pty`, `Upgrade: orchard-pty`); through the
service, one per WebSocket message on `/sandboxes/{id}/exec/pty`. The service only relays them.
`Terminal` (blocking) and `AsyncTerminal` (asyncio) hide which one is used, each over its own
twin transports; `attach_terminal` wires a `Terminal` to the user's terminal. Frames come from
the sandbox, so each is bounded (`MAX_FRAME`) and checked (`parse_frame`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import select
import signal
import sys
import threading
import urllib.parse
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from orchard.env.agent.protocol import PTY_MAX_FRAME, PTY_ROUTE, PTY_UPGRADE
from orchard.env.transport import MAX_HEADERS, _address, _Connection, open_agent_connection
from orchard.errors import AgentError, InvalidRequest, NotFound

if TYPE_CHECKING:
    from websockets.typing import Subprotocol

    from orchard.env.backends.base import AgentEndpoint

MAX_FRAME = PTY_MAX_FRAME
"""Bytes of one frame from the sandbox (the agent sends at most 64 KiB; its bound on a frame from
the host is the same); a longer one ends the terminal."""
MAX_REFUSAL = 64 * 1024
"""Bytes read of the agent's answer when it refuses the upgrade."""


def init_frame(
    cmd: Sequence[str] | None = None,
    *,
    rows: int = 24,
    cols: int = 80,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    login_shell: bool = False,
) -> dict[str, Any]:
    """The first frame: what to run (None: an interactive shell) and the terminal's size."""
    return {
        "type": "init",
        "cmd": None if cmd is None else list(cmd),
        "env": env or {},
        "cwd": cwd,
        "rows": rows,
        "cols": cols,
        "login_shell": login_shell,
    }


class Frames(Protocol):
    """One of the two blocking transports of PTY frames."""

    def send(self, frame: dict[str, Any]) -> None: ...
    def recv(self) -> dict[str, Any] | None: ...
    def close(self) -> None: ...


class AsyncFrames(Protocol):
    """One of the two asyncio transports of PTY frames."""

    async def send(self, frame: dict[str, Any]) -> None: ...
    async def recv(self) -> dict[str, Any] | None: ...
    async def close(self) -> None: ...


def stdin_frame(data: bytes | str) -> dict[str, Any]:
    raw = data.encode() if isinstance(data, str) else data
    return {"type": "stdin", "data": base64.b64encode(raw).decode()}


class _Seen:
    """What `Terminal` and `AsyncTerminal` learn from the frames they read: the pid, the exit code."""

    def __init__(self) -> None:
        self.pid: int | None = None
        self.exit_code: int | None = None

    def _note(self, frame: dict[str, Any] | None) -> dict[str, Any] | None:
        if frame is not None:
            if frame.get("type") == "ready":
                self.pid = frame.get("pid")
            elif frame.get("type") == "exit":
                self.exit_code = frame.get("code")
        return frame


def _output_until(seen: bytes, frame: dict[str, Any] | None, needle: bytes, limit: int) -> bytes:
    """`seen` and the output `frame` carries; AgentError once the process ended or `limit` is passed."""
    if frame is None or frame["type"] in ("exit", "error"):
        raise AgentError(f"the terminal ended before {needle!r} appeared; output: {seen[-500:]!r}")
    if frame["type"] == "stdout":
        seen += base64.b64decode(frame["data"])
    if len(seen) > limit:
        raise AgentError(f"{needle!r} did not appear in {limit} bytes of output")
    return seen


def _ended(frame: dict[str, Any] | None) -> bool:
    """Whether the connection closed (for `wait`); an error frame raises AgentError."""
    if frame is not None and frame["type"] == "error":
        raise AgentError(f"terminal failed: {frame.get('message')}")
    return frame is None


class Terminal(_Seen):
    """A process on a pseudo-terminal in a sandbox. Read its frames with `recv` until `exit`."""

    def __init__(self, frames: Frames):
        super().__init__()
        self._frames = frames

    def write(self, data: bytes | str) -> None:
        """Type into the terminal."""
        self._frames.send(stdin_frame(data))

    def resize(self, rows: int, cols: int) -> None:
        self._frames.send({"type": "resize", "rows": rows, "cols": cols})

    def signal(self, sig: str) -> None:
        """Send TERM, KILL, INT, HUP or QUIT (any case; another name means TERM) to the terminal's process group."""
        self._frames.send({"type": "signal", "sig": sig})

    def recv(self) -> dict[str, Any] | None:
        """The next frame from the sandbox (None once the connection is closed)."""
        return self._note(self._frames.recv())

    def read_until(self, needle: bytes, limit: int = 1 << 20) -> bytes:
        """Output up to and including `needle` (raises AgentError if the process ends first)."""
        seen = b""
        while needle not in seen:
            seen = _output_until(seen, self.recv(), needle, limit)
        return seen

    def wait(self) -> int | None:
        """Read (and drop) output until the process exits; its exit code."""
        while self.exit_code is None and not _ended(self.recv()):
            pass
        return self.exit_code

    def close(self) -> None:
        """End the process (TERM) and the connection."""
        with contextlib.suppress(OSError, AgentError):
            self._frames.send({"type": "close"})
        self._frames.close()

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncTerminal(_Seen):
    """The asyncio twin of `Terminal`."""

    def __init__(self, frames: AsyncFrames):
        super().__init__()
        self._frames = frames

    async def write(self, data: bytes | str) -> None:
        """Type into the terminal."""
        await self._frames.send(stdin_frame(data))

    async def resize(self, rows: int, cols: int) -> None:
        await self._frames.send({"type": "resize", "rows": rows, "cols": cols})

    async def signal(self, sig: str) -> None:
        """Send TERM, KILL, INT, HUP or QUIT (any case; another name means TERM) to the terminal's process group."""
        await self._frames.send({"type": "signal", "sig": sig})

    async def recv(self) -> dict[str, Any] | None:
        """The next frame from the sandbox (None once the connection is closed)."""
        return self._note(await self._frames.recv())

    async def read_until(self, needle: bytes, limit: int = 1 << 20) -> bytes:
        """Output up to and including `needle` (raises AgentError if the process ends first)."""
        seen = b""
        while needle not in seen:
            seen = _output_until(seen, await self.recv(), needle, limit)
        return seen

    async def wait(self) -> int | None:
        """Read (and drop) output until the process exits; its exit code."""
        while self.exit_code is None and not _ended(await self.recv()):
            pass
        return self.exit_code

    async def close(self) -> None:
        """End the process (TERM) and the connection."""
        with contextlib.suppress(OSError, AgentError):
            await self._frames.send({"type": "close"})
        await self._frames.close()

    async def __aenter__(self) -> AsyncTerminal:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _upgrade_request(auth: str) -> bytes:
    return (
        f"POST {PTY_ROUTE} HTTP/1.1\r\nHost: agent\r\nAuthorization: {auth}\r\nConnection: Upgrade\r\n"
        f"Upgrade: {PTY_UPGRADE}\r\nContent-Length: 0\r\n\r\n"
    ).encode("latin-1")


def _upgrade_answer(status_line: bytes, header_lines: Iterator[bytes]) -> tuple[bytes, int | None]:
    """The status line, and None when the agent switched protocols, else its body's length (bounded)."""
    length = 0
    for count, line in enumerate(header_lines):
        if line in (b"\r\n", b"\n"):
            break
        if count >= MAX_HEADERS:
            raise AgentError(f"the agent answered the terminal with more than {MAX_HEADERS} header lines")
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length" and value.strip().isdigit():
            length = min(int(value), MAX_REFUSAL)
    return status_line, None if status_line.split(b" ")[1:2] == [b"101"] else length


def parse_frame(data: bytes | str) -> dict[str, Any]:
    """A frame from the sandbox, checked to be a JSON object with a string `type` (else AgentError)."""
    if len(data) > MAX_FRAME:
        raise AgentError(f"a terminal frame from the sandbox is over {MAX_FRAME} bytes")
    try:
        frame = json.loads(data)
    except ValueError:
        frame = None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        raise AgentError(f"the sandbox sent a terminal frame that is not a JSON object with a type: {data[:80]!r}")
    if frame["type"] == "stdout" and not isinstance(frame.get("data"), str):
        raise AgentError("the sandbox sent a stdout frame without its base64 data")
    return frame


def _refusal(status_line: bytes, body: bytes) -> AgentError:
    try:
        message = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        message = body[:200].decode("utf-8", "replace") or status_line.decode("latin-1").strip()
    return AgentError(f"the agent refused the terminal: {message}")


class AgentFrames:
    """Frames as JSON lines on an upgraded connection to an agent (blocking)."""

    def __init__(self, endpoint: AgentEndpoint, timeout: float = 10.0):
        host, port, auth = _address(endpoint)
        try:
            connection = _Connection(endpoint, host, port, timeout)
        except AgentError:
            raise
        except OSError as exc:
            raise AgentError(f"no answer from the sandbox's agent: {exc}") from exc
        self.sock, self.reader = connection.sock, connection.reader
        try:
            self.sock.sendall(_upgrade_request(auth))
            status_line, length = _upgrade_answer(connection.line(), iter(connection.line, b""))
        except (OSError, ValueError) as exc:
            self.close()
            if isinstance(exc, AgentError):
                raise
            raise AgentError(f"no answer from the sandbox's agent: {exc}") from exc
        if length is not None:
            body = self.reader.read(length) if length else b""
            self.close()
            raise _refusal(status_line, body)
        self.sock.settimeout(None)
        self._lock = threading.Lock()

    def send(self, frame: dict[str, Any]) -> None:
        data = json.dumps(frame, separators=(",", ":")).encode() + b"\n"
        try:
            with self._lock:
                self.sock.sendall(data)
        except OSError as exc:
            raise AgentError(f"the terminal's connection is closed: {exc}") from exc

    def recv(self) -> dict[str, Any] | None:
        try:
            line = self.reader.readline(MAX_FRAME + 1)
        except OSError:
            return None
        return parse_frame(line) if line.strip() else None

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


def _pty_url(url: str, sandbox_id: str) -> str:
    """The service's WebSocket route for terminals of `sandbox_id`."""
    parts = urllib.parse.urlsplit(url)
    scheme = "wss" if parts.scheme == "https" else "ws"
    return urllib.parse.urlunsplit(
        (scheme, parts.netloc, f"{parts.path.rstrip('/')}/sandboxes/{sandbox_id}/exec/pty", "", "")
    )


def _key_protocol(api_key: str | None) -> list[Subprotocol] | None:
    """The API key as a WebSocket subprotocol (browsers cannot set headers on a WebSocket)."""
    from websockets.typing import Subprotocol

    return [Subprotocol(f"api_key.{api_key}")] if api_key else None


def _service_refusal(url: str, exc: Exception) -> Exception:
    """The error for a WebSocket handshake with the service that failed (`exc`)."""
    from websockets.exceptions import InvalidStatus

    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        if status in (401, 403):
            return InvalidRequest(f"the service refused the API key (HTTP {status}); check ORCHARD_API_KEY")
        try:
            detail = json.loads(exc.response.body or b"{}").get("detail")
        except (ValueError, AttributeError):
            detail = None
        if status == 404:
            return NotFound(detail or "no such sandbox, or it is not ready")
        return AgentError(f"the service refused the terminal (HTTP {status}){f': {detail}' if detail else ''}")
    return AgentError(f"could not open a terminal through {url}: {exc}")


class ServiceFrames:
    """Frames as WebSocket messages to an `orchard up` service (blocking)."""

    def __init__(self, url: str, sandbox_id: str, api_key: str | None, timeout: float = 10.0):
        from websockets.exceptions import InvalidHandshake
        from websockets.sync.client import connect

        self._stack = contextlib.ExitStack()
        try:
            self.ws = self._stack.enter_context(
                connect(
                    _pty_url(url, sandbox_id),
                    subprotocols=_key_protocol(api_key),
                    open_timeout=timeout,
                    max_size=MAX_FRAME,
                )
            )
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            raise _service_refusal(url, exc) from None

    def send(self, frame: dict[str, Any]) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            self.ws.send(json.dumps(frame))
        except ConnectionClosed as exc:
            raise AgentError(f"the terminal's connection is closed: {exc}") from exc

    def recv(self) -> dict[str, Any] | None:
        from websockets.exceptions import ConnectionClosed

        try:
            return parse_frame(self.ws.recv())
        except ConnectionClosed:
            return None

    def close(self) -> None:
        self._stack.close()


class AsyncAgentFrames:
    """Frames as JSON lines on an upgraded connection to an agent (asyncio); made by `open`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._reader, self._writer = reader, writer

    @classmethod
    async def open(cls, endpoint: AgentEndpoint, timeout: float = 10.0) -> AsyncAgentFrames:
        try:
            async with asyncio.timeout(timeout):
                return cls(*await open_agent_relay(endpoint))
        except TimeoutError:
            raise AgentError(f"no answer from the sandbox's agent within {timeout:g} s") from None

    async def send(self, frame: dict[str, Any]) -> None:
        try:
            self._writer.write(json.dumps(frame, separators=(",", ":")).encode() + b"\n")
            await self._writer.drain()
        except OSError as exc:
            raise AgentError(f"the terminal's connection is closed: {exc}") from exc

    async def recv(self) -> dict[str, Any] | None:
        try:
            line = await self._reader.readline()  # bounded: the relay's reader holds MAX_FRAME at most
        except ValueError:
            raise AgentError(f"a terminal frame from the sandbox is over {MAX_FRAME} bytes") from None
        except OSError:
            return None
        return parse_frame(line) if line.strip() else None

    async def close(self) -> None:
        self._writer.close()


class AsyncServiceFrames:
    """Frames as WebSocket messages to an `orchard up` service (asyncio); made by `open`."""

    def __init__(self, ws: Any):
        self.ws = ws

    @classmethod
    async def open(cls, url: str, sandbox_id: str, api_key: str | None, timeout: float = 10.0) -> AsyncServiceFrames:
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidHandshake

        try:
            ws = await connect(
                _pty_url(url, sandbox_id), subprotocols=_key_protocol(api_key), open_timeout=timeout, max_size=MAX_FRAME
            )
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            raise _service_refusal(url, exc) from None
        return cls(ws)

    async def send(self, frame: dict[str, Any]) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            await self.ws.send(json.dumps(frame))
        except ConnectionClosed as exc:
            raise AgentError(f"the terminal's connection is closed: {exc}") from exc

    async def recv(self) -> dict[str, Any] | None:
        from websockets.exceptions import ConnectionClosed

        try:
            return parse_frame(await self.ws.recv())
        except ConnectionClosed:
            return None

    async def close(self) -> None:
        await self.ws.close()


async def open_agent_relay(endpoint: AgentEndpoint) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An upgraded connection to an agent's `/pty`, for the service to relay frames over."""
    host, port, auth = _address(endpoint)
    try:
        reader, writer = await open_agent_connection(endpoint, host, port, limit=MAX_FRAME)
        writer.write(_upgrade_request(auth))
        status_line = await reader.readline()
        lines: list[bytes] = []
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b"") and len(lines) <= MAX_HEADERS:
            lines.append(line)
        _status, length = _upgrade_answer(status_line, iter(lines))
    except AgentError:
        raise
    except (OSError, ValueError) as exc:
        raise AgentError(f"no answer from the sandbox's agent: {exc}") from exc
    if length is not None:
        body = await reader.read(length) if length else b""
        writer.close()
        raise _refusal(status_line, body)
    return reader, writer


def attach_terminal(terminal: Terminal, stdin_fd: int = 0, out: Any = None) -> int:
    """Wire `terminal` to this process's terminal (raw mode, resizes) until it exits; its exit code.

    The terminal must already have been sent its init frame, and `stdin_fd` must be a terminal.
    """
    import termios
    import tty

    out = out or sys.stdout.buffer
    done_r, done_w = os.pipe()  # the output thread has ended
    winch_r, winch_w = os.pipe()  # the window was resized
    os.set_blocking(winch_w, False)
    saved = termios.tcgetattr(stdin_fd)
    tty.setraw(stdin_fd, termios.TCSANOW)  # keep what was typed ahead

    def on_resize(_signum: int, _frame: object) -> None:
        # Only a byte: sending from a handler could interrupt a send holding its lock, and deadlock.
        with contextlib.suppress(OSError):
            os.write(winch_w, b"w")

    previous = signal.signal(signal.SIGWINCH, on_resize)
    failure: list[str] = []

    def pump_output() -> None:
        try:
            while (frame := terminal.recv()) is not None and frame["type"] != "exit":
                if frame["type"] == "stdout":
                    out.write(base64.b64decode(frame["data"]))
                    out.flush()
                elif frame["type"] == "error":
                    failure.append(str(frame.get("message")))
        finally:
            with contextlib.suppress(OSError):
                os.write(done_w, b"x")

    reader = threading.Thread(target=pump_output, name="terminal-output", daemon=True)
    reader.start()
    try:
        while True:
            ready = select.select([done_r, winch_r, stdin_fd], [], [])[0]
            if done_r in ready:
                break
            if winch_r in ready:
                os.read(winch_r, 1024)
                size = os.get_terminal_size(stdin_fd)
                with contextlib.suppress(AgentError):
                    terminal.resize(size.lines, size.columns)
            if stdin_fd in ready:
                try:
                    data = os.read(stdin_fd, 4096)
                except OSError:  # our own terminal went away
                    data = b""
                if not data:
                    with contextlib.suppress(AgentError):
                        terminal.signal("HUP")
                    break
                with contextlib.suppress(AgentError):
                    terminal.write(data)
    finally:
        signal.signal(signal.SIGWINCH, previous)
        with contextlib.suppress(termios.error):
            termios.tcsetattr(stdin_fd, termios.TCSADRAIN, saved)
        for fd in (winch_r, winch_w):
            os.close(fd)
    reader.join(timeout=5.0)
    if not reader.is_alive():  # else it may still write its wake-up byte: leave that pipe open
        os.close(done_r)
        os.close(done_w)
    if failure:
        raise AgentError(f"terminal failed: {failure[0]}")
    if terminal.exit_code is None:
        raise AgentError("the terminal's connection closed before its process exited")
    return terminal.exit_code
