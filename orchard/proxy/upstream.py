"""The proxy's HTTP/1.1 client to the upstream: asyncio streams, h11 framing, kept-alive connections.

httpx's async client costs about 2 ms a request on its own (anyio and httpcore's pool around each
read); this costs a tenth of that, which is most of what the proxy may add (bench/proxy.py). It
does what the proxy needs and nothing more: one request written in one send, the answer's head,
then its body as it arrives (chunked or sized framing undone by h11), and the connection kept for
the next request when both sides ended their message cleanly.

    UpstreamError(OrchardError)
    ├── Unreachable(ConnectionError)   no connection, or it broke before or during the answer
    └── TimedOut(TimeoutError)         no connection, or no bytes, within the timeout
    InvalidRequest                     the client's request cannot be written as HTTP/1.1

A kept connection the upstream has closed meanwhile is noticed when reused: a request on it that
gets no byte back is sent once more on a new connection (the upstream never saw the first).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import h11

from orchard.errors import InvalidRequest, OrchardError

READ_BYTES = 65536
KEPT = 256
"""Idle connections kept for reuse at most."""


class UpstreamError(OrchardError):
    """The upstream failed to answer (the message is one line)."""


class Unreachable(UpstreamError, ConnectionError):
    """No connection, or it broke before the answer ended."""


class TooLarge(UpstreamError):
    """An answer longer than the proxy takes."""


class TimedOut(UpstreamError, TimeoutError):
    """No connection, or nothing read, within the timeout."""


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer
        self.http = h11.Connection(h11.CLIENT)
        self.reused = False

    def stale(self) -> bool:
        return self.reader.at_eof() or self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


class Answer:
    """The upstream's answer: status and headers read, the body read by `chunks()` or `read()`.
    `aclose()` hands the connection back when the body was read to its end, else closes it."""

    def __init__(self, pool: Pool, connection: _Connection, head: h11.Response):
        self.status = head.status_code
        self.headers = [(bytes(k).decode("latin-1"), bytes(v).decode("latin-1")) for k, v in head.headers]
        self._pool, self._connection, self._ended = pool, connection, False

    def header(self, name: str) -> str:
        return next((v for k, v in self.headers if k == name), "")

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives: what one read brought in, as one piece (however many chunks of
        the upstream's chunked encoding it holds), so nothing waits and nothing is split finer."""
        while not self._ended:
            pieces = [self._body(await self._pool._next_event(self._connection))]
            while not self._ended:
                event = self._pool._parsed_event(self._connection)
                if event is h11.NEED_DATA:
                    break
                pieces.append(self._body(event))
            if any(pieces):
                yield b"".join(pieces)

    def _body(self, event: object) -> bytes:
        if isinstance(event, h11.Data):
            return bytes(event.data)
        if isinstance(event, h11.EndOfMessage):
            self._ended = True
            return b""
        raise Unreachable(f"the upstream {self._pool.base} broke off its answer")

    async def read(self, limit: int) -> bytes:
        """The whole body; `TooLarge` past `limit` bytes (what came is dropped, the connection closed)."""
        pieces, size = [], 0
        async for chunk in self.chunks():
            size += len(chunk)
            if size > limit:
                raise TooLarge(f"the upstream's answer is over the proxy's limit of {limit} bytes")
            pieces.append(chunk)
        return b"".join(pieces)

    def aclose(self) -> None:
        connection, self._connection = self._connection, None  # type: ignore[assignment]
        if connection is not None:
            self._pool._release(connection, clean=self._ended)


class Pool:
    """Connections to one upstream (`base`: scheme, host, port and path prefix)."""

    def __init__(self, base: str, *, timeout: float, connect_timeout: float = 10.0):
        parts = urlsplit(base)
        self.base = base
        self.prefix = parts.path.rstrip("/")
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.authority = parts.netloc.rpartition("@")[2]
        self.tls = ssl.create_default_context() if parts.scheme == "https" else None
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self._idle: list[_Connection] = []

    async def request(self, method: str, target: str, headers: list[tuple[str, str]], body: bytes) -> Answer:
        """Send one request (`target`: the API path and query) and read the answer's head."""
        head = [("host", self.authority), *headers, ("content-length", str(len(body)))]
        while True:
            connection = await self._connection()
            try:
                http = connection.http
                wire = http.send(h11.Request(method=method, target=self.prefix + target, headers=head))
                connection.writer.write(wire + http.send(h11.Data(data=body)) + http.send(h11.EndOfMessage()))
                event = await self._next_event(connection)
                while isinstance(event, h11.InformationalResponse):
                    event = await self._next_event(connection)
            except h11.LocalProtocolError as exc:  # the client's request, not the upstream, is at fault
                connection.close()
                raise InvalidRequest(f"the request cannot be forwarded: {_line(exc)}") from None
            except Unreachable:
                connection.close()
                if connection.reused:
                    continue  # a kept connection the upstream had closed: once more, on a new one
                raise
            except BaseException:
                connection.close()
                raise
            if not isinstance(event, h11.Response):
                connection.close()
                raise Unreachable(f"the upstream {self.base} closed the connection without an answer")
            return Answer(self, connection, event)

    async def _connection(self) -> _Connection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.stale():
                connection.reused = True
                return connection
            connection.close()
        try:
            async with asyncio.timeout(self.connect_timeout):
                reader, writer = await asyncio.open_connection(
                    self.host,
                    self.port,
                    ssl=self.tls,
                    limit=READ_BYTES,
                    server_hostname=self.host if self.tls else None,
                )
        except TimeoutError:
            raise TimedOut(
                f"the upstream {self.base} did not accept a connection within {self.connect_timeout:g} s"
            ) from None
        except OSError as exc:
            raise Unreachable(f"the upstream {self.base} cannot be reached: {_line(exc)}") from None
        return _Connection(reader, writer)

    def _parsed_event(self, connection: _Connection) -> object:
        """The next event of what was read so far, or NEED_DATA."""
        try:
            event = connection.http.next_event()
        except h11.RemoteProtocolError as exc:
            raise Unreachable(f"the upstream {self.base} answered in broken HTTP: {_line(exc)}") from None
        if event is h11.PAUSED:
            raise Unreachable(f"the upstream {self.base} sent more than one answer")
        return event

    async def _next_event(self, connection: _Connection) -> object:
        """The next event, reading from the upstream as long as it takes."""
        http = connection.http
        while True:
            event = self._parsed_event(connection)
            if event is not h11.NEED_DATA:
                return event
            try:
                async with asyncio.timeout(self.timeout):
                    data = await connection.reader.read(READ_BYTES)
            except TimeoutError:
                raise TimedOut(f"the upstream {self.base} sent nothing for {self.timeout:g} s") from None
            except OSError as exc:
                raise Unreachable(f"the upstream {self.base} broke the connection: {_line(exc)}") from None
            if not data and http.their_state is h11.SEND_RESPONSE:
                raise Unreachable(f"the upstream {self.base} closed the connection without an answer")
            http.receive_data(data)

    def _release(self, connection: _Connection, *, clean: bool) -> None:
        http = connection.http
        if clean and http.our_state is h11.DONE and http.their_state is h11.DONE and len(self._idle) < KEPT:
            http.start_next_cycle()
            self._idle.append(connection)
        else:
            connection.close()

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
