"""The Claw services as one real HTTP server, inside a task's sandbox, on its loopback only.

    python3 server.py SETUP.json PORT READY_FILE

Serves `orchard/recipes/claw/world.py`'s routes for the world `SETUP.json` describes, on 127.0.0.1:PORT
(never another address: the host reaches it through the exec agent), and writes READY_FILE once
it listens. Besides the services' routes, Orchard's own under `/_orchard/`: `GET log` (every call
the services were asked, endpoint and arguments, in order: what the host replays to grade) and
`GET health`. Nothing resets the log: a service's own reset (`POST /<service>/reset`) is a call
like the others, logged and replayed.

Standard library only, for the sandbox's own Python (3.9 or newer); it sits beside `world.py`.
"""

from __future__ import annotations

import json
import socketserver
import sys
import threading
import time

from world import World

MAX_BODY = 1 << 20
MAX_HEAD = 64 * 1024
REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    411: "Length Required",
    413: "Content Too Large",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
}


class Handler(socketserver.StreamRequestHandler):
    """HTTP/1.1 with keep-alive, Content-Length bodies only: all its clients send (the exec agent,
    `urllib`, `curl`). Not `http.server`, whose imports take longer than the rest of a start."""

    server: Server

    def handle(self) -> None:
        while self._one():
            pass

    def _one(self) -> bool:
        line = self.rfile.readline(8192)
        if not line.strip():
            return False
        try:
            method, target, version = line.decode("latin-1").split()
        except ValueError:
            return self._answer(400, {"error": "not an HTTP request line"}, close=True)
        headers: dict[str, str] = {}
        size = len(line)
        while True:
            header = self.rfile.readline(8192)
            size += len(header)
            if size > MAX_HEAD:
                return self._answer(400, {"error": "the request's head is too large"}, close=True)
            if header in (b"\r\n", b"\n", b""):
                break
            name, _, value = header.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return self._answer(411, {"error": "send the body with a Content-Length"}, close=True)
        length = int(headers.get("content-length") or 0) if (headers.get("content-length") or "0").isdigit() else -1
        if not 0 <= length <= MAX_BODY:
            return self._answer(413, {"error": f"a request body holds at most {MAX_BODY} bytes"}, close=True)
        raw = self.rfile.read(length) if length else b""
        close = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
        path = target.split("?")[0].rstrip("/")
        if method == "GET":
            status, answer = self.server.get(path)
            return self._answer(status, answer, close)
        if method != "POST":
            return self._answer(404, {"error": f"no route {method} {path}"}, close)
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            return self._answer(400, {"error": f"the body is not JSON: {exc}"}, close=True)
        status, answer, delay = self.server.post(path, body)
        if delay:
            time.sleep(delay)
        return self._answer(status, answer, close)

    def _answer(self, status: int, data: object, close: bool) -> bool:
        payload = json.dumps(data).encode()
        head = (
            f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n{'Connection: close' if close else 'Connection: keep-alive'}\r\n\r\n"
        )
        self.wfile.write(head.encode("latin-1") + payload)
        return not close


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, setup: dict, port: int) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.setup, self.lock = setup, threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.world = World(self.setup)

    def get(self, path: str) -> tuple[int, object]:
        with self.lock:
            if path == "/_orchard/health":
                return 200, {"status": "ok"}
            if path == "/_orchard/log":  # what the host replays: the calls, not their answers
                calls = [{"endpoint": c["endpoint"], "request_body": c["request_body"]} for c in self.world.log]
                return 200, {"calls": calls}
            name, _, what = path.strip("/").partition("/")
            if name in self.world.services and what in ("state", "audit"):
                return 200, self.world.services[name].state() if what == "state" else self.world.audit(name)
        return 404, {"error": f"no route GET {path}"}

    def post(self, path: str, body: object) -> tuple[int, object, float]:
        with self.lock:
            return self.world.call(path, body)


def main() -> None:
    setup_file, port, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with open(setup_file, encoding="utf-8") as f:
        server = Server(json.load(f), port)
    with open(ready, "w") as f:
        f.write(str(port))
    server.serve_forever()


if __name__ == "__main__":
    main()
