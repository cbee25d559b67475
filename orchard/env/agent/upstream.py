"""``POST /http``: one HTTP/1.1 request to a service of the sandbox at ``127.0.0.1:port``, its
body validated (`HttpRequest`), its answer read within one deadline and bounds (`call_service`)."""

from __future__ import annotations

import base64
import socket
import time

from .protocol import (
    HTTP_AGENT_HEADERS,
    HTTP_DEFAULT_MAX_BYTES,
    HTTP_DEFAULT_TIMEOUT,
    HTTP_MAX_ANSWER_HEADERS,
    HTTP_MAX_BYTES,
    HTTP_MAX_HEAD_BYTES,
    HTTP_MAX_PATH,
    HTTP_MAX_REQUEST_HEADERS,
    HTTP_MAX_TIMEOUT,
    HTTP_METHODS,
    HTTP_TOKEN_CHARS,
    ApiError,
    field_str,
    field_timeout,
    http_port,
)

HTTP_MAX_INTERIM = 16  # 1xx answers (100 Continue, 103 Early Hints) skipped before the real one
HTTP_RECV = 256 * 1024


class HttpRequest:
    """A validated ``POST /http`` body: one request to ``127.0.0.1:port``."""

    __slots__ = ("body", "headers", "max_bytes", "method", "path", "port", "timeout")

    def __init__(self, data: dict[str, object]) -> None:
        self.port = http_port(data)
        self.method = http_method(data)
        self.path = http_path(data)
        self.headers = http_headers(data)
        self.body = http_body(data)
        self.timeout = http_timeout(data)
        self.max_bytes = http_max_bytes(data)

    @property
    def where(self) -> str:
        return f"127.0.0.1:{self.port}"

    def message(self) -> bytes:
        """The request's bytes: its own head, then the agent's Host, framing and ``Connection: close``."""
        lines = [f"{self.method} {self.path} HTTP/1.1", f"Host: {self.where}"]
        lines.extend(f"{name}: {value}" for name, value in self.headers)
        if self.body is not None or self.method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(self.body or b'')}")
        lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (self.body or b"")


def http_method(data: dict[str, object]) -> str:
    method = data.get("method")
    if method is None:
        return "POST"
    if not isinstance(method, str) or method not in HTTP_METHODS:
        raise ApiError(400, f"method must be one of {', '.join(sorted(HTTP_METHODS))}")
    return str(method)


def http_path(data: dict[str, object]) -> str:
    """The request target: an absolute path (query included), printable ASCII, never a URL."""
    path = data.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise ApiError(400, "path must be a string starting with / (the service is always 127.0.0.1:port)")
    if path.startswith("//"):  # `//host/x` names an authority to a URL parser: a request has none
        raise ApiError(400, "path must not start with // (an authority): the service is always 127.0.0.1:port")
    if len(path) > HTTP_MAX_PATH:
        raise ApiError(400, f"path is {len(path)} characters, over the limit of {HTTP_MAX_PATH}")
    if not all("!" <= c <= "~" for c in path):
        raise ApiError(400, "path must be printable ASCII without spaces, CR, LF or NUL (percent-encode the rest)")
    return path


def is_token(name: str) -> bool:
    """An HTTP field name (RFC 9110 token)."""
    return bool(name) and all(c in HTTP_TOKEN_CHARS for c in name)


def http_headers(data: dict[str, object]) -> list[tuple[str, str]]:
    headers = data.get("headers")
    if headers is None:
        return []
    if not isinstance(headers, dict):
        raise ApiError(400, "headers must be an object mapping names to string values")
    if len(headers) > HTTP_MAX_REQUEST_HEADERS:
        raise ApiError(400, f"at most {HTTP_MAX_REQUEST_HEADERS} headers")
    size = 0
    for name, value in headers.items():
        if not is_token(name):
            raise ApiError(400, f"header name {name[:80]!r} is not an HTTP token")
        if name.lower() in HTTP_AGENT_HEADERS:
            raise ApiError(400, f"the agent sets {name} itself; leave it out of headers")
        if not isinstance(value, str) or any(c in value for c in "\r\n\0"):
            raise ApiError(400, f"headers[{name!r}] must be a string without CR, LF or NUL")
        try:
            value.encode("latin-1")
        except UnicodeEncodeError:
            raise ApiError(400, f"headers[{name!r}] must be Latin-1 text (percent-encode the rest)") from None
        size += len(name) + len(value) + 4
    if size > HTTP_MAX_HEAD_BYTES:
        raise ApiError(400, f"headers are {size} bytes, over the limit of {HTTP_MAX_HEAD_BYTES}")
    return [(name, value.strip()) for name, value in headers.items()]


def http_body(data: dict[str, object]) -> bytes | None:
    value = field_str(data, "body")
    if value is None:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise ApiError(400, "body must be base64-encoded") from None


def http_timeout(data: dict[str, object]) -> float:
    timeout = field_timeout(data)
    if timeout is None:
        return HTTP_DEFAULT_TIMEOUT
    if timeout > HTTP_MAX_TIMEOUT:
        raise ApiError(400, f"timeout must be at most {HTTP_MAX_TIMEOUT:g} seconds")
    return timeout


def http_max_bytes(data: dict[str, object]) -> int:
    value = data.get("max_bytes")
    if value is None:
        return HTTP_DEFAULT_MAX_BYTES
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= HTTP_MAX_BYTES:
        raise ApiError(400, f"max_bytes must be an integer from 0 to {HTTP_MAX_BYTES} ({HTTP_MAX_BYTES >> 20} MiB)")
    return value


class Upstream:
    """The connection to the sandbox's service: reads bounded by one deadline for the whole call.

    Every ``recv`` waits at most until the deadline (a service that sends a byte at a time cannot
    stretch the call); a missed deadline is a 504, a malformed answer a 502 naming it.
    """

    __slots__ = ("buffer", "deadline", "eof", "request", "sock")

    def __init__(self, request: HttpRequest, sock: socket.socket, deadline: float) -> None:
        self.request, self.sock, self.deadline = request, sock, deadline
        self.buffer = bytearray()
        self.eof = False

    def timed_out(self) -> ApiError:
        return ApiError(504, f"the service on {self.request.where} did not answer in {self.request.timeout:g} s")

    def bad(self, what: str) -> ApiError:
        return ApiError(502, f"the service on {self.request.where} in the sandbox {what}")

    def recv(self, size: int = HTTP_RECV) -> bytes:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise self.timed_out()
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(size)
        except TimeoutError:
            raise self.timed_out() from None
        except OSError as exc:  # reset by the service
            raise self.bad(f"broke the connection: {exc.strerror or exc}") from None
        self.eof = not chunk
        return chunk

    def line(self, limit: int) -> bytes:
        """One line (with its end), at most ``limit`` bytes; what is left at EOF; 502 past the limit."""
        start = 0
        while (end := self.buffer.find(b"\n", start)) < 0:
            if len(self.buffer) > limit:
                raise self.bad(f"answered a head line over {limit} bytes")
            start = len(self.buffer)
            chunk = self.recv()
            if not chunk:
                end = len(self.buffer) - 1
                break
            self.buffer += chunk
        if end + 1 > limit:
            raise self.bad(f"answered a head line over {limit} bytes")
        line = bytes(self.buffer[: end + 1])
        del self.buffer[: end + 1]
        return line

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes (fewer only at EOF)."""
        out = bytearray(self.buffer[:size])
        del self.buffer[:size]
        while len(out) < size and (chunk := self.recv(min(size - len(out), HTTP_RECV))):
            out += chunk
        return bytes(out)

    def exactly(self, size: int, what: str) -> bytes:
        data = self.read(size)
        if len(data) < size:
            raise self.bad(f"hung up in the middle of {what} ({len(data)} of {size} bytes)")
        return data


def call_service(request: HttpRequest) -> dict[str, object]:
    """Send ``request`` to ``127.0.0.1:port`` (never another address) and read its answer, bounded."""
    started = time.monotonic()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    upstream = Upstream(request, sock, started + request.timeout)
    try:
        sock.settimeout(request.timeout)
        try:
            sock.connect(("127.0.0.1", request.port))
        except ConnectionRefusedError:
            raise ApiError(502, f"nothing listens on {request.where} in the sandbox") from None
        except TimeoutError:
            raise upstream.timed_out() from None
        except OSError as exc:
            raise ApiError(502, f"cannot connect to {request.where} in the sandbox: {exc.strerror or exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.settimeout(max(upstream.deadline - time.monotonic(), 0.001))
            sock.sendall(request.message())
        except TimeoutError:
            raise upstream.timed_out() from None
        except OSError:
            pass  # it may have answered without reading the body (a 413, say): read what it said
        status, headers = read_head(upstream)
        body, truncated = read_body(upstream, status, headers)
    finally:
        sock.close()
    return {
        "status": status,
        "headers": [[name, value] for name, value in headers],
        "body": base64.b64encode(body).decode(),
        "truncated": truncated,
        "duration": round(time.monotonic() - started, 6),
    }


def read_head(upstream: Upstream) -> tuple[int, list[tuple[str, str]]]:
    """The status and headers of the service's answer, after any 1xx ones; 502 when not HTTP."""
    for _ in range(HTTP_MAX_INTERIM):
        status, headers = _read_one_head(upstream)
        if not 100 <= status < 200 or status == 101:
            return status, headers
    raise upstream.bad(f"sent over {HTTP_MAX_INTERIM} interim (1xx) answers")


def _read_one_head(upstream: Upstream) -> tuple[int, list[tuple[str, str]]]:
    budget = HTTP_MAX_HEAD_BYTES
    line = upstream.line(budget)
    if not line:
        raise upstream.bad("closed the connection without answering")
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise upstream.bad(f"answered something that is not HTTP/1.x: {line[:80]!r}")
    status = int(parts[1])
    if status < 100:
        raise upstream.bad(f"answered status {status}, not an HTTP status")
    budget -= len(line)
    headers: list[tuple[str, str]] = []
    while True:
        line = upstream.line(budget)
        budget -= len(line)
        if line in (b"\r\n", b"\n"):
            return status, headers
        if not line.endswith(b"\n"):
            raise upstream.bad("hung up in the middle of its headers")
        text = line.decode("latin-1").rstrip("\r\n")
        if text[:1] in (" ", "\t") and headers:  # an obsolete folded line continues the last header
            headers[-1] = (headers[-1][0], f"{headers[-1][1]} {text.strip()}")
            continue
        name, colon, value = text.partition(":")
        if not colon or not is_token(name) or "\0" in value or "\r" in value:
            raise upstream.bad(f"answered a malformed header line: {line[:80]!r}")
        if len(headers) >= HTTP_MAX_ANSWER_HEADERS:
            raise upstream.bad(f"answered over {HTTP_MAX_ANSWER_HEADERS} header lines")
        headers.append((name, value.strip()))


def read_body(upstream: Upstream, status: int, headers: list[tuple[str, str]]) -> tuple[bytes, bool]:
    """At most ``max_bytes`` of the body, framed as RFC 9112 says, and whether there was more."""
    limit = upstream.request.max_bytes
    if upstream.request.method == "HEAD" or status < 200 or status in (204, 304):
        return b"", False
    named = {name.lower(): value for name, value in headers}
    if "transfer-encoding" in named:
        if named["transfer-encoding"].lower().replace(" ", "").endswith("chunked"):
            return read_chunked(upstream, limit)
    elif "content-length" in named:
        lengths = {value.strip() for name, value in headers if name.lower() == "content-length"}
        length = lengths.pop() if len(lengths) == 1 else ""
        if not length.isdigit():
            raise upstream.bad(f"answered an invalid Content-Length: {named['content-length'][:40]!r}")
        size = int(length)
        return upstream.exactly(min(size, limit), "its body"), size > limit
    body = upstream.read(limit + 1)  # no framing: the body ends when the service hangs up
    return body[:limit], len(body) > limit


def read_chunked(upstream: Upstream, limit: int) -> tuple[bytes, bool]:
    body = bytearray()
    while True:
        line = upstream.line(1024)
        size_text = line.split(b";", 1)[0].strip()
        if not line.endswith(b"\n") or not size_text or len(size_text) > 16:
            raise upstream.bad(f"sent a malformed chunk size line: {line[:40]!r}")
        try:
            size = int(size_text, 16)
        except ValueError:
            raise upstream.bad(f"sent a malformed chunk size line: {line[:40]!r}") from None
        if size == 0:
            break
        room = limit - len(body)
        if size > room:
            body += upstream.exactly(room, "a chunk")
            return bytes(body), True
        body += upstream.exactly(size, "a chunk")
        if upstream.line(2) not in (b"\r\n", b"\n"):
            raise upstream.bad("sent a chunk without its line end")
    budget = HTTP_MAX_HEAD_BYTES
    while (trailer := upstream.line(budget)) not in (b"\r\n", b"\n", b""):  # trailers are dropped
        budget -= len(trailer)
    return bytes(body), False
