"""The Claw services as one real HTTP server, inside a task's sandbox, on its loopback only.

    PYTHON -S server.py SETUP.json PORT READY_FILE

Serves `orchard/recipes/claw/world.py`'s routes for the world `SETUP.json` describes, on 127.0.0.1:PORT
(never another address: the host reaches it through the exec agent), and writes READY_FILE once
it listens. Besides the services' routes, Orchard's own under `/_orchard/`: `GET log` (every call
the services were asked, endpoint and arguments, in order: what the host replays to grade) and
`GET health`. Nothing resets the log: a service's own reset (`POST /<service>/reset`) is a call
like the others, logged and replayed.

Standard library only. In the sandbox PYTHON is the bundle's interpreter
(`orchard.env.bundle.sandbox_python`), so the image needs no Python of its own; this file lies
beside `world.py` and its HTTP layer, `orchard/env/sandboxed/httpd.py`.
"""

from __future__ import annotations

import json
import socketserver
import sys
import threading
import time

from world import World

try:
    from orchard.env.sandboxed import httpd
except ImportError:  # in the sandbox, where the module lies beside this file
    import httpd  # type: ignore[no-redef]

MAX_BODY = 1 << 20
JSON = "application/json"


class Handler(httpd.Handler):
    """The services' connections (`orchard.env.sandboxed.httpd`): JSON bodies of at most `MAX_BODY`
    bytes, answered in JSON, a refusal too (`{"error": ...}`)."""

    server: Server
    max_body = MAX_BODY

    def respond(self, method: str, target: str, headers: dict, body: bytes) -> tuple:
        path = target.split("?")[0].rstrip("/")
        if method == "GET":
            return _json(*self.server.get(path))
        if method != "POST":
            return _json(404, {"error": f"no route {method} {path}"})
        try:
            data = json.loads(body) if body.strip() else {}
        except ValueError as exc:
            return _json(400, {"error": f"the body is not JSON: {exc}"})
        status, answer, delay = self.server.post(path, data)
        if delay:
            time.sleep(delay)
        return _json(status, answer)

    def refusal(self, status: int, message: str) -> tuple:
        return JSON, json.dumps({"error": message})


def _json(status: int, answer: object) -> tuple:
    return status, JSON, json.dumps(answer), ""


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
