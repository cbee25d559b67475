"""A minimal Chrome DevTools Protocol client: JSON commands and events over one WebSocket.

The WebSocket runs over a socket the caller brings (`Sandbox.connect(9222)`: the sandbox's agent
carries the bytes), so the browser is reached without any host port. One reader thread takes
every message off the socket: a command's answer wakes the thread that sent it, an event goes to
the listeners. Sessions are flattened (`Target.attachToTarget` with `flatten: true`): a page's
commands and events carry its `sessionId` on the same socket.

The browser is the sandbox's and taken as hostile:

* a message over `MAX_MESSAGE` bytes closes the connection before its payload is read (the
  WebSocket's `max_size`, checked on the frame's header); an answer over its command's own bound,
  or an event over `MAX_EVENT`, is refused or dropped; no compression (no inflating bombs);
* every command has a timeout (`BrowserTimeout`, naming the method), the opening handshake too;
* what is not a JSON object of the protocol's shape ends the connection with a `BrowserError`;
  from then on, and after the browser closes or dies, every command fails at once, naming why.

    BrowserError(SandboxError)      the browser died, refused the connection, or sent what the host refuses
    ├── BrowserTimeout(TimeoutError)  no answer in time
    └── CDPError                    the browser answered a command with an error (`method`, `code`)
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.protocol import State
from websockets.sync.client import ClientConnection, connect

from orchard.errors import SandboxError

MAX_MESSAGE = 24 * 2**20
"""The most one WebSocket message may hold: a 16 MiB screenshot in base64, with room to spare."""
MAX_ANSWER = 4 * 2**20
"""A command's answer's bound unless the command asks for more (`Page.captureScreenshot` does)."""
MAX_EVENT = 4 * 2**20
"""Events over this are dropped unread."""
COMMAND_TIMEOUT = 10.0
"""Seconds a command waits for its answer (and the opening handshake for its end) unless it says otherwise."""
PROTOCOL_POLL = 0.1
"""How often a command waiting for its answer looks whether the WebSocket is closing on its own."""
CLOSE_TIMEOUT = 2.0
_LEGACY: dict[str, Any] = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}
"""websockets 17 warns unless `connect` is asked for its (lasting) direct connection by name."""

Listener = Callable[[str, dict[str, Any], str | None], None]
"""`listener(method, params, session_id)`: called on the reader thread for every event; it must
not block, and must not wait for a command's answer (use `post`)."""


class BrowserError(SandboxError):
    """The browser in a sandbox died, refused the connection, or sent what the host refuses."""


class BrowserTimeout(BrowserError, TimeoutError):
    """The browser did not answer in time."""


class CDPError(BrowserError):
    """The browser answered a command with an error."""

    def __init__(self, method: str, code: int, message: str):
        super().__init__(f"{method} failed: {message} (CDP error {code})")
        self.method, self.code = method, code


class _Slot:
    """Where the answer to one command lands."""

    __slots__ = ("answer", "done", "error", "max_bytes", "method")

    def __init__(self, method: str, max_bytes: int):
        self.method, self.max_bytes = method, max_bytes
        self.done = threading.Event()
        self.answer: dict[str, Any] | None = None
        self.error: BrowserError | None = None


class CDPConnection:
    """One DevTools WebSocket: thread-safe `send` (command -> its result), `post` (fire and
    forget), and `listeners` for events. Closed with `close()` or as a context manager."""

    def __init__(self, ws: ClientConnection, what: str = "the browser"):
        self._ws = ws
        self.what = what
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._pending: dict[int, _Slot] = {}
        self._broken: BrowserError | None = None
        self.listeners: list[Listener] = []
        self._reader = threading.Thread(target=self._read, name="orchard-cdp-reader", daemon=True)
        self._reader.start()

    @classmethod
    def open(
        cls,
        sock: socket.socket,
        path: str,
        *,
        port: int = 9222,
        timeout: float | None = None,
        what: str = "the browser",
    ) -> CDPConnection:
        """The WebSocket at `path` (`/devtools/browser/ID`) over `sock`, a stream already
        connected to the DevTools port (`port` only names it in the Host header, which Chromium
        checks); the opening handshake must be done within `timeout`. `sock` is closed when this
        fails, and with the connection otherwise. `timeout`: `COMMAND_TIMEOUT` by default."""
        timeout = COMMAND_TIMEOUT if timeout is None else timeout
        try:
            ws = connect(
                f"ws://127.0.0.1:{port}{path}",
                sock=sock,
                open_timeout=timeout,
                close_timeout=CLOSE_TIMEOUT,
                ping_interval=None,  # every command has its own timeout; the browser needs no pings
                max_size=MAX_MESSAGE,
                max_queue=64,
                compression=None,
                proxy=None,
                user_agent_header=None,
                **_LEGACY,
            )
        except TimeoutError as exc:
            sock.close()
            raise BrowserTimeout(f"{what} did not finish the DevTools handshake within {timeout:g} s") from exc
        except (InvalidHandshake, InvalidURI, ConnectionClosed, OSError, EOFError, ValueError) as exc:
            sock.close()
            raise BrowserError(f"{what} refused the DevTools WebSocket: {_short(exc)}") from exc
        return cls(ws, what)

    @property
    def closed(self) -> bool:
        """True once the connection is over, for whatever reason."""
        return self._broken is not None

    def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session_id: str | None = None,
        timeout: float | None = None,
        max_bytes: int = MAX_ANSWER,
    ) -> dict[str, Any]:
        """Send a command and wait for its result (a dict). `CDPError` when the browser answers
        with an error, `BrowserTimeout` after `timeout` seconds, `BrowserError` when the
        connection is or goes down, or the answer is over `max_bytes`. `timeout`: `COMMAND_TIMEOUT`
        by default."""
        timeout = COMMAND_TIMEOUT if timeout is None else timeout
        slot = _Slot(method, max_bytes)
        ident = self._post(method, params, session_id, slot)
        deadline = time.monotonic() + timeout
        while not slot.done.wait(max(0.0, min(PROTOCOL_POLL, deadline - time.monotonic()))):
            self._check_protocol()
            if time.monotonic() >= deadline:
                with self._lock:
                    self._pending.pop(ident, None)
                if not slot.done.is_set():
                    raise BrowserTimeout(f"{self.what} did not answer {method} within {timeout:g} s")
        if slot.error is not None:
            raise slot.error
        assert slot.answer is not None
        return slot.answer

    def post(self, method: str, params: dict[str, Any] | None = None, *, session_id: str | None = None) -> None:
        """Send a command without waiting for its answer (a listener's way: it runs on the reader
        thread, which must not wait for itself). A broken connection is ignored here: the next
        `send` says so."""
        with contextlib.suppress(BrowserError):
            self._post(method, params, session_id, None)

    def close(self) -> None:
        """Close the WebSocket and its socket; idempotent. Commands still waiting fail at once.
        A healthy connection is closed in order (bounded by `CLOSE_TIMEOUT`), a broken one cut."""
        healthy = self._broken is None
        self._fail(BrowserError(f"the DevTools connection to {self.what} was closed"))
        if healthy:
            self._ws.close()
        self.abort()

    def abort(self) -> None:
        """Cut the connection at once: no closing handshake (a browser that does not answer
        would not answer that either)."""
        self._fail(BrowserError(f"the DevTools connection to {self.what} was cut"))
        # shut down, not closed: the thread polling the socket wakes to its end and closes it (an
        # fd closed under a poll would leave that thread waiting)
        with contextlib.suppress(OSError):
            self._ws.socket.shutdown(socket.SHUT_RDWR)
        if threading.current_thread() is not self._reader:
            self._reader.join(CLOSE_TIMEOUT)
            self._ws.socket.close()

    def __enter__(self) -> CDPConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _post(self, method: str, params: dict[str, Any] | None, session_id: str | None, slot: _Slot | None) -> int:
        message: dict[str, Any] = {"id": 0, "method": method, "params": params or {}}
        if session_id is not None:
            message["sessionId"] = session_id
        with self._lock:
            if self._broken is not None:
                raise BrowserError(f"{method}: {self._broken}")
            ident = message["id"] = next(self._ids)
            if slot is not None:
                self._pending[ident] = slot
            try:
                self._ws.send(json.dumps(message))
            except (ConnectionClosed, OSError) as exc:
                self._pending.pop(ident, None)
                raise BrowserError(f"{method}: {self.what} closed the DevTools connection ({_short(exc)})") from exc
        return ident

    def _read(self) -> None:
        """The reader thread: every message, until the connection ends."""
        try:
            for raw in self._ws:
                if isinstance(raw, bytes):
                    raise BrowserError(f"{self.what} sent a binary DevTools message")
                self._dispatch(raw)
        except ConnectionClosed as exc:
            self._fail(BrowserError(_closed_reason(exc, self.what)))
        except BrowserError as exc:
            self._fail(exc)
            self.abort()
        except Exception as exc:  # a listener's bug or the socket's failure: surfaced at the next command
            self._fail(BrowserError(f"reading from {self.what} failed: {_short(exc)}"))
            self.abort()
        else:
            self._fail(BrowserError(f"{self.what} closed the DevTools connection"))

    def _dispatch(self, raw: str) -> None:
        """One message: an answer to its slot, an event to the listeners."""
        try:
            message = json.loads(raw)
        except (ValueError, RecursionError) as exc:  # nesting too deep is refused, not recursed into
            raise BrowserError(f"{self.what} sent a DevTools message that is not JSON: {raw[:80]!r}") from exc
        if not isinstance(message, dict):
            raise BrowserError(f"{self.what} sent a DevTools message that is not an object: {raw[:80]!r}")
        if "id" in message:
            self._answer(message, len(raw))
            return
        method, params, session = message.get("method"), message.get("params", {}), message.get("sessionId")
        if not (isinstance(method, str) and isinstance(params, dict) and isinstance(session, str | None)):
            raise BrowserError(f"{self.what} sent a DevTools message of no known shape: {raw[:80]!r}")
        if len(raw) > MAX_EVENT:
            return
        for listener in list(self.listeners):
            listener(method, params, session)

    def _answer(self, message: dict[str, Any], size: int) -> None:
        ident = message["id"]
        with self._lock:
            slot = self._pending.pop(ident, None) if isinstance(ident, int) else None
        if slot is None:
            return  # the answer to a command that timed out, or to a `post`
        error, result = message.get("error"), message.get("result", {})
        if size > slot.max_bytes:
            slot.error = BrowserError(f"{self.what}'s answer to {slot.method} is over {slot.max_bytes} bytes")
        elif error is not None:
            code = error.get("code") if isinstance(error, dict) else None
            text = error.get("message") if isinstance(error, dict) else None
            slot.error = CDPError(
                slot.method, code if isinstance(code, int) else 0, str(text)[:300] if text else "no message"
            )
        elif not isinstance(result, dict):
            slot.error = BrowserError(f"{self.what}'s answer to {slot.method} is not an object")
        else:
            slot.answer = result
        slot.done.set()

    def _check_protocol(self) -> None:
        """Fail the connection at once when the WebSocket is closing on its own: websockets
        refused a frame (over `MAX_MESSAGE`, or not of the protocol) and sent its close, but
        waits for the peer's, which a hostile one never sends."""
        protocol = self._ws.protocol
        if protocol.state is State.OPEN or self._broken is not None:
            return
        sent = protocol.close_sent
        if sent is not None and sent.code == 1009:
            reason = f"{self.what} sent a DevTools message over {MAX_MESSAGE} bytes; the connection was closed"
        elif sent is not None and sent.code != 1000:
            reason = f"{self.what} broke the WebSocket protocol ({sent.reason[:100] or sent.code}); the connection was closed"
        else:
            return  # an orderly close, which the reader sees end
        self._fail(BrowserError(reason))
        self.abort()

    def _fail(self, error: BrowserError) -> None:
        """The connection is over: remember why, and fail every command still waiting."""
        with self._lock:
            if self._broken is None:
                self._broken = error
            pending, self._pending = self._pending, {}
        for slot in pending.values():
            slot.error = BrowserError(f"{slot.method}: {self._broken}")
            slot.done.set()


def _closed_reason(exc: ConnectionClosed, what: str) -> str:
    """Why the WebSocket ended, in words: a message over the bound, the browser's close, or its death."""
    sent, rcvd = exc.sent, exc.rcvd
    if sent is not None and sent.code == 1009:
        return f"{what} sent a DevTools message over {MAX_MESSAGE} bytes; the connection was closed"
    if rcvd is not None:
        return f"{what} closed the DevTools connection (code {rcvd.code})"
    return f"the DevTools connection to {what} broke ({_short(exc)})"


def _short(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__)[:200]
