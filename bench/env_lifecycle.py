"""N concurrent sandboxes, each created, given 4 commands and deleted, beside the raw-Docker floor.

    .venv/bin/python bench/env_lifecycle.py --n 10 50 100 [--image orchard/base:bookworm]
        [--workers N] [--json PATH]

Not a test: it prints figures, and ratios measured in the same run. For each N:

* orchard (blocked): N threads (or `--workers`) share one embedded `Client()` (throwaway store in
  a temporary folder); each thread creates a sandbox (default `blocked` network), runs the 4
  commands of the Orchard paper's benchmark and deletes it. The commands are
  `python3 -c 'import sys; print(sys.version)'` (the paper says `python`, but the Debian base
  image has only `python3`), `ls /`, `cat /etc/os-release | head -1`, and that last one again
  with `login_shell=True`. Each output is checked (exit code 0 and plausible stdout); a sandbox
  counts as ok only when its create, 4 checks and delete all succeeded. One failure never stops
  the run.
* docker SDK, bridge / no network: the lifecycle floor. The same N containers of the same image
  created and started with `containers.run(image, ["sleep", "600"], detach=True)` and removed
  with `.remove(force=True)`, N threads, on the default bridge network (what a naive harness
  does) and with `network_mode="none"` (what Orchard's `blocked` uses). No commands run in them.

Measured: wall time of the N threads (the thread pool only: not the client set-up, which builds
the agent bundle and connects once), commands/s (commands that passed their check, over that
wall time), p50/p95 of create (for Orchard: until the agent answers), exec and delete. One
warm-up sandbox or container comes first on each path. The floor's Docker client gets a
connection pool as large as the thread count, so it does not pay for discarded connections.
Not measured: image pulls (the image must be present), the service mode (`orchard up`), the
store on PostgreSQL, anything outside the local engine (no network traffic beyond its socket).
The engine is watched meanwhile: containers that other processes create during a path (a test
run on the same engine, say) are counted and flagged, since they skew the figures.

Nothing leaks: each path removes what it made in a `finally`, and a sweep by label (the raw
containers carry `org.orchard.bench=lifecycle`; Orchard's carry this process as owner) runs
after each path and at exit, on errors and Ctrl-C too; a leak is reported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial

import docker

from orchard.config import BASE_IMAGE
from orchard.env import Client
from orchard.env.backends.base import LABEL_PREFIX
from orchard.env.client import Sandbox
from orchard.process import process_owner
from orchard.store import Store
from orchard.store.runs import record_bench

OWNER = process_owner()
BENCH_LABEL = {"org.orchard.bench": "lifecycle", "org.orchard.bench.owner": OWNER}
ORCHARD_LABEL = {LABEL_PREFIX + "owner": OWNER}
OS_RELEASE = re.compile(r"^(PRETTY_)?NAME=")


@dataclass(frozen=True)
class Command:
    """One benchmark command and how to tell its output is plausible."""

    text: str
    plausible: Callable[[str], bool]
    login_shell: bool = False


COMMANDS = [
    Command("python3 -c 'import sys; print(sys.version)'", lambda out: re.match(r"3\.\d+\.\d+", out) is not None),
    Command("ls /", lambda out: {"etc", "usr"} <= set(out.split())),
    Command("cat /etc/os-release | head -1", lambda out: OS_RELEASE.match(out) is not None),
    Command("cat /etc/os-release | head -1", lambda out: OS_RELEASE.match(out) is not None, login_shell=True),
]


@dataclass
class Trial:
    """One sandbox (or container): its step times in ms, and the first error, if any."""

    create_ms: float | None = None
    exec_ms: list[float] = field(default_factory=list)
    delete_ms: float | None = None
    ok_commands: int = 0
    failed_commands: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.failed_commands == 0 and self.delete_ms is not None


@dataclass
class PathResult:
    """The figures of one path at one N."""

    n: int
    path: str
    ok: int
    wall_s: float
    commands: int
    create_ms: list[float]
    exec_ms: list[float]
    delete_ms: list[float]
    errors: list[str]
    leaked: int = 0
    foreign: int = 0
    """Containers other processes created in the engine meanwhile (they skew the figures)."""

    @property
    def commands_per_s(self) -> float | None:
        return self.commands / self.wall_s if self.commands else None

    def summary(self) -> dict:
        figures = {k: v for k, v in asdict(self).items() if not k.endswith("_ms") and k != "errors"}
        for step in ("create", "exec", "delete"):
            figures[f"{step}_p50_ms"], figures[f"{step}_p95_ms"] = p50_p95(getattr(self, f"{step}_ms"))
        return {**figures, "commands_per_s": self.commands_per_s, "errors": self.errors[:5]}


def p50_p95(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    ordered = sorted(values)
    return statistics.median(ordered), ordered[math.ceil(len(ordered) * 0.95) - 1]


def elapsed_ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


# -- the paths --------------------------------------------------------------------------


def orchard_trial(client: Client, image: str, stop: threading.Event) -> Trial:
    """Create one sandbox, run the 4 commands, delete it; every step timed, nothing raised."""
    trial = Trial()
    if stop.is_set():
        trial.error = "not started (interrupted)"
        return trial
    started = time.perf_counter()
    try:
        box = client.create(image)
    except Exception as exc:  # counted, not fatal
        trial.error = f"create: {describe(exc)}"
        return trial
    trial.create_ms = elapsed_ms(started)
    try:
        for command in COMMANDS:
            run_command(box, command, trial)
    finally:
        started = time.perf_counter()
        try:
            box.delete()
            trial.delete_ms = elapsed_ms(started)
        except Exception as exc:  # counted, not fatal; the client's close retries it
            trial.error = trial.error or f"delete: {describe(exc)}"
    return trial


def run_command(box: Sandbox, command: Command, trial: Trial) -> None:
    started = time.perf_counter()
    try:
        result = box.exec(command.text, login_shell=command.login_shell)
    except Exception as exc:  # counted, not fatal
        trial.failed_commands += 1
        trial.error = trial.error or f"exec {command.text!r}: {describe(exc)}"
        return
    trial.exec_ms.append(elapsed_ms(started))
    if result.exit_code != 0 or not command.plausible(result.stdout):
        trial.failed_commands += 1
        detail = f"exit {result.exit_code}, stdout {result.stdout[:80]!r}, stderr {result.stderr[:80]!r}"
        trial.error = trial.error or f"exec {command.text!r} (login={command.login_shell}): {detail}"
    else:
        trial.ok_commands += 1


def floor_trial(engine: docker.DockerClient, image: str, network_mode: str | None, stop: threading.Event) -> Trial:
    """Create and start one plain container, then remove it (no commands run in it)."""
    trial = Trial()
    if stop.is_set():
        trial.error = "not started (interrupted)"
        return trial
    options = {"network_mode": network_mode} if network_mode else {}  # None: the default bridge
    started = time.perf_counter()
    try:
        container = engine.containers.run(image, command=["sleep", "600"], detach=True, labels=BENCH_LABEL, **options)
    except Exception as exc:  # counted, not fatal; the sweep removes a half-made one
        trial.error = f"create: {describe(exc)}"
        return trial
    trial.create_ms = elapsed_ms(started)
    started = time.perf_counter()
    try:
        container.remove(force=True)
        trial.delete_ms = elapsed_ms(started)
    except Exception as exc:  # counted, not fatal
        trial.error = f"delete: {describe(exc)}"
    return trial


def run_threads(n: int, workers: int, trial: Callable[[threading.Event], Trial]) -> tuple[list[Trial], float]:
    """`n` trials on `workers` threads; on Ctrl-C, start no more and let the running ones clean up."""
    stop = threading.Event()
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bench")
    started = time.perf_counter()
    try:
        futures = [pool.submit(trial, stop) for _ in range(n)]
        trials = [future.result() for future in futures]
        return trials, time.perf_counter() - started
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)


def run_watched(n: int, workers: int, trial: Callable[[threading.Event], Trial]) -> tuple[list[Trial], float, int]:
    """`run_threads`, plus how many containers other processes created in the engine meanwhile."""
    watcher_engine = docker.from_env()
    stream = watcher_engine.api.events(filters={"type": "container", "event": "create"}, decode=True)
    foreign: list[str] = []
    watcher = threading.Thread(target=collect_foreign, args=(stream, foreign), daemon=True)
    watcher.start()
    try:
        trials, wall_s = run_threads(n, workers, trial)
    finally:
        stream.close()
        watcher.join(timeout=5)
        watcher_engine.close()
    return trials, wall_s, len(foreign)


def collect_foreign(stream, foreign: list[str]) -> None:
    """Append the name of each container created without this run's labels, until the stream closes."""
    mine = (ORCHARD_LABEL.items(), BENCH_LABEL.items())
    with contextlib.suppress(Exception):  # the stream was closed under us: done
        for event in stream:
            attributes = event["Actor"]["Attributes"]
            if not any(labels <= attributes.items() for labels in mine):
                foreign.append(attributes.get("name", "?"))


def result_of(n: int, path: str, trials: list[Trial], wall_s: float, leaked: int, foreign: int) -> PathResult:
    return PathResult(
        n=n,
        path=path,
        ok=sum(t.ok for t in trials),
        wall_s=wall_s,
        commands=sum(t.ok_commands for t in trials),
        create_ms=[t.create_ms for t in trials if t.create_ms is not None],
        exec_ms=[ms for t in trials for ms in t.exec_ms],
        delete_ms=[t.delete_ms for t in trials if t.delete_ms is not None],
        errors=[t.error for t in trials if t.error],
        leaked=leaked,
        foreign=foreign,
    )


def measure_orchard(n: int, image: str, workers: int, engine: docker.DockerClient) -> PathResult:
    with tempfile.TemporaryDirectory(prefix="orchard-bench-") as tmp:
        try:
            with Client(store=Store.open(f"sqlite:///{tmp}/bench.db")) as client:
                client.create(image).delete()  # warm-up: connections, caches (not counted)
                trials, wall_s, foreign = run_watched(n, workers, partial(orchard_trial, client, image))
        finally:
            leaked = sweep(engine, ORCHARD_LABEL)
    return result_of(n, "orchard (blocked)", trials, wall_s, leaked, foreign)


def measure_floor(n: int, image: str, workers: int, network_mode: str | None) -> PathResult:
    engine = docker.from_env(timeout=300, max_pool_size=max(workers, 10))  # no pool-full discards
    try:
        floor_trial(engine, image, network_mode, threading.Event())  # warm-up (not counted)
        trial = partial(floor_trial, engine, image, network_mode)
        trials, wall_s, foreign = run_watched(n, workers, trial)
    finally:
        leaked = sweep(engine, BENCH_LABEL)
        engine.close()
    name = "docker SDK, no network" if network_mode == "none" else "docker SDK, bridge"
    return result_of(n, name, trials, wall_s, leaked, foreign)


def sweep(engine: docker.DockerClient, labels: dict[str, str]) -> int:
    """Remove every container carrying `labels`; return how many there were (0 when nothing leaked)."""
    selector = [f"{key}={value}" for key, value in labels.items()]
    leftovers = engine.containers.list(all=True, filters={"label": selector})
    for container in leftovers:
        with contextlib.suppress(docker.errors.NotFound):  # removed meanwhile
            container.remove(force=True)
    return len(leftovers)


# -- report -----------------------------------------------------------------------------

PATHS = ("orchard (blocked)", "docker SDK, bridge", "docker SDK, no network")


def trio(results: list[PathResult], n: int) -> list[PathResult]:
    """Orchard, the bridge floor and the no-network floor at `n`."""
    return [next(r for r in results if r.n == n and r.path == path) for path in PATHS]


def ms_pair(values: list[float]) -> str:
    p50, p95 = p50_p95(values)
    return "-" if p50 is None else f"{p50:.0f}/{p95:.0f}"


def print_table(results: list[PathResult]) -> None:
    head = f"{'N':<5}{'path':<25}{'ok':>6}{'wall s':>9}{'cmds/s':>8}"
    print(f"\n{head}  {'create p50/p95 ms':>18}  {'exec p50/p95 ms':>16}  {'delete p50/p95 ms':>18}")
    for r in results:
        orchard = trio(results, r.n)[0]
        rate = f"{r.commands_per_s:.0f}" if r.commands_per_s else "-"
        line = f"{r.n:<5}{r.path:<25}{r.ok / r.n:>6.0%}{r.wall_s:>9.2f}{rate:>8}"
        line += f"  {ms_pair(r.create_ms):>18}  {ms_pair(r.exec_ms):>16}  {ms_pair(r.delete_ms):>18}"
        if r is not orchard:
            line += f"  vs orchard: {orchard.wall_s / r.wall_s:.2f}"
        if r.leaked:
            line += f"  LEAKED {r.leaked}"
        if r.foreign:
            line += f"  (engine busy: {r.foreign} foreign containers)"
        print(line)
    for n in sorted({r.n for r in results}):
        orchard, bridge, none = trio(results, n)
        print(
            f"N={n}: orchard wall / bridge floor = {orchard.wall_s / bridge.wall_s:.2f} (target <= 0.8); "
            f"/ no-network floor = {orchard.wall_s / none.wall_s:.2f}; "
            f"orchard ok {orchard.ok}/{n}" + (" (target 100%)" if orchard.ok < n else "")
        )


def write_json(path: str, args: argparse.Namespace, results: list[PathResult]) -> None:
    ratios = {}
    for n in sorted({r.n for r in results}):
        orchard, bridge, none = trio(results, n)
        ratios[str(n)] = {
            "orchard_vs_bridge": orchard.wall_s / bridge.wall_s,
            "orchard_vs_none": orchard.wall_s / none.wall_s,
        }
    document = {
        "image": args.image,
        "workers": args.workers or "N",
        "cpus": os.cpu_count(),
        "results": [r.summary() for r in results],
        "ratios": ratios,
    }
    with open(path, "w") as f:
        json.dump(document, f, indent=2)


def measure_all(n: int, image: str, workers: int, engine: docker.DockerClient) -> list[PathResult]:
    """Orchard, then the two floors, at one N; each reported as soon as it is done."""
    results = []
    for measure in (
        lambda: measure_orchard(n, image, workers, engine),
        lambda: measure_floor(n, image, workers, None),
        lambda: measure_floor(n, image, workers, "none"),
    ):
        result = measure()
        print(f"N={n} {result.path}: ok {result.ok}/{n}, wall {result.wall_s:.2f} s", flush=True)
        if result.errors:
            print(f"  {len(result.errors)} failure(s), first: {result.errors[0]}", flush=True)
        if result.foreign:
            print(f"  warning: other processes created {result.foreign} containers meanwhile", flush=True)
        results.append(result)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--n", type=int, nargs="+", default=[10, 50, 100], help="sandboxes at once (several: one run each)"
    )
    parser.add_argument("--image", default=BASE_IMAGE)
    parser.add_argument("--workers", type=int, default=None, help="threads (default: N)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args()

    engine = docker.from_env(timeout=300)
    engine.images.get(args.image)  # fails now, clearly, when the image is missing
    results: list[PathResult] = []
    try:
        for n in dict.fromkeys(args.n):  # each N once
            results += measure_all(n, args.image, args.workers or n, engine)
    except KeyboardInterrupt:
        raise SystemExit("interrupted; every container made so far is removed") from None
    finally:
        for labels in (BENCH_LABEL, ORCHARD_LABEL):
            if left := sweep(engine, labels):
                print(f"removed {left} leftover container(s) labelled {labels}")
        engine.close()
    print_table(results)
    run_id = record_bench(
        "env-lifecycle", {"n": args.n, "image": args.image}, {"paths": [r.summary() for r in results]}
    )
    print(f"recorded as run {run_id}")
    if args.json:
        write_json(args.json, args, results)


if __name__ == "__main__":
    main()
