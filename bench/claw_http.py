"""A tool call to a mock service inside a sandbox (`Sandbox.http`) against a bare HTTP call (not a test).

    .venv/bin/python bench/claw_http.py [--runs 200] [--image orchard/base:bookworm] [--json out.json]

The Claw recipe's mock services (mail, calendar, ...) listen on a sandbox's own loopback, and
every tool call of an agent reaches them through the sandbox's exec agent: the SDK asks the agent
(`POST /http`, keep-alive over its Unix socket), which opens a connection to `127.0.0.1:PORT`,
sends the request, reads the answer and hands it back in JSON, base64 body. This measures that
path against the floor: the same stdlib server (`http.server`, threaded, HTTP/1.1) on this host's
loopback, asked with a bare `http.client`.

The request is what a tool call sends: `POST /tool` with a small JSON body, a small JSON answer.
Paths, each `--runs` calls after 20 warm-up ones:

* bare `http.client`, a new connection per call (what the agent itself does: the floor);
* bare `http.client` on one keep-alive connection (shown because it is *not* a floor: `http.server`
  writes its head and body in two sends, and Nagle's algorithm holds the second until the
  client's delayed ACK, about 40 ms on Linux; the agent's one connection per call never waits);
* `box.http(...)` straight to the sandbox's agent (embedded client), network `blocked`.

It prints p50 / p95 of each and the p50 difference against the goal: at most 5 ms above the floor.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from orchard.config import BASE_IMAGE
from orchard.env import Client
from orchard.store.runs import record_bench

GOAL_MS = 5.0
SANDBOX_PORT = 8080
BODY = json.dumps({"to": "bob@example.com", "subject": "lunch?", "body": "at noon"}).encode()

# The same kind of server on both sides: a threaded stdlib http.server that answers a tool call.
SERVER = r"""
import http.server, json, sys

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        out = json.dumps({"ok": True, "id": 42, "echo": request}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def timings(run: Callable[[], object], runs: int, warmup: int = 20) -> list[float]:
    """Sorted milliseconds of `runs` calls after `warmup` unmeasured ones."""
    for _ in range(warmup):
        run()
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        out.append((time.perf_counter() - started) * 1000)
    return sorted(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_host_server(script: Path) -> tuple[int, subprocess.Popen[bytes]]:
    """The server on this host's loopback, in its own process (as the sandbox's runs in its own)."""
    port = free_port()
    process = subprocess.Popen([sys.executable, str(script), str(port)])
    for _ in range(500):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return port, process
        except OSError:
            time.sleep(0.01)
    process.kill()
    raise SystemExit("the host's server did not start")


def bare_call(port: int, keep_alive: http.client.HTTPConnection | None = None) -> Callable[[], bytes]:
    """A bare `http.client` POST: on `keep_alive`, else on a new connection each time."""

    def call() -> bytes:
        conn = keep_alive or http.client.HTTPConnection("127.0.0.1", port)
        conn.request("POST", "/tool", body=BODY, headers={"Content-Type": "application/json"})
        answer = conn.getresponse().read()
        if keep_alive is None:
            conn.close()
        return answer

    return call


def start_sandbox_server(box) -> None:
    """The server inside the sandbox, in the background (nohup: it outlives the exec that starts it)."""
    box.write_file("/tmp/tool_server.py", SERVER)
    box.exec(f"nohup python3 /tmp/tool_server.py {SANDBOX_PORT} >/tmp/tool_server.log 2>&1 &")
    for _ in range(500):
        try:
            box.http("/tool", port=SANDBOX_PORT, body=BODY, timeout=2)
            return
        except OSError:  # AgentError: nothing listens yet
            time.sleep(0.01)
    raise SystemExit(box.exec("cat /tmp/tool_server.log").output)


def measure(args: argparse.Namespace, script: Path) -> dict[str, list[float]]:
    port, host_server = start_host_server(script)
    try:
        with Client() as client, client.create(args.image, network="blocked") as box:
            start_sandbox_server(box)
            keep_alive = http.client.HTTPConnection("127.0.0.1", port)
            headers = {"Content-Type": "application/json"}
            paths: dict[str, Callable[[], object]] = {
                "bare http.client, new connection": bare_call(port),
                "bare http.client, keep-alive": bare_call(port, keep_alive),
                "box.http, direct to the agent": lambda: box.http(
                    "/tool", port=SANDBOX_PORT, body=BODY, headers=headers
                ),
            }
            results = {}
            for name, run in paths.items():
                print(f"measuring {name} ...", flush=True)
                results[name] = timings(run, args.runs)
            keep_alive.close()
            return results
    finally:
        host_server.terminate()
        host_server.wait(10)


def report(results: dict[str, list[float]]) -> bool:
    """The table and the goal line; whether the goal was met."""
    print(f"\n  {'path':<36} {'p50 ms':>8} {'p95 ms':>8}")
    for path, values in results.items():
        print(f"  {path:<36} {statistics.median(values):>8.2f} {values[int(len(values) * 0.95) - 1]:>8.2f}")
    floor = statistics.median(results["bare http.client, new connection"])
    direct = statistics.median(results["box.http, direct to the agent"])
    ok = direct - floor <= GOAL_MS
    print(
        f"  goal: box.http p50 at most {GOAL_MS:g} ms above the floor: {direct - floor:+.2f} ms  {'ok' if ok else 'MISSED'}"
    )
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200, help="measured calls per path")
    parser.add_argument("--image", default=BASE_IMAGE)
    parser.add_argument("--json", type=Path, help="also write the raw timings here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orchard-bench-") as folder:
        script = Path(folder) / "tool_server.py"
        script.write_text(SERVER)
        results = measure(args, script)
    if args.json:
        args.json.write_text(json.dumps(results))
    ok = report(results)
    p50 = {path: statistics.median(values) for path, values in results.items()}
    run_id = record_bench("claw-http", vars(args) | {"json": str(args.json)}, {"p50_ms": p50, "goal_met": ok})
    print(f"recorded as run {run_id}")


if __name__ == "__main__":
    main()
