"""The start of a CLI attempt: from a ready sandbox to the CLI's first model call, beside the same
CLI started on this host (the same bundle, configuration and model path: the proxy, then the
attempt's endpoint), in the same run.

    python bench/cli_start.py [--runs 5] [--clis codex,claude,...] [--image orchard/base:bookworm]

In the sandbox the time covers what an attempt adds: writing the prompt and the CLI's
configuration through the agent, exposing the proxy's port, starting the CLI from the read-only
bundle and its own start-up until its first request reaches the endpoint. On the host, the CLI
runs from the same bundle (reached at its mount point, `/.orchard-tools`, through a symbolic link
made for the run when there is none: needs root), from starting the command to its first request.
Prints the median of each and their ratio. Traffic stays on loopback and in the sandbox.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchard.agents import harness_factory
from orchard.agents.base import Reply, Step
from orchard.agents.external import HOME, MODEL_PORT, CliRun, ModelEndpoint, attempt_proxy, completion
from orchard.agents.loop import Limits
from orchard.env import Client
from orchard.env.tools import TOOLS_MOUNT, build_tools

CLIS = ["codex", "claude", "opencode", "pi", "hermes", "mini"]


class _Task:
    instance_id = "start-1"
    workdir = "/tmp/work"

    def public(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "problem_statement": self.prompt()}

    def prompt(self) -> str:
        return "Say hello."

    def start(self, box: Any) -> None:
        box.exec(f"mkdir -p {self.workdir}")

    def conclude(self, box: Any, messages: Any, dialogue: Any) -> str:
        return ""


class _FirstCall:
    """A model session that notes when the CLI first asked, then ends the episode."""

    replays = True

    def __init__(self, harness: Any):
        self.harness, self.first = harness, None

    def complete(self, messages: Any, tools: Any) -> Reply:
        if self.first is None:
            self.first = time.perf_counter()
        return self.harness.encode(Step("submit", thought="Hello."), 1)


def in_sandbox(client: Client, image: str, name: str) -> float:
    harness = harness_factory(name)()
    session = _FirstCall(harness)
    with client.create(image, tools=True) as box:
        box.exec("true")  # ready
        started = time.perf_counter()
        harness.drive(_Task(), session, box, model_name="bench", limits=Limits(max_seconds=120))
    assert session.first is not None, f"{name} never called its model"
    return session.first - started


def on_host(name: str) -> float:
    harness = harness_factory(name)()
    session = _FirstCall(harness)
    proxy = attempt_proxy()
    endpoint = ModelEndpoint.shared()

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        harness.offered = body.get("tools") or []
        return completion(session.complete(body["messages"], body.get("tools")), "bench")

    with endpoint.open(answer) as route:
        key = proxy.keys.grant("bench", "host", route=route)
        base = f"http://127.0.0.1:{proxy.port}/v1"
        with tempfile.TemporaryDirectory() as work:
            run = CliRun(base, key, harness.model_name, f"{HOME}/prompt.md", work, Limits(), f"{TOOLS_MOUNT}/bin")
            Path(run.prompt_file).parent.mkdir(parents=True, exist_ok=True)
            Path(run.prompt_file).write_text("Say hello.")
            for path, content in harness.files(run).items():
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_text(content)
            env = {**os.environ, "HOME": f"{HOME}/home", "TERM": "dumb", "NO_COLOR": "1", "CI": "1"}
            env.update(harness.environment(run))
            Path(env["HOME"]).mkdir(parents=True, exist_ok=True)
            started = time.perf_counter()
            subprocess.run(["bash", "-c", harness.command(run)], cwd=work, env=env, capture_output=True, timeout=120)
        proxy.keys.revoke(key)
    assert session.first is not None, f"{name} never called its model on the host"
    return session.first - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--clis", default=",".join(CLIS))
    parser.add_argument("--image", default="orchard/base:bookworm")
    args = parser.parse_args()
    bundle = build_tools()
    mount = Path(TOOLS_MOUNT)
    made = False
    if not mount.exists():
        mount.symlink_to(bundle.path)
        made = True
    try:
        print(
            f"{'cli':<9} {'host p50':>9} {'sandbox p50':>12} {'ratio':>6}   (seconds to the first model call; {args.runs} runs)"
        )
        with Client() as client:
            for name in args.clis.split(","):
                host = statistics.median(on_host(name) for _ in range(args.runs))
                boxed = statistics.median(in_sandbox(client, args.image, name) for _ in range(args.runs))
                print(f"{name:<9} {host:>9.2f} {boxed:>12.2f} {boxed / host:>5.2f}x")
    finally:
        if made:
            mount.unlink()
    print(f"(port {MODEL_PORT} in the sandbox; image {shlex.quote(args.image)})")


if __name__ == "__main__":
    main()
