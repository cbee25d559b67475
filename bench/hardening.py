"""What the sandbox hardening costs: exec p50 and an N-sandbox lifecycle, before and after, same run.

    .venv/bin/python bench/hardening.py --before REF [--runs 300] [--n 100] [--rounds 2] [--network blocked]

"before" is a git ref (the commit before the hardening, e.g. `f767c41`), checked out into a
temporary worktree; "after" is this checkout. Every measurement runs in a process of its own
with `PYTHONPATH` set to the tree it measures, so each side imports its own `orchard` (its agent,
its backend, its SDK) and gets a throwaway `ORCHARD_HOME`; both use only the public SDK
(`Client().create`, `exec`, `delete`), the same probe code for both. The sides alternate,
`--rounds` times (before, after, after, before, ...), so that drift of the machine falls on both
alike; the figure of a side is the median of its rounds.

* exec: p50 of `true` and of `echo hi` straight to the agent, `--runs` each after 20 warm-up ones,
  in one sandbox.
* lifecycle: N threads share one embedded `Client()`; each creates a sandbox, runs the 4 commands
  of `bench/env_lifecycle.py`, and deletes it; the wall time of the N threads.

Target: after / before at most 1.10 on every figure. Not a test: it prints the figures and the
ratios, and records them as a `bench` run. Nothing leaks: each probe deletes what it made (its
client deletes the rest when it closes), and the worktree is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

EXEC_PROBE = r"""
import json, statistics, sys, time
from orchard.env import Client

runs, image, network = int(sys.argv[1]), sys.argv[2], sys.argv[3]
figures = {}
with Client() as client, client.create(image, network=network) as box:
    for name in ("true", "echo hi"):
        for _ in range(20):
            box.exec(name)
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            result = box.exec(name)
            times.append(time.perf_counter() - started)
            assert result.exit_code == 0, result
        figures[f"exec p50 ms, {name}"] = statistics.median(times) * 1000
print(json.dumps(figures))
"""

LIFECYCLE_PROBE = r"""
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
from orchard.env import Client

n, image, network = int(sys.argv[1]), sys.argv[2], sys.argv[3]
COMMANDS = [
    ("python3 -c 'import sys; print(sys.version)'", False),
    ("ls /", False),
    ("cat /etc/os-release | head -1", False),
    ("cat /etc/os-release | head -1", True),
]

def one(client):
    box = client.create(image, network=network)
    try:
        return all(box.exec(command, login_shell=login).exit_code == 0 for command, login in COMMANDS)
    finally:
        box.delete()

with Client() as client:
    one(client)  # warm-up: the agent bundle, the engine's caches
    started = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        ok = sum(pool.map(lambda _: one(client), range(n)))
    wall = time.perf_counter() - started
print(json.dumps({f"lifecycle wall s, N={n}": wall, "ok": ok}))
"""


def probe(tree: Path, code: str, *args: str) -> dict[str, float]:
    """Run a probe in its own process against the `orchard` of `tree`; its figures."""
    with tempfile.TemporaryDirectory(prefix="orchard-bench-home-") as home:
        env = {k: v for k, v in os.environ.items() if k not in ("ORCHARD_URL", "SANDBOX_BASE_URL", "ORCHARD_DB_URL")}
        env.update(PYTHONPATH=str(tree), ORCHARD_HOME=home)
        done = subprocess.run(
            [sys.executable, "-c", code, *args], cwd=tree, env=env, capture_output=True, text=True, check=False
        )
    if done.returncode != 0:
        raise SystemExit(f"a probe failed in {tree}:\n{done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="git ref of the code before the hardening")
    parser.add_argument("--runs", type=int, default=300, help="commands per exec figure")
    parser.add_argument("--n", type=int, default=100, help="sandboxes at once in the lifecycle")
    parser.add_argument("--rounds", type=int, default=2, help="measurements of each side")
    parser.add_argument("--image", default="orchard/base:bookworm")
    parser.add_argument("--network", default="blocked", choices=["blocked", "open"])
    args = parser.parse_args()

    from orchard.store.runs import record_bench

    worktree = Path(tempfile.mkdtemp(prefix="orchard-before-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.before], check=True)
    try:
        trees = {"before": worktree, "after": ROOT}
        figures: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
        order = ["before", "after"]
        for round_ in range(args.rounds):
            for side in order if round_ % 2 == 0 else order[::-1]:
                measured = probe(trees[side], EXEC_PROBE, str(args.runs), args.image, args.network)
                measured |= probe(trees[side], LIFECYCLE_PROBE, str(args.n), args.image, args.network)
                if measured.pop("ok") != args.n:
                    print(f"warning: {side}, round {round_ + 1}: not every sandbox passed its commands")
                for name, value in measured.items():
                    figures[side].setdefault(name, []).append(value)
                print(f"round {round_ + 1} {side}: " + ", ".join(f"{k} {v:.2f}" for k, v in measured.items()))
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=False)

    summary = {}
    print(f"\n{'figure':32} {'before':>9} {'after':>9} {'after/before':>13}")
    for name in figures["before"]:
        before, after = statistics.median(figures["before"][name]), statistics.median(figures["after"][name])
        ratio = after / before
        summary[name] = {"before": before, "after": after, "ratio": ratio}
        verdict = "met" if ratio <= 1.10 else "missed"
        print(f"{name:32} {before:9.2f} {after:9.2f} {ratio:12.2f}x  (target <= 1.10: {verdict})")
    config = {"before": args.before, "runs": args.runs, "n": args.n, "rounds": args.rounds, "network": args.network}
    print(f"recorded as run {record_bench('hardening', config, summary)}")


if __name__ == "__main__":
    main()
