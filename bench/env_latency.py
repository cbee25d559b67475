"""Per-command latency of `true` in one sandbox, side by side (a first cut; not a test).

    .venv/bin/python bench/env_latency.py [--runs 300]

Measures, in the same run and the same container: Orchard's SDK straight to the agent (Unix
socket), Orchard through an `orchard up` service on loopback, the Docker SDK's `exec_run`, and
the `docker exec` CLI (what mini-swe-agent does). Prints p50/p95 and the ratio to `docker exec`.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Callable

import httpx
import uvicorn

from orchard.config import BASE_IMAGE
from orchard.env import Client
from orchard.env.manager import SandboxManager
from orchard.env.service import Service, create_app


def timings(run: Callable[[], object], runs: int, warmup: int = 20) -> list[float]:
    for _ in range(warmup):
        run()
    out = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        out.append((time.perf_counter() - started) * 1000)
    return sorted(out)


def start_service() -> tuple[str, uvicorn.Server, SandboxManager]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = SandboxManager("docker")
    server = uvicorn.Server(uvicorn.Config(create_app(Service(manager, "bench")), port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    while True:
        try:
            httpx.get(f"{url}/health")
            return url, server, manager
        except httpx.HTTPError:
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--image", default=BASE_IMAGE)
    args = parser.parse_args()

    import docker

    url, server, manager = start_service()
    results: dict[str, list[float]] = {}
    with Client() as embedded, Client(url=url, api_key="bench") as remote:
        box = embedded.create(args.image)
        results["orchard SDK, direct to the agent"] = timings(lambda: box.exec("true"), args.runs)
        via = remote.create(args.image)
        results["orchard SDK, through orchard up"] = timings(lambda: via.exec("true"), args.runs)
        container = docker.from_env().containers.get(f"orchard-{box.id}")
        results["docker SDK exec_run"] = timings(lambda: container.exec_run(["true"]), max(args.runs // 3, 50))
        cli = ["docker", "exec", container.name, "true"]
        results["docker exec CLI"] = timings(lambda: subprocess.run(cli, check=True), max(args.runs // 3, 50))
    server.should_exit = True
    manager.close()

    floor = statistics.median(results["docker exec CLI"])
    print(f"{'path':<36} {'p50 ms':>8} {'p95 ms':>8} {'vs docker exec':>15}")
    for name, values in results.items():
        p50, p95 = statistics.median(values), values[int(len(values) * 0.95) - 1]
        print(f"{name:<36} {p50:>8.2f} {p95:>8.2f} {floor / p50:>14.1f}x")


if __name__ == "__main__":
    main()
