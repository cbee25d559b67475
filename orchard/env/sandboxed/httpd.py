"""The small HTTP/1.1 server of Orchard's services inside sandboxes: the Claw services
(`orchard/recipes/claw/server.py`) and the GUI sites (`orchard/recipes/gui/site.py`).

HTTP/1.1 with keep-alive and bodies with a Content-Length only: what their clients send (the exec
agent, Chromium, `urllib`, `httpx`, `curl`). Not `http.server`, whose imports take longer than the
rest of a start. A server subclasses `Handler`, sets its bounds and answers in `respond`; a request
over a bound is refused before it reaches `respond`, and the connection closed:

* a request line over `max_line` bytes: 414; one that is not `METHOD TARGET VERSION`: 400;
* a head over `max_head` bytes or `max_headers` headers: 431;
* a `Transfer-Encoding` (chunked bodies): 411; a Content-Length that is not a number: 400;
* a body over `max_body` bytes: 413 (read first when it is at most 16 times the bound, so that
  the client reads the answer rather than a reset).

Blank lines between requests are skipped; a body shorter than its Content-Length (the client went
away) ends the connection unanswered. Every answer carries `Cache-Control: no-store`.

Standard library only (`orchard.env.sandboxed`): in a sandbox this file lies beside the server
that imports it.
"""

from __future__ import annotations

import socketserver

TEXT = "text/plain; charset=utf-8"
REASONS = {
    200: "OK",
    303: "See Other",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    411: "Length Required",
    413: "Content Too Large",
    414: "URI Too Long",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


class Handler(socketserver.StreamRequestHandler):
    """One connection: its requests in turn, each read within the bounds, answered by `respond`."""

    max_line = 8 * 1024
    """Bytes of a request line, its end included."""
    max_head = 64 * 1024
    """Bytes of a request's head: its request line and headers."""
    max_headers = 100
    max_body = 64 * 1024
    """Bytes of a request's body."""

    def respond(self, method: str, target: str, headers: dict, body: bytes) -> tuple:
        """(status, content type, payload (text or bytes), location or "") of one request; `headers`
        maps a lowercased name to its value."""
        raise NotImplementedError

    def refusal(self, status: int, message: str) -> tuple:
        """(content type, payload) of a request refused before `respond`: `message` as plain text."""
        return TEXT, message

    def handle(self) -> None:
        while self._one():
            pass

    def _one(self) -> bool:
        line = self.rfile.readline(self.max_line + 1)
        if not line:
            return False
        if not line.endswith(b"\n"):
            return self._refuse(414, f"a request line holds at most {self.max_line} bytes")
        if not line.strip():
            return True  # a blank line between requests: allowed, and skipped
        try:
            method, target, version = line.decode("latin-1").split()
        except ValueError:
            return self._refuse(400, "not an HTTP request line")
        headers: dict = {}
        size = len(line)
        while True:
            header = self.rfile.readline(self.max_head + 1)
            size += len(header)
            if size > self.max_head or len(headers) > self.max_headers:
                limits = f"{self.max_head} bytes and {self.max_headers} headers"
                return self._refuse(431, f"a request's head holds at most {limits}")
            if header in (b"\r\n", b"\n", b""):
                break
            name, _, value = header.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding"):
            return self._refuse(411, "send the body with a Content-Length")
        declared = headers.get("content-length") or "0"
        if not declared.isdigit() or len(declared) > 12:
            return self._refuse(400, "the Content-Length is not a number")
        length = int(declared)
        if length > self.max_body:
            if length <= 16 * self.max_body:  # read it, so that the client reads the answer rather than a reset
                self.rfile.read(length)
            return self._refuse(413, f"a request body holds at most {self.max_body} bytes")
        body = self.rfile.read(length) if length else b""
        if len(body) < length:
            return False
        close = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
        status, content_type, payload, location = self.respond(method, target, headers, body)
        return self.send(status, payload, close=close, content_type=content_type, location=location)

    def _refuse(self, status: int, message: str) -> bool:
        content_type, payload = self.refusal(status, message)
        return self.send(status, payload, close=True, content_type=content_type)

    def send(
        self, status: int, payload: str | bytes, *, close: bool, content_type: str = TEXT, location: str = ""
    ) -> bool:
        """Write one answer; whether the connection stays open (not `close`)."""
        data = payload.encode("utf-8") if isinstance(payload, str) else payload
        redirect = f"Location: {location}\r\n" if location else ""
        head = (
            f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(data)}\r\nCache-Control: no-store\r\n{redirect}"
            f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
        )
        self.wfile.write(head.encode("latin-1") + data)
        return not close
