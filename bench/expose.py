"""A request from inside a sandbox to a server of this host through `Sandbox.expose`, against the
same request on this host's loopback (not a test).

    .venv/bin/python bench/expose.py [--runs 200] [--image orchard/base:bookworm] [--json out.json]

An agent CLI in a `blocked` sandbox calls a model server of the host (`orchard proxy`) through a
port of its own loopback that `expose` carries: the client connects to `127.0.0.1:PORT` in the
sandbox, the agent hands the connection to one of the host's waiting `POST /accept` calls (an
upgraded connection over its Unix socket), and the host connects to the server and splices the
bytes both ways. This measures that path against the floor: the same client on this host,
straight to the server on its loopback.

The server is a threaded stdlib `http.server` (HTTP/1.1) on this host answering `POST /v1/chat`
with a small JSON body, as a model server's non-streamed answer. The client is `http.client`
with a new connection per request (keep-alive off: every request pays for a connection, and on
the exposed path for a tunnel), `--runs` requests after 20 warm-up ones, timed where it runs
(inside the sandbox for the exposed path, so a command's own overhead is not counted).
It prints p50 / p95 of both and the p50 the tunnel adds.
"""

from __future__ import annotations

import argparse
import http.server
import json
import statistics
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from orchard.config import BASE_IMAGE
from orchard.env import Client
from orchard.store.runs import record_bench

SANDBOX_PORT = 9000

CLIENT = r"""
import http.client, json, sys, time

port, runs, warmup = int(sys.argv[1]), int(sys.argv[2]), 20
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
out = []
for i in range(warmup + runs):
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/chat", body=body, headers={"Content-Type": "application/json", "Connection": "close"})
    answer = conn.getresponse().read()
    conn.close()
    if i >= warmup:
        out.append((time.perf_counter() - started) * 1000)
    assert json.loads(answer)["choices"], answer
print(json.dumps(out))
"""


class Handler(http.server.BaseHTTPRequestHandler):
    """A model server's small, non-streamed answer."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        out = json.dumps({"choices": [{"message": {"role": "assistant", "content": "hello"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:
        pass


def on_host(script: Path, port: int, runs: int) -> list[float]:
    """The client on this host, straight to the server (the floor)."""
    done = subprocess.run([sys.executable, str(script), str(port), str(runs)], capture_output=True, check=True)
    return sorted(json.loads(done.stdout))


def through_expose(image: str, port: int, runs: int) -> list[float]:
    """The client in a `blocked` sandbox, through `expose`."""
    with Client() as client, client.create(image, network="blocked") as box:
        box.write_file("/tmp/client.py", CLIENT)
        with box.expose(SANDBOX_PORT, ("127.0.0.1", port)):
            done = box.exec(f"python3 /tmp/client.py {SANDBOX_PORT} {runs}", timeout=600)
        if not done.ok:
            raise SystemExit(f"the client in the sandbox failed: {done.stderr[-2000:]}")
        return sorted(json.loads(done.stdout))


def report(results: dict[str, list[float]]) -> float:
    """The table and the p50 the tunnel adds."""
    print(f"\n  {'path':<40} {'p50 ms':>8} {'p95 ms':>8}")
    for path, values in results.items():
        print(f"  {path:<40} {statistics.median(values):>8.2f} {values[int(len(values) * 0.95) - 1]:>8.2f}")
    floor, exposed = (statistics.median(values) for values in results.values())
    print(f"  added by expose (p50): {exposed - floor:+.2f} ms")
    return exposed - floor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200, help="measured requests per path")
    parser.add_argument("--image", default=BASE_IMAGE)
    parser.add_argument("--json", type=Path, help="also write the raw timings here")
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        with tempfile.TemporaryDirectory(prefix="orchard-bench-") as folder:
            script = Path(folder) / "client.py"
            script.write_text(CLIENT)
            print("measuring the host's loopback ...", flush=True)
            results = {"host loopback, new connection": on_host(script, port, args.runs)}
        print("measuring the sandbox, through expose ...", flush=True)
        results["sandbox through expose, new connection"] = through_expose(args.image, port, args.runs)
    finally:
        server.shutdown()
    if args.json:
        args.json.write_text(json.dumps(results))
    added = report(results)
    p50 = {path: statistics.median(values) for path, values in results.items()}
    run_id = record_bench("expose", vars(args) | {"json": str(args.json)}, {"p50_ms": p50, "added_ms": added})
    print(f"recorded as run {run_id}")


if __name__ == "__main__":
    main()
