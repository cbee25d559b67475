"""The Claw services as one real HTTP server, inside a task's sandbox, on its loopback only.

    python3 server.py SETUP.json PORT READY_FILE

Serves `orchard/claw/world.py`'s routes for the world `SETUP.json` describes, on 127.0.0.1:PORT
(never another address: the host reaches it through the exec agent), and writes READY_FILE once
it listens. Besides the services' routes, Orchard's own under `/_orchard/`: `GET log` (every call
since the last reset, and what the agent said to the user), `POST say` (`{"text": ...}`: a
message of the agent to the user, kept in order), `POST reset` (the world as the setup made it),
`GET health`.

Standard library only, for the sandbox's own Python (3.9 or newer); it sits beside `world.py`.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from world import World

MAX_BODY = 1 << 20


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self, status: int, data: object) -> None:
        payload = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _body(self) -> object:
        size = int(self.headers.get("Content-Length") or 0)
        if size > MAX_BODY:
            raise ValueError(f"a request body holds at most {MAX_BODY} bytes")
        raw = self.rfile.read(size) if size else b""
        return json.loads(raw) if raw.strip() else {}

    def do_GET(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        server = self.server
        with server.lock:
            if path == "/_orchard/health":
                return self._answer(200, {"status": "ok"})
            if path == "/_orchard/log":
                return self._answer(200, {"calls": server.world.log, "said": server.said})
            name, _, what = path.strip("/").partition("/")
            if name in server.world.services and what in ("state", "audit"):
                service = server.world.services[name]
                return self._answer(200, service.state() if what == "state" else server.world.audit(name))
        self._answer(404, {"error": f"no route GET {path}"})

    def do_POST(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        server = self.server
        try:
            body = self._body()
        except ValueError as exc:
            self.close_connection = True
            return self._answer(400, {"error": f"the body is not JSON: {exc}"})
        with server.lock:
            if path == "/_orchard/reset":
                server.reset()
                return self._answer(200, {"status": "reset"})
            if path == "/_orchard/say":
                server.said.append(str(body.get("text", "")) if isinstance(body, dict) else "")
                return self._answer(200, {"status": "ok"})
            name, _, verb = path.strip("/").partition("/")
            if verb == "reset" and name in server.world.services:
                server.reset_service(name)
                return self._answer(200, {"status": "reset"})
            status, answer, delay = server.world.call(path, body)
        if delay:
            time.sleep(delay)
        self._answer(status, answer)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, setup: dict, port: int) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.setup, self.lock = setup, threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.world = World(self.setup)
        self.said: list[str] = []

    def reset_service(self, name: str) -> None:
        fresh = World({**self.setup, "services": {name: self.setup["services"][name]}})
        fresh.services[name].world = self.world
        self.world.services[name] = fresh.services[name]
        self.world.routes.update({e: (fresh.services[name], fn) for e, (_, fn) in fresh.routes.items()})


def main() -> None:
    setup_file, port, ready = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    with open(setup_file, encoding="utf-8") as f:
        server = Server(json.load(f), port)
    with open(ready, "w") as f:
        f.write(str(port))
    server.serve_forever()


if __name__ == "__main__":
    main()
