"""The memory `orchard proxy` holds under hostile bodies (not a test).

    .venv/bin/python bench/proxy_memory.py [--request-gib 1] [--answer-gib 2]

`orchard proxy` with its default bounds (32 MiB) runs in front of an upstream that answers every
call with `--answer-gib` GiB: whole (with its Content-Length), or streamed as server-sent events.
The script reads the resident memory of the proxy and of its recording process at idle, then, for
each of these, their peak (VmHWM, reset before each one) above idle, against the goal of at most
100 MiB:

* a request body of `--request-gib` GiB, chunked, with the key (413 once it passes the bound);
* the same without the key (401 before a byte of it is read);
* a whole answer of `--answer-gib` GiB, then a streamed one (dropped once past the bound).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
from proxy import KEY, free_port, started

GOAL_MIB = 100
MiB = 2**20

UPSTREAM = r"""
import http.server, sys

TOTAL = int(sys.argv[1])
PIECE = b"x" * (1 << 20)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        asked = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        try:
            if b'"stream": true' in asked or b'"stream":true' in asked:
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                event = b'data: {"choices": [{"index": 0, "delta": {"content": "' + PIECE + b'"}}]}\n\n'
                for _ in range(TOTAL // len(event)):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            else:
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(TOTAL))
                self.end_headers()
                for _ in range(TOTAL // len(PIECE)):
                    self.wfile.write(PIECE)
        except (BrokenPipeError, ConnectionResetError):  # the proxy dropped it, as it should
            self.close_connection = True

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_port, flush=True)
server.serve_forever()
"""


def processes(pid: int) -> list[int]:
    """The proxy's process and its children (the recording process)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *map(int, children)]


def resident(pids: list[int], field: str) -> int:
    """The sum of `field` (VmRSS, VmHWM) over `pids`, in bytes."""
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                total += int(line.split()[1]) * 1024
    return total


def reset_peaks(pids: list[int]) -> None:
    for pid in pids:
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM back to VmRSS


def body(gib: float) -> Iterator[bytes]:
    piece = b"A" * MiB
    for _ in range(int(gib * 1024)):
        yield piece


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--request-gib", type=float, default=1.0)
    parser.add_argument("--answer-gib", type=float, default=2.0)
    args = parser.parse_args()
    upstream, port = started([sys.executable, "-c", UPSTREAM, str(int(args.answer_gib * 1024) * MiB)])
    with tempfile.TemporaryDirectory(prefix="orchard-bench-proxy-memory-") as home:
        env = {**os.environ, "ORCHARD_HOME": home, "BENCH_PROXY_KEY": KEY}
        env.pop("ORCHARD_DB_URL", None)
        proxy_port = free_port()
        command = [sys.executable, "-m", "orchard", "proxy", "--upstream", f"http://127.0.0.1:{port}/v1"]
        proxy, line = started([*command, "--port", str(proxy_port), "--key-env", "BENCH_PROXY_KEY"], env)
        try:
            if not line.startswith("orchard proxy on "):
                raise SystemExit(f"the proxy did not start: {line!r}")
            url, keyed = f"http://127.0.0.1:{proxy_port}", {"authorization": f"Bearer {KEY}"}
            chat = {"model": "bench", "messages": [{"role": "user", "content": "hi"}]}
            with httpx.Client(timeout=600) as http:
                http.get(url + "/v1/models")  # 401: the proxy is up and warm
                pids = processes(proxy.pid)
                idle = resident(pids, "VmRSS")
                print(f"idle: {idle / MiB:.0f} MiB resident (the proxy and its recording process)")
                cases = [
                    (
                        f"request of {args.request_gib:g} GiB, keyed",
                        "/v1/chat/completions",
                        body(args.request_gib),
                        keyed,
                    ),
                    (
                        f"request of {args.request_gib:g} GiB, no key",
                        "/v1/chat/completions",
                        body(args.request_gib),
                        {},
                    ),
                    (f"whole answer of {args.answer_gib:g} GiB", "/v1/chat/completions", chat, keyed),
                    (
                        f"streamed answer of {args.answer_gib:g} GiB",
                        "/v1/chat/completions",
                        chat | {"stream": True},
                        keyed,
                    ),
                ]
                worst = 0.0
                for label, path, sent, headers in cases:
                    reset_peaks(pids)
                    try:
                        kwargs = {"json": sent} if isinstance(sent, dict) else {"content": sent}
                        status = http.post(url + path, headers=headers, **kwargs).status_code
                    except httpx.HTTPError as exc:  # the proxy closed the connection mid-body
                        status = type(exc).__name__
                    above = (resident(pids, "VmHWM") - idle) / MiB
                    worst = max(worst, above)
                    print(f"{label:32} answered {status}; peak {above:6.1f} MiB above idle")
        finally:
            proxy.send_signal(signal.SIGINT)
            proxy.wait(timeout=60)
            upstream.kill()
            upstream.wait()
    met = worst <= GOAL_MIB
    print(f"worst peak {worst:.1f} MiB above idle (goal at most {GOAL_MIB} MiB: {'met' if met else 'missed'})")


if __name__ == "__main__":
    main()
