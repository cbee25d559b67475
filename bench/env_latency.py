"""Per-command latency in one sandbox, every path side by side in the same run (not a test).

    .venv/bin/python bench/env_latency.py [--runs 300] [--image orchard/base:bookworm] [--json out.json]

For each command (`true`, `echo hi`, `ls /`, 1 MB of output) it measures, in the same container:

* `docker exec` through the CLI (what mini-swe-agent does) and the Docker SDK's `exec_run`;
* Orchard's SDK straight to the injected agent (Unix socket, keep-alive), one shell per command,
  and the same command as an argument list, which the agent execs with no shell;
* Orchard's SDK in a persistent shell session (`exec(..., session=...)`: state kept, no new shell);
* Orchard's SDK through an `orchard up` service on loopback (its own process, as users run it);
* Orchard's SDK straight to the agent of a sandbox under gVisor (`runsc`), if the engine has it;
* the floors: a bare, minimal stdlib HTTP/1.1 keep-alive server in the same container, asked with a
  bare `http.client` over its own Unix socket, running the command as the agent does
  (`bash -c`), running the argument list with no shell, and feeding one persistent bash (the floor
  of session mode).

Then create-to-first-command from a warm pool of 2 (`Client.warm`) and without one.

It prints p50/p95 per path and command, then the targets as ratios measured in this run: direct
p50 at least 25x below `docker exec`, at most 1.5x the floor; a command with no shell at most
0.8 ms p50; a session at most 1.5x the
persistent-bash floor; the service at most 2 ms p50 above direct, and its cap on request heads at
most 0.2 ms p50 above the same service without it (uvicorn's own protocol, `UNCAPPED`).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from orchard.config import BASE_IMAGE, settings
from orchard.env import Client
from orchard.env.backends.docker import RUN_MOUNT, DockerConfig
from orchard.store.runs import record_bench

COMMANDS = {
    "true": "true",
    "echo hi": "echo hi",
    "ls /": "ls /",
    "1 MB output": "head -c 1000000 /dev/zero | tr '\\0' x",
}
LISTS = {
    "true": ["true"],
    "echo hi": ["echo", "hi"],
    "ls /": ["ls", "/"],
    "1 MB output": ["head", "-c", "1000000", "/dev/zero"],
}
"""The same commands as argument lists, with nothing for a shell to do: the agent execs them."""

# The floor: as little as a keep-alive HTTP exec server can be. /exec runs `bash -c CMD` per
# request; /shell feeds one persistent bash and reads up to a marker line.
FLOOR_SERVER = r"""
import http.server, os, socketserver, subprocess, sys

shell = subprocess.Popen(["bash", "--noprofile", "--norc"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
MARK = b"__floor_mark__"

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        command = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/exec":
            out = subprocess.run(["bash", "-c", command], stdout=subprocess.PIPE, stderr=subprocess.PIPE).stdout
        elif self.path == "/argv":
            out = subprocess.run(command.split(b"\0"), stdout=subprocess.PIPE, stderr=subprocess.PIPE).stdout
        else:
            shell.stdin.write(command + b"\necho " + MARK + b"\n")
            shell.stdin.flush()
            out = b""
            while not out.endswith(MARK + b"\n"):
                out += shell.stdout.read1(1 << 20)
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass

class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

Server(sys.argv[1], Handler).serve_forever()
"""


class UnixHTTPConnection(http.client.HTTPConnection):
    """A bare http.client connection over a Unix socket (the floor's client)."""

    def __init__(self, path: str):
        super().__init__("floor")
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


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


def interleaved(runs: dict[str, Callable[[], object]], count: int, warmup: int = 20) -> dict[str, list[float]]:
    """`timings` of several paths taken in turn, call by call, so that a drift of the machine
    weighs on each alike (measured one after the other, two equal paths differ by 0.4 ms here)."""
    for run in runs.values():
        for _ in range(warmup):
            run()
    out: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(count):
        for name, run in runs.items():
            started = time.perf_counter()
            run()
            out[name].append((time.perf_counter() - started) * 1000)
    return {name: sorted(values) for name, values in out.items()}


UNCAPPED = "import orchard.env.service as s; s.UVICORN_OPTIONS['http'] = 'auto'; s.main()"
"""The service as it ran before its request heads were capped (uvicorn's own httptools protocol):
the baseline of the cap's cost."""


def start_service(*, capped: bool = True) -> tuple[str, Callable[[], None]]:
    """`orchard up` in its own process (as users run it), on a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = tempfile.mkdtemp(prefix="orchard-bench-")
    env = {**os.environ, "ORCHARD_HOME": home, "ORCHARD_API_KEY": "bench"}
    start = ["-m", "orchard.env.service"] if capped else ["-c", UNCAPPED]
    argv = [sys.executable, *start, "--port", str(port)]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    while True:
        if process.poll() is not None:
            raise SystemExit("the service did not start")
        try:
            httpx.get(f"{url}/health")
            break
        except httpx.HTTPError:
            time.sleep(0.05)

    def stop() -> None:
        process.terminate()  # it deletes its sandboxes on the way out
        process.wait(timeout=120)
        shutil.rmtree(home, ignore_errors=True)

    return url, stop


def start_floor(box, sandbox_id: str) -> UnixHTTPConnection:
    """Start the floor server in the sandbox, under the image's own Python (the agent's bundle
    carries only the modules the agent imports, and the floor needs http.server)."""
    box.write_file("/tmp/floor.py", FLOOR_SERVER)
    host_socket = settings().run_dir / sandbox_id / "floor.sock"
    host_socket.parent.chmod(0o777)  # sealed once the agent answered; the bench, as the host, opens it
    box.exec(f"nohup python3 -s -S /tmp/floor.py {RUN_MOUNT}/floor.sock >/tmp/floor.log 2>&1 &")
    for _ in range(500):
        if host_socket.exists():
            break
        time.sleep(0.01)
    return UnixHTTPConnection(str(host_socket))


def floor_call(conn: UnixHTTPConnection, route: str, command: str) -> Callable[[], bytes]:
    body = command.encode()

    def call() -> bytes:
        conn.request("POST", route, body=body, headers={"Content-Length": str(len(body))})
        return conn.getresponse().read()

    return call


def measure(args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    import docker

    url, stop_service = start_service()
    uncapped_url, stop_uncapped = start_service(capped=False)
    results: dict[str, dict[str, list[float]]] = {name: {} for name in COMMANDS}
    has_runsc = "runsc" in (docker.from_env().info().get("Runtimes") or {})
    try:
        with (
            Client() as embedded,
            Client(url=url, api_key="bench") as remote,
            Client(url=uncapped_url, api_key="bench") as uncapped,
            Client(backend=DockerConfig(runtime="runsc" if has_runsc else None)) as gvisor,
        ):
            box = embedded.create(args.image)
            via = remote.create(args.image)
            via_uncapped = uncapped.create(args.image)
            gbox = gvisor.create(args.image) if has_runsc else None
            floor = start_floor(box, box.id)
            container = docker.from_env().containers.get(f"orchard-{box.id}")
            for name, command in COMMANDS.items():
                print(f"measuring {name!r} ...", flush=True)
                paths: dict[str, Callable[[], object]] = {
                    "floor: bare server, bash -c": floor_call(floor, "/exec", command),
                    "orchard SDK, direct": lambda c=command: box.exec(c),
                    "floor: bare server, no shell": floor_call(floor, "/argv", "\0".join(LISTS[name])),
                    "orchard SDK, direct, no shell": lambda a=LISTS[name]: box.exec(a),
                    "floor: bare persistent bash": floor_call(floor, "/shell", command),
                    "orchard SDK, shell session": lambda c=command: box.exec(c, session="bench"),
                    "orchard SDK, via orchard up": lambda c=command: via.exec(c),
                    **({"orchard SDK, direct, gVisor": lambda c=command: gbox.exec(c)} if gbox else {}),
                    "docker SDK exec_run": lambda c=command: container.exec_run(["bash", "-c", c]),
                    "docker exec CLI": lambda c=command: subprocess.run(
                        ["docker", "exec", container.name, "bash", "-c", c], stdout=subprocess.DEVNULL, check=True
                    ),
                }
                for path, run in paths.items():
                    results[name][path] = timings(run, args.runs)
                pair = {
                    "via orchard up, in turn with:": lambda c=command: via.exec(c),
                    "  the same, heads uncapped": lambda c=command: via_uncapped.exec(c),
                }
                results[name].update(interleaved(pair, args.runs))
    finally:
        stop_service()
        stop_uncapped()
    return results


def measure_pool(image: str, runs: int) -> dict[str, list[float]]:
    """Create -> first command answered, from a warm pool and cold, p50 over `runs` each."""
    warm, cold = [], []
    with Client() as client:
        client.warm(image, 2)
        pools = client._manager.pools
        for _ in range(runs):
            while [ready for _spec, _size, ready in pools.sizes()] != [2]:  # refilled: not timed
                time.sleep(0.02)
            started = time.perf_counter()
            box = client.create(image)
            box.exec("true")
            warm.append((time.perf_counter() - started) * 1000)
            box.delete()
            started = time.perf_counter()
            box = client.create(image, network="open")  # another kind: no pool
            box.exec("true")
            cold.append((time.perf_counter() - started) * 1000)
            box.delete()
    return {"warm pool: create + first command": sorted(warm), "no pool: create + first command": sorted(cold)}


def report(results: dict[str, dict[str, list[float]]]) -> list[str]:
    """The table and the target lines; returns the failed targets."""
    failed = []
    for name, paths in results.items():
        cli = statistics.median(paths["docker exec CLI"])
        print(f"\n{name}")
        print(f"  {'path':<32} {'p50 ms':>8} {'p95 ms':>8} {'faster than docker exec':>24}")
        for path, values in paths.items():
            p50, p95 = statistics.median(values), values[int(len(values) * 0.95) - 1]
            print(f"  {path:<32} {p50:>8.2f} {p95:>8.2f} {cli / p50:>23.1f}x")
        p50 = {path: statistics.median(values) for path, values in paths.items()}
        direct = p50["orchard SDK, direct"]
        targets = [
            ("direct vs docker exec (>= 25x)", cli / direct, cli / direct >= 25),
            ("direct / floor (<= 1.5x)", direct / p50["floor: bare server, bash -c"], None),
            ("no shell, direct (<= 0.8 ms)", p50["orchard SDK, direct, no shell"], None),
            (
                "no shell / its floor (no target)",
                p50["orchard SDK, direct, no shell"] / p50["floor: bare server, no shell"],
                True,
            ),
            (
                "session / persistent-bash floor (<= 1.5x)",
                p50["orchard SDK, shell session"] / p50["floor: bare persistent bash"],
                None,
            ),
            ("service - direct (<= 2 ms)", p50["orchard SDK, via orchard up"] - direct, None),
            (
                "service: capped heads - uncapped (<= 0.2 ms)",
                p50["via orchard up, in turn with:"] - p50["  the same, heads uncapped"],
                None,
            ),
        ]
        if "orchard SDK, direct, gVisor" in p50:
            print(f"  gVisor / runc, direct{'':<29} {p50['orchard SDK, direct, gVisor'] / direct:>7.2f}x  (no target)")
        for label, value, ok in targets:
            limit = 1.5 if "<= 1.5x" in label else 0.2 if "<= 0.2 ms" in label else 0.8 if "<= 0.8 ms" in label else 2.0
            ok = value <= limit if ok is None else ok
            unit = " ms" if "ms" in label else "x"
            print(f"  target {label:<44} {value:>7.2f}{unit}  {'ok' if ok else 'MISSED'}")
            if not ok:
                failed.append(f"{name}: {label}")
    return failed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300, help="measured commands per path and command")
    parser.add_argument("--image", default=BASE_IMAGE)
    parser.add_argument("--pool-runs", type=int, default=50, help="sandboxes taken from a warm pool")
    parser.add_argument("--json", type=Path, help="also write the raw timings here")
    args = parser.parse_args()
    results = measure(args)
    pool = measure_pool(args.image, args.pool_runs)
    if args.json:
        args.json.write_text(json.dumps({**results, "pool": pool}))
    failed = report(results)
    print("\nsandbox hand-over")
    for path, values in pool.items():
        print(
            f"  {path:<38} p50 {statistics.median(values):8.1f} ms  p95 {values[int(len(values) * 0.95) - 1]:8.1f} ms"
        )
    warm_p50 = statistics.median(pool["warm pool: create + first command"])
    ok = warm_p50 < 20
    print(f"  target warm pool p50 under 20 ms{'':<14} {warm_p50:>7.2f} ms  {'ok' if ok else 'MISSED'}")
    if not ok:
        failed.append("warm pool hand-over")
    print(f"\n{len(failed)} target(s) missed" + (": " + "; ".join(failed) if failed else ""))
    p50 = {name: {path: statistics.median(values) for path, values in paths.items()} for name, paths in results.items()}
    p50["hand-over"] = {path: statistics.median(values) for path, values in pool.items()}
    run_id = record_bench("env-latency", vars(args) | {"json": str(args.json)}, {"p50_ms": p50, "missed": failed})
    print(f"recorded as run {run_id}")


if __name__ == "__main__":
    main()
