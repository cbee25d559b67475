"""The Claw recipe's two costs per episode (not a test): starting a task's services in a warm
sandbox, and a tool call through a harness, each against its baseline measured in the same run.

    .venv/bin/python bench/claw.py [--runs 30] [--calls 300] [--json out.json]

* **start to first tool call**: from a sandbox already running (what a warm pool hands out), the
  task's `start` (copy the world and its setup in, start the server, wait until it listens) and
  the first tool call answered. Baseline: one bare `exec` of `true` in the same sandboxes, the
  least any start through the agent costs. Goal: p50 under 100 ms.
* **a tool call through the harness**: `FunctionsHarness.execute` of `todo_list` on the services
  in the sandbox (the JSON body to the agent's `POST /http`, the agent's request to the server on
  the sandbox's loopback, the answer checked on the host and made an observation), against the
  bare HTTP call: the same server (`orchard/recipes/claw/server.py`, the same world) on this host's
  loopback, asked with `http.client`, a connection per call as the agent makes them. Goal: at
  most 5 ms above it.
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
from pathlib import Path

from orchard.agents.base import Action
from orchard.config import BASE_IMAGE
from orchard.env import Client
from orchard.recipes.claw.harnesses import FunctionsHarness
from orchard.recipes.claw.task import SOURCES
from orchard.tasks.loading import load_tasks

ROOT = Path(__file__).resolve().parents[1]


def _ms(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered) * 1000, ordered[int(0.95 * (len(ordered) - 1))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="sandboxes started")
    parser.add_argument("--calls", type=int, default=300, help="tool calls timed")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    task = next(t for t in load_tasks(ROOT / "examples/claw/tasks.json") if "todo" in t.services)
    first = {"name": "todo_list", "arguments": {}}
    starts, bare_execs = [], []
    with Client() as client:
        boxes = [client.create(BASE_IMAGE, **type(task).limits) for _ in range(args.runs)]
        try:
            for box in boxes:
                began = time.perf_counter()
                box.exec("true")
                bare_execs.append(time.perf_counter() - began)
                harness = FunctionsHarness()
                harness.system_prompt({**task.public(), "prompt": task.prompt()})
                began = time.perf_counter()
                task.start(box)
                answer = harness.execute(Action(first["name"], first["arguments"]), box, task.workdir)
                starts.append(time.perf_counter() - began)
                assert answer.startswith("{"), answer
            box = boxes[0]
            harness = FunctionsHarness()
            harness.system_prompt({**task.public(), "prompt": task.prompt()})
            through = []
            for index in range(args.calls + 20):
                began = time.perf_counter()
                harness.execute(Action("todo_list", {}), box, task.workdir)
                if index >= 20:
                    through.append(time.perf_counter() - began)
        finally:
            for box in boxes:
                box.delete()
    bare = _bare_calls(task, args.calls)
    figures = {
        "start_to_first_call_ms": _ms(starts),
        "bare_exec_ms": _ms(bare_execs),
        "tool_call_through_harness_ms": _ms(through),
        "bare_http_call_ms": _ms(bare),
    }
    for name, (p50, p95) in figures.items():
        print(f"{name:32} p50 {p50:7.2f}  p95 {p95:7.2f}")
    start, call = figures["start_to_first_call_ms"][0], figures["tool_call_through_harness_ms"][0]
    print(
        f"start to first tool call: p50 {start:.1f} ms (goal < 100 ms; {start / figures['bare_exec_ms'][0]:.1f}x a bare exec)"
    )
    print(
        f"tool call through the harness: +{call - figures['bare_http_call_ms'][0]:.2f} ms over the bare call (goal < 5 ms)"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


def _bare_calls(task, calls: int) -> list[float]:
    """The same server and world on this host's loopback, asked with `http.client`."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "setup.json").write_text(json.dumps(task.setup()))
        for source in SOURCES:  # laid out as in the sandbox: the server, the world, the HTTP layer
            Path(folder, source.name).write_bytes(source.read_bytes())
        proc = subprocess.Popen([sys.executable, "-S", "server.py", "setup.json", str(port), "ready"], cwd=folder)
        try:
            while not Path(folder, "ready").exists():
                time.sleep(0.01)
            times = []
            for index in range(calls + 20):
                began = time.perf_counter()
                connection = http.client.HTTPConnection("127.0.0.1", port)
                connection.request("POST", "/todo/list", body=b"{}", headers={"Content-Type": "application/json"})
                connection.getresponse().read()
                connection.close()
                if index >= 20:
                    times.append(time.perf_counter() - began)
            return times
        finally:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
