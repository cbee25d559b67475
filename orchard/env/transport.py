"""Channels: how a `Call` (see `calls.py`) reaches an agent or a service and comes back.

The direct route to an agent is the hot path of every agent step, and the agent answers a short
command in about a millisecond; a general HTTP client's per-request machinery (URL parsing,
cookies, redirects, connection-pool state) would cost a large share of that again. So agents are
reached through `AgentChannel` / `AsyncAgentChannel`: plain HTTP/1.1 keep-alive connections over
the agent's Unix socket (or its TCP address), for the routes the SDK uses (every answer framed by
Content-Length; no HEAD, no chunked bodies). Services, which may sit behind TLS, proxies or redirects, are reached
through httpx (`HttpxChannel` / `AsyncHttpxChannel`).

Every channel answers `request(call)` with an object that has `status_code`, `headers`,
`content`, `text`, `reason_phrase` and `json()`. Transport failures raise `AgentError`. Agent
calls are never retried: a POST /exec that may have reached the agent must not run twice. Service
calls are retried after a 503 (the service refused them before doing anything) and, for GET and
DELETE only, after a connection failure.

The agent runs in the sandbox, so it is hostile: what it answers is bounded (header lines and
count, and the body by `Call.limit`, checked against Content-Length before the body is read), a
large body can be streamed to a file (`Call.sink`), and its Unix socket is reached without
following a link (`unix_socket_path`): a process in the sandbox can put anything in the run folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import math
import os
import socket
import stat
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx

from orchard.env.calls import ANSWER_LIMIT
from orchard.errors import AgentError, TooLarge

if TYPE_CHECKING:
    from orchard.env.backends.base import AgentEndpoint
    from orchard.env.calls import Call


class Answer:
    """An HTTP answer from an agent."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: dict[str, str], content: bytes):
        self.status_code, self.headers, self.content = status_code, headers, content

    def json(self) -> Any:
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    @property
    def reason_phrase(self) -> str:
        with contextlib.suppress(ValueError):
            return http.HTTPStatus(self.status_code).phrase
        return ""


def _target(call: Call) -> str:
    if not call.params:
        return call.path
    return f"{call.path}?{urllib.parse.urlencode(call.params)}"


def _body(call: Call) -> tuple[bytes, str | None]:
    if call.json is not None:
        return json.dumps(call.json).encode(), "application/json"
    if call.content is not None:
        return call.content, "application/octet-stream"
    return b"", None


def _request_bytes(call: Call, auth: str) -> bytes:
    """The whole HTTP/1.1 request for `call`, ready to send."""
    body, content_type = _body(call)
    head = [f"{call.method} {_target(call)} HTTP/1.1", "Host: agent", f"Authorization: {auth}"]
    head.append(f"Content-Length: {len(body)}")
    if content_type:
        head.append(f"Content-Type: {content_type}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


MAX_HEADER_LINE = 8192
"""Bytes of the status line or of one header line of an agent's answer."""
MAX_HEADERS = 64
"""Header lines of an agent's answer (it sends about five)."""
CHUNK = 1024 * 1024
"""Bytes read at a time of a body streamed into a `Call.sink`."""
CONNECT_SECONDS = 10.0
"""The most a TCP connect to an agent may take (a Pod IP on a lost node drops packets: without a
bound of its own, a connect would wait out the whole command's timeout)."""
KEEPALIVE = tuple(
    (getattr(socket, name), value)
    for name, value in (("TCP_KEEPIDLE", 15), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3))
    if hasattr(socket, name)  # Linux has all three; macOS names the first TCP_KEEPALIVE
)
"""TCP keep-alive on agent connections: a peer gone silent mid-command is noticed in about 30 s."""


def tune_tcp(sock: socket.socket) -> None:
    """No Nagle delay, and keep-alive probes (see KEEPALIVE), on a TCP connection to an agent."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in KEEPALIVE:
        sock.setsockopt(socket.IPPROTO_TCP, option, value)


def _limit(call: Call) -> int:
    return ANSWER_LIMIT if call.limit is None else call.limit


def _check_length(call: Call, length: int) -> None:
    """Refuse, before reading it, a body over the call's limit (the caller closes the connection)."""
    if length > _limit(call):
        raise _too_large(call, f"{length} bytes")


def _too_large(call: Call, size: str) -> TooLarge:
    what = f"{call.method} {call.path}" + (f" {call.params['path']}" if call.params and "path" in call.params else "")
    advice = f"; {call.advice}" if call.advice else ""
    return TooLarge(f"the answer to {what} is {size}, over the host's limit of {_limit(call)} bytes{advice}")


def _header_line(line: bytes) -> bytes:
    if len(line) > MAX_HEADER_LINE:
        raise ValueError(f"a header line of the answer is longer than {MAX_HEADER_LINE} bytes")
    return line


def _parse_head(status_line: bytes, header_lines: list[bytes]) -> tuple[int, dict[str, str], int]:
    """Status, headers and body length of an answer framed by Content-Length (else ValueError)."""
    if not status_line:
        raise ConnectionResetError("the agent closed the connection")
    parts = status_line.split()
    if len(parts) < 2 or not parts[1].isdigit():
        raise ValueError(f"not an HTTP answer: {status_line[:80]!r}")
    headers = {}
    for line in header_lines:
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length", "")
    if not length.isdigit():
        raise ValueError("an answer without Content-Length; the agent always sends one")
    return int(parts[1]), headers, int(length)


@contextlib.contextmanager
def unix_socket_path(path: str) -> Iterator[str]:
    """A path to connect to that reaches the socket at `path` without following any link.

    The run folder is visible to the sandbox, so its `agent.sock` may have been replaced by a link
    to another socket of this host. The folder and the socket are opened without following links
    (`O_PATH | O_NOFOLLOW`), checked to be a folder and a socket, and reached through the pinned
    file (`/proc/self/fd/N`): nothing can be swapped between the check and the connect.
    """
    folder, name = os.path.split(path)
    folder_fd = os.open(folder or ".", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder_fd)
    finally:
        os.close(folder_fd)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise AgentError(f"{path} is not a socket (it was replaced from inside the sandbox?); not connecting")
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def connect_unix(path: str, timeout: float | None) -> socket.socket:
    """A socket connected to the agent's Unix socket at `path` (see `unix_socket_path`)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        with unix_socket_path(path) as pinned:
            sock.connect(pinned)
    except BaseException:
        sock.close()
        raise
    return sock


def _address(endpoint: AgentEndpoint) -> tuple[str, int, str]:
    """Host and port (used when there is no socket path) and the Authorization value of an agent."""
    url = urllib.parse.urlsplit(endpoint.url)
    return url.hostname or "agent", url.port or 80, f"Bearer {endpoint.token}"


def connect_agent(endpoint: AgentEndpoint, timeout: float | None) -> socket.socket:
    """A socket connected to an agent: its Unix socket (see `unix_socket_path`), else its TCP
    address (the connect bounded by CONNECT_SECONDS, the socket tuned by `tune_tcp`)."""
    if endpoint.uds:
        return connect_unix(endpoint.uds, timeout)
    host, port, _ = _address(endpoint)
    connect = CONNECT_SECONDS if timeout is None else min(timeout, CONNECT_SECONDS)
    sock = socket.create_connection((host, port), timeout=connect)
    tune_tcp(sock)
    return sock


class _Connection:
    """One keep-alive socket to the agent, with a buffered reader."""

    def __init__(self, endpoint: AgentEndpoint, host: str, port: int, timeout: float | None):
        self.sock = connect_agent(endpoint, timeout)
        self.reader = self.sock.makefile("rb")

    def exchange(self, message: bytes, call: Call, timeout: float | None) -> Answer:
        self.sock.settimeout(timeout)
        self.sock.sendall(message)
        status_line = self.line()
        header_lines = []
        while (line := self.line()) not in (b"\r\n", b""):
            header_lines.append(line)
            if len(header_lines) > MAX_HEADERS:
                raise ValueError(f"an answer with more than {MAX_HEADERS} header lines")
        status, headers, length = _parse_head(status_line, header_lines)
        _check_length(call, length)
        if call.sink is not None and status < 400:
            self._copy(length, call.sink)
            return Answer(status, headers, b"")
        content = self.reader.read(length)
        if len(content) < length:
            raise ConnectionResetError("the agent closed the connection mid-answer")
        return Answer(status, headers, content)

    def line(self) -> bytes:
        """One line of the answer's head, bounded."""
        return _header_line(self.reader.readline(MAX_HEADER_LINE + 1))

    def _copy(self, length: int, sink: Any) -> None:
        while length:
            chunk = self.reader.read(min(CHUNK, length))
            if not chunk:
                raise ConnectionResetError("the agent closed the connection mid-answer")
            sink.write(chunk)
            length -= len(chunk)

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


class AgentChannel:
    """Keep-alive HTTP/1.1 to one agent; one pooled connection per concurrent request. Thread-safe."""

    def __init__(self, endpoint: AgentEndpoint, *, timeout: float | None = None):
        self.endpoint, self.timeout = endpoint, timeout
        self._host, self._port, self._auth = _address(endpoint)
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    def request(self, call: Call) -> Answer:
        timeout = self.timeout if call.timeout is None else call.timeout
        message = _request_bytes(call, self._auth)
        with self._lock:
            connection = self._idle.pop() if self._idle else None
        try:
            if connection is None:
                connection = _Connection(self.endpoint, self._host, self._port, timeout)
            answer = connection.exchange(message, call, timeout)
        except (TooLarge, AgentError):
            if connection is not None:
                connection.close()
            raise
        except (OSError, ValueError) as exc:
            if connection is not None:
                connection.close()
            raise AgentError(f"no answer from the sandbox's agent: {type(exc).__name__} {exc}".rstrip()) from exc
        if answer.headers.get("connection", "").lower() == "close":
            connection.close()
        else:
            with self._lock:
                if not self._closed:
                    self._idle.append(connection)
                    connection = None
            if connection is not None:
                connection.close()
        return answer

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def __enter__(self) -> AgentChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncAgentChannel:
    """The asyncio twin of `AgentChannel` (one event loop)."""

    def __init__(self, endpoint: AgentEndpoint, *, timeout: float | None = None):
        self.endpoint, self.timeout = endpoint, timeout
        self._host, self._port, self._auth = _address(endpoint)
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._closed = False

    async def request(self, call: Call) -> Answer:
        message = _request_bytes(call, self._auth)
        timeout = self.timeout if call.timeout is None else call.timeout
        try:
            async with asyncio.timeout(timeout):
                reader, writer = self._idle.pop() if self._idle else await self._connect()
                try:
                    writer.write(message)
                    status, headers, content = await _read_answer(reader, call)
                except BaseException:
                    writer.close()
                    raise
        except (TooLarge, AgentError):
            raise
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            raise AgentError(f"no answer from the sandbox's agent: {type(exc).__name__} {exc}".rstrip()) from exc
        if self._closed or headers.get("connection", "").lower() == "close":
            writer.close()
        else:
            self._idle.append((reader, writer))
        return Answer(status, headers, content)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await open_agent_connection(self.endpoint, self._host, self._port)

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for _reader, writer in idle:
            writer.close()


async def open_agent_connection(
    endpoint: AgentEndpoint, host: str, port: int, limit: int = 2**16
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """An asyncio connection to an agent: its Unix socket (never through a link), else host:port.

    `limit` bounds a line read with `readline` (asyncio's default, 64 KiB, unless told).
    """
    if not endpoint.uds:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=limit), CONNECT_SECONDS)
        tune_tcp(writer.get_extra_info("socket"))
        return reader, writer
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        with unix_socket_path(endpoint.uds) as pinned:
            await asyncio.get_running_loop().sock_connect(sock, pinned)
        return await asyncio.open_unix_connection(sock=sock, limit=limit)
    except BaseException:
        sock.close()
        raise


async def _read_answer(reader: asyncio.StreamReader, call: Call) -> tuple[int, dict[str, str], bytes]:
    status_line = _header_line(await reader.readline())
    header_lines = []
    while (line := _header_line(await reader.readline())) not in (b"\r\n", b""):
        header_lines.append(line)
        if len(header_lines) > MAX_HEADERS:
            raise ValueError(f"an answer with more than {MAX_HEADERS} header lines")
    status, headers, length = _parse_head(status_line, header_lines)
    _check_length(call, length)
    if call.sink is None or status >= 400:
        return status, headers, await reader.readexactly(length)
    while length:
        chunk = await reader.read(min(CHUNK, length))
        if not chunk:
            raise asyncio.IncompleteReadError(b"", length)
        call.sink.write(chunk)
        length -= len(chunk)
    return status, headers, b""


class HttpxChannel:
    """Calls to a service through an httpx client (TLS, proxies and redirects as httpx does them)."""

    def __init__(self, client: httpx.Client):
        self.client = client

    def request(self, call: Call) -> httpx.Response | Answer:
        retry = _Retry(call, str(self.client.base_url))
        while True:
            try:
                response = self._send(call)
            except httpx.TransportError as exc:
                time.sleep(retry.after_failure(exc))
            else:
                pause = retry.after_answer(response)
                if pause is None:
                    return response
                time.sleep(pause)

    def _send(self, call: Call) -> httpx.Response | Answer:
        if call.limit is None and call.sink is None:
            return self.client.request(call.method, call.path, **_httpx_options(call))
        with self.client.stream(call.method, call.path, **_httpx_options(call)) as response:
            body = _Body(call, response)
            for chunk in response.iter_bytes(CHUNK):
                body.add(chunk)
        return body.answer()

    def close(self) -> None:
        self.client.close()


class AsyncHttpxChannel:
    """The async twin of `HttpxChannel`."""

    def __init__(self, client: httpx.AsyncClient):
        self.client = client

    async def request(self, call: Call) -> httpx.Response | Answer:
        retry = _Retry(call, str(self.client.base_url))
        while True:
            try:
                response = await self._send(call)
            except httpx.TransportError as exc:
                await asyncio.sleep(retry.after_failure(exc))
            else:
                pause = retry.after_answer(response)
                if pause is None:
                    return response
                await asyncio.sleep(pause)

    async def _send(self, call: Call) -> httpx.Response | Answer:
        if call.limit is None and call.sink is None:
            return await self.client.request(call.method, call.path, **_httpx_options(call))
        async with self.client.stream(call.method, call.path, **_httpx_options(call)) as response:
            body = _Body(call, response)
            async for chunk in response.aiter_bytes(CHUNK):
                body.add(chunk)
        return body.answer()

    async def aclose(self) -> None:
        await self.client.aclose()


class _Body:
    """A service's answer to a call with a limit or a sink, read chunk by chunk (see `Call`)."""

    def __init__(self, call: Call, response: httpx.Response):
        self.call, self.response = call, response
        length = response.headers.get("content-length", "")
        if length.isdigit():
            _check_length(call, int(length))
        self.sink = call.sink if response.status_code < 400 else None
        self.size, self.chunks = 0, bytearray()

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > _limit(self.call):
            raise _too_large(self.call, f"at least {self.size} bytes")
        if self.sink is not None:
            self.sink.write(chunk)
        else:
            self.chunks += chunk

    def answer(self) -> Answer:
        return Answer(self.response.status_code, dict(self.response.headers), bytes(self.chunks))


RETRY_SECONDS = 120.0
"""How long a call refused with 503 (nothing was done: any call) is tried again. GET and DELETE
are also tried again after a connection failure (they may safely run twice; a POST may not)."""
IDEMPOTENT = frozenset({"GET", "DELETE"})
CONNECT_RETRIES = 3
"""Tries after a connection failure (0.1 + 0.2 + 0.4 s): enough for a blip, short for a dead service."""


class _Retry:
    """When to try a service call again, and after how long (shared by the sync and async channels)."""

    def __init__(self, call: Call, where: str):
        self.call, self.where = call, where
        self.deadline = time.monotonic() + RETRY_SECONDS
        self.attempt = 0

    def after_failure(self, exc: httpx.TransportError) -> float:
        """The pause before the next try after a connection failure; raises when there is none."""
        if self.call.method not in IDEMPOTENT or self.attempt >= CONNECT_RETRIES:
            raise AgentError(f"no answer from {self.where}: {type(exc).__name__} {exc}".rstrip()) from exc
        self.attempt += 1
        return _backoff(self.attempt - 1)

    def after_answer(self, response: httpx.Response | Answer) -> float | None:
        """The pause before the next try after an answer, or None to keep this answer."""
        if response.status_code != 503:
            return None
        pause = _retry_after(response, self.attempt)
        if time.monotonic() + pause > self.deadline:
            return None
        self.attempt += 1
        return pause


def _backoff(attempt: int) -> float:
    return min(0.1 * 2**attempt, 5.0)


def _retry_after(response: httpx.Response | Answer, attempt: int) -> float:
    try:
        seconds = float(response.headers.get("retry-after", ""))
    except ValueError:
        return _backoff(attempt)
    return min(max(seconds, 0.0), 30.0) if math.isfinite(seconds) else _backoff(attempt)


def _httpx_options(call: Call) -> dict[str, Any]:
    timeout = httpx.USE_CLIENT_DEFAULT if call.timeout is None else call.timeout
    return {"params": call.params, "json": call.json, "content": call.content, "timeout": timeout}
