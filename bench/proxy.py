"""The latency `orchard proxy` adds to a model call (not a test).

    .venv/bin/python bench/proxy.py [--runs 300] [--chunks 20] [--json out.json]

An OpenAI-compatible upstream that answers at once (the standard library's HTTP server, HTTP/1.1
keep-alive, TCP_NODELAY so that Nagle's algorithm holds back nothing) runs in a process of its
own, and so does `orchard proxy` in front of it (`python -m orchard proxy`, recording into a
throw-away ORCHARD_HOME). One httpx client with keep-alive then asks, `--runs` times each after
30 warm-up calls, the two paths in turn:

* `POST /v1/chat/completions`, whole: straight to the upstream, then through the proxy;
* the same with `"stream": true`: `--chunks` server-sent events, timed to the last byte;
* Anthropic's `POST /v1/messages` and OpenAI's `POST /v1/responses` through the proxy (translated to
  the chat call and back, whole and streamed), each beside the direct chat call it becomes.

It prints p50 / p95 of each path and the p50 difference, against the goal: at most 2 ms added,
and checks the proxy recorded every call it forwarded (its queue is written when it stops).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from orchard.store.runs import record_bench

GOAL_MS = 2.0
WARMUP = 30

UPSTREAM = r"""
import http.server, json, socket, sys

CHUNKS = int(sys.argv[1])
ANSWER = json.dumps({
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "bench",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok " * CHUNKS}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": CHUNKS, "total_tokens": 12 + CHUNKS},
}).encode()


def event(payload):
    data = b"data: " + payload + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


CHUNK = event(json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000,
                          "model": "bench", "choices": [{"index": 0, "delta": {"content": "ok "}}]}).encode())
END = event(b"[DONE]") + b"0\r\n\r\n"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(ANSWER)))
            self.end_headers()
            self.wfile.write(ANSWER)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for _ in range(CHUNKS):
            self.wfile.write(CHUNK)
        self.wfile.write(END)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_port, flush=True)
server.serve_forever()
"""

BODY = {"model": "bench", "messages": [{"role": "user", "content": "Say ok."}]}
APIS = {
    "chat": ("/chat/completions", BODY),
    "messages": (
        "/messages",
        {"model": "bench", "max_tokens": 64, "messages": [{"role": "user", "content": "Say ok."}]},
    ),
    "responses": ("/responses", {"model": "bench", "input": "Say ok."}),
}
"""Each API the proxy speaks: its path and a request; the direct baseline is always the chat call."""


KEY = "sk-bench"
"""The key the proxy answers (checked on every call, as in use)."""


def call(client: httpx.Client, url: str, body: dict, path: str = "/chat/completions") -> float:
    """Milliseconds of one call, to the answer's last byte."""
    began = time.perf_counter()
    with client.stream("POST", url + path, json=body) as answer:
        for _ in answer.iter_raw():
            pass
    answer.raise_for_status()
    return (time.perf_counter() - began) * 1000


def timed(
    client: httpx.Client, direct: str, through: str, stream: bool, runs: int, api: str = "chat"
) -> tuple[list[float], list[float]]:
    """Milliseconds per call of each path (the chat call direct, `api`'s call through the proxy),
    the two asked in turn (so that load from elsewhere falls on both alike)."""
    path, request = APIS[api]
    body = {**BODY, "stream": True} if stream else BODY
    sent = {**request, "stream": True} if stream else request
    straight, proxied = [], []
    for index in range(WARMUP + runs):
        pair = call(client, direct, body), call(client, through, sent, path)
        if index >= WARMUP:
            straight.append(pair[0])
            proxied.append(pair[1])
    return straight, proxied


def started(command: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """The process and the first line it printed (its port, or the proxy's URL); its errors too."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert process.stdout is not None and process.stderr is not None
    line = process.stdout.readline().strip()
    return process, line or process.stderr.read().strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(args: argparse.Namespace, home: Path) -> tuple[dict[str, list[float]], int]:
    """The timings of each path, and how many calls the proxy recorded."""
    upstream, port = started([sys.executable, "-c", UPSTREAM, str(args.chunks)])
    env = {**os.environ, "ORCHARD_HOME": str(home), "BENCH_PROXY_KEY": KEY}
    env.pop("ORCHARD_DB_URL", None)
    proxy_port = str(free_port())
    proxy_command = [sys.executable, "-m", "orchard", "proxy", "--upstream", f"http://127.0.0.1:{port}/v1"]
    proxy, line = started([*proxy_command, "--port", proxy_port, "--run", "bench", "--key-env", "BENCH_PROXY_KEY"], env)
    results: dict[str, list[float]] = {}
    try:
        if not line.startswith("orchard proxy on "):
            raise SystemExit(f"the proxy did not start: {line!r}")
        direct, through = f"http://127.0.0.1:{port}/v1", f"http://127.0.0.1:{proxy_port}/v1"
        with httpx.Client(timeout=30, headers={"authorization": f"Bearer {KEY}"}) as client:  # the upstream ignores it
            for api in APIS:
                for stream in (False, True):
                    kind = ("stream" if stream else "whole") + ("" if api == "chat" else f", {api}")
                    timings = timed(client, direct, through, stream, args.runs, api)
                    results[f"{kind}, direct"], results[f"{kind}, through the proxy"] = timings
    finally:
        proxy.send_signal(signal.SIGINT)
        proxy.wait(timeout=60)
        upstream.kill()
        upstream.wait()
    with sqlite3.connect(home / "orchard.db") as db:
        (recorded,) = db.execute("SELECT count(*) FROM proxy_calls").fetchone()
    return results, recorded


def report(results: dict[str, list[float]], recorded: int, runs: int) -> bool:
    width = max(len(path) for path in results)
    print(f"{'path':<{width}}  p50 ms  p95 ms")
    for path, values in results.items():
        p95 = statistics.quantiles(values, n=20)[-1]
        print(f"{path:<{width}}  {statistics.median(values):6.2f}  {p95:6.2f}")
    ok = True
    for kind in [path.removesuffix(", direct") for path in results if path.endswith(", direct")]:
        added = statistics.median(results[f"{kind}, through the proxy"]) - statistics.median(results[f"{kind}, direct"])
        met = added <= GOAL_MS
        ok &= met
        print(
            f"{kind}: the proxy adds {added:.2f} ms at p50 (goal at most {GOAL_MS:g} ms: {'met' if met else 'missed'})"
        )
    expected = 2 * len(APIS) * (WARMUP + runs)
    print(f"recorded {recorded} of the {expected} calls it forwarded")
    return ok and recorded == expected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300, help="measured calls per path")
    parser.add_argument("--chunks", type=int, default=20, help="server-sent events in a streamed answer")
    parser.add_argument("--json", type=Path, help="also write the raw timings here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orchard-bench-proxy-") as folder:
        results, recorded = measure(args, Path(folder))
    if args.json:
        args.json.write_text(json.dumps(results))
    ok = report(results, recorded, args.runs)
    p50 = {path: statistics.median(values) for path, values in results.items()}
    summary = {"p50_ms": p50, "recorded": recorded, "goal_met": ok}
    run_id = record_bench("proxy", vars(args) | {"json": str(args.json)}, summary)
    print(f"recorded as run {run_id}")


if __name__ == "__main__":
    main()
