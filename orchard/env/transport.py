"""A lean httpx transport for talking to an agent over its Unix socket.

The direct route is the hot path of every agent step, and the agent answers a short command in
about a millisecond: httpcore's per-request machinery (connection-pool state, h11 events) would
be a large part of that. This transport keeps plain `http.client` keep-alive connections to the
socket instead; httpx still builds requests and responses, so everything above it is unchanged.

Requests are never retried: a POST /exec that may have reached the agent must not run twice.
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import threading

import httpx


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None):
        super().__init__("agent", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.socket_path)
        self.sock = sock


class UnixSocketTransport(httpx.BaseTransport):
    """HTTP/1.1 keep-alive over a Unix socket, one pooled connection per concurrent request."""

    def __init__(self, path: str):
        self.path = path
        self._idle: list[_UnixConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        connection = self._checkout(_read_timeout(request))
        try:
            connection.request(
                request.method,
                request.url.raw_path.decode("ascii"),
                body=request.read(),
                headers=dict(request.headers),
            )
            answer = connection.getresponse()
            content = answer.read()
        except TimeoutError as exc:
            connection.close()
            raise httpx.ReadTimeout(f"the agent did not answer in time ({exc})", request=request) from exc
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            kind = (
                httpx.ConnectError if isinstance(exc, FileNotFoundError | ConnectionRefusedError) else httpx.ReadError
            )
            raise kind(f"{type(exc).__name__}: {exc}", request=request) from exc
        if answer.will_close:
            connection.close()
        else:
            self._checkin(connection)
        return httpx.Response(answer.status, headers=answer.getheaders(), content=content, request=request)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _checkout(self, timeout: float | None) -> _UnixConnection:
        with self._lock:
            connection = self._idle.pop() if self._idle else None
        if connection is None:
            return _UnixConnection(self.path, timeout)
        connection.timeout = timeout
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        return connection

    def _checkin(self, connection: _UnixConnection) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(connection)
                return
        connection.close()


class AsyncUnixSocketTransport(httpx.AsyncBaseTransport):
    """The asyncio twin: keep-alive asyncio stream connections to a Unix socket.

    Only what the agent sends is understood: HTTP/1.1 answers framed by Content-Length.
    """

    def __init__(self, path: str):
        self.path = path
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        head = [f"{request.method} {request.url.raw_path.decode('ascii')} HTTP/1.1"]
        head += [f"{name}: {value}" for name, value in request.headers.items()]
        message = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        try:
            reader, writer = self._idle.pop() if self._idle else await asyncio.open_unix_connection(self.path)
        except OSError as exc:
            raise httpx.ConnectError(f"{type(exc).__name__}: {exc}", request=request) from exc
        try:
            writer.write(message)
            answer = _read_answer(reader)
            timeout = _read_timeout(request)
            status, headers, content = await (answer if timeout is None else asyncio.wait_for(answer, timeout))
        except TimeoutError as exc:
            writer.close()
            raise httpx.ReadTimeout("the agent did not answer in time", request=request) from exc
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            writer.close()
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}", request=request) from exc
        if any(name.lower() == "connection" and value.lower() == "close" for name, value in headers):
            writer.close()
        else:
            self._idle.append((reader, writer))
        return httpx.Response(status, headers=headers, content=content, request=request)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for _reader, writer in idle:
            writer.close()


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, list[tuple[str, str]], bytes]:
    status = int((await reader.readline()).split()[1])
    headers = []
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
        if name.strip().lower() == "content-length":
            length = int(value)
    return status, headers, await reader.readexactly(length)


def _read_timeout(request: httpx.Request) -> float | None:
    timeouts = request.extensions.get("timeout") or {}
    return timeouts.get("read")
