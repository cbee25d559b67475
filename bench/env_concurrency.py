"""The published Orchard Env concurrency benchmark's workload through `orchard up`, three clients side by side.

    .venv/bin/python bench/env_concurrency.py [--num 8] [--image orchard/base:bookworm] [--phased]
        [--clients published polling orchard] [--json PATH]

Not a test: it prints figures, and ratios against our SDK measured in the same run. The workload
is the one of the published `bench_concurrent.py`: `--num` sandboxes at once, each created, given
4 commands one after the other (`python3 -c 'import sys; print(sys.version)'`; the published
default says `python`, which the Debian base image does not have), `ls /`,
`cat /etc/os-release | head -1` and that last one again with `login_shell` true), then deleted.
Interleaved by default (each sandbox goes create -> 4 commands -> delete on its own); with
`--phased`, three phases: create all, exec all, delete all.

The service is a real `orchard up` (`python -m orchard.env.service`) in a process and session of
its own, on a free loopback port, over the local Docker engine, with a throwaway `ORCHARD_HOME`.
Sandboxes keep the default blocked network. Each client runs the workload in turn on that
service, after one warm-up sandbox of its own (not counted); `--num` threads share the client,
one per sandbox, as the published script runs one asyncio task per sandbox:

* published: a client that sends exactly what the published SDK sends (its sync transport, here
  plain httpx). Create is `POST /sandboxes {"image", "block_network": true}`, then
  `GET /sandboxes/{id}/wait?timeout=<the answer's timeout>`. Exec is `POST .../exec` with
  `{"command", "timeout_seconds": null, "cwd": null, "env": null, "login_shell", "wait": true}`;
  an answer that is not final is polled with `GET /jobs/{id}` every 0.1 s, and a failed POST is
  sent again without `wait` (the SDK's fallback: a second submission), then polled. Delete is
  `DELETE /sandboxes/{id}`. Requests carry only `X-API-Key`; a 503 is retried after Retry-After
  plus up to 2 s, a connection failure after 1 s then 2 s, three attempts in all, as the SDK does.
  In `--phased`, as the published script, `GET /sandboxes/{id}` comes before a sandbox's
  commands (not timed) and before its delete (timed with it).
* polling: the same, but exec is `wait: false` and then `GET /jobs/{id}` every 0.1 s until the
  job is final: what a client that polls pays.
* orchard: our SDK through the service, `orchard.env.Client(url=..., api_key=...)`,
  `client.create(image)`, `box.exec(command, login_shell=...)`, `box.delete()`. The baseline.

Bodies are sent as the published SDK sends them, whatever the service makes of them: a service
that refuses `"timeout_seconds": null` (422) shows as failed commands, not as a crash.

Measured per client: wall time of the workload; creates/s, execs/s and deletes/s as the published
report has them (successes over the whole wall time); p50 of create (POST until ready) and
delete; p50/p90/p99 of the successful commands (linear interpolation, as published); the success
rate (operations that succeeded over the 6 per sandbox that the workload asks for: a sandbox that
could not be created counts its 4 commands and its delete as failed); each client's exec p50 over
our SDK's. Unlike the published script, a command that fails does not end its sandbox's run: the
next command is still tried and counted, and the delete always follows. An exec succeeds when the
job's status is `succeeded` (our SDK: exit code 0).

Nothing leaks: every sandbox a client made is deleted in a `finally` (also on errors and Ctrl-C,
which lets running requests finish and starts no new command), the service is then stopped (it
deletes what it still owns), and the engine is swept for containers labelled with the service
process as owner; a leak is reported and the exit status is 1. No traffic leaves the host: the
service is on 127.0.0.1, the engine on its Unix socket, proxies in the environment are ignored.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Protocol, TypeVar

import docker
import httpx

from orchard.config import BASE_IMAGE
from orchard.env import Client
from orchard.env.backends.base import LABEL_PREFIX
from orchard.env.client import Sandbox
from orchard.process import process_owner
from orchard.store.runs import record_bench

T = TypeVar("T")

COMMANDS = [
    ("python3 -c 'import sys; print(sys.version)'", False),
    ("ls /", False),
    ("cat /etc/os-release | head -1", False),
    ("cat /etc/os-release | head -1", True),
]
"""The published benchmark's 4 commands: (command, login_shell)."""
CLIENTS = {
    "published": "published SDK shape (wait=true)",
    "polling": "polling (wait=false + GET /jobs)",
    "orchard": "orchard SDK via orchard up",
}
BASELINE = "orchard"
FINAL = ("succeeded", "failed")
POLL_SECONDS = 0.1
"""The published SDK's `poll_interval` of exec."""
HTTP_TIMEOUT = 600.0
"""The published benchmark's client timeout (`AsyncSandboxClient(url, timeout=600)`)."""


@dataclass
class Record:
    """One timed operation, as the published script's JSON records have it (duration in ms)."""

    sandbox_index: int
    sandbox_id: str | None
    operation: str  # create, exec_1..exec_4, delete
    command: str
    start_time: float
    duration_ms: float
    success: bool
    error: str | None = None


def describe(exc: BaseException) -> str:
    """One line for a failure; an HTTP error carries its status and the start of its body."""
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code} {exc.request.method} {exc.request.url.path}: {exc.response.text[:160]}"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


# -- the clients ------------------------------------------------------------------------


class Driver(Protocol):
    """What the workload needs of a client. `exec` answers None on success, else why not."""

    def create(self, image: str) -> str: ...
    def look_up(self, sandbox_id: str) -> None: ...
    def exec(self, sandbox_id: str, command: str, login_shell: bool) -> str | None: ...
    def delete(self, sandbox_id: str) -> None: ...
    def close(self) -> None: ...
    def counters(self) -> dict[str, int]: ...


class PublishedShaped:
    """A client that sends what the published SDK sends, request for request (see the module doc).

    With `polling`, exec submits with `wait: false` and polls the job instead of waiting on it.
    """

    def __init__(self, url: str, api_key: str, *, polling: bool):
        self.polling = polling
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)  # the async SDK's connector
        self.http = httpx.Client(
            base_url=url, headers={"X-API-Key": api_key}, timeout=HTTP_TIMEOUT, limits=limits, trust_env=False
        )
        self.live: set[str] = set()
        self.lock = threading.Lock()
        self.counts = {"job polls": 0, "re-submissions": 0, "503 retries": 0, "connection retries": 0}

    def request(self, method: str, path: str, **options: Any) -> dict:
        """The published SDK's request: 3 attempts; 503 waits Retry-After + U(0, 2) s; errors raise."""
        for attempt in range(3):
            try:
                response = self.http.request(method, path, **options)
            except httpx.TransportError:
                if attempt == 2:
                    raise
                self.count("connection retries")
                time.sleep(2**attempt)
                continue
            if response.status_code == 503 and attempt < 2:
                self.count("503 retries")
                try:
                    pause = float(response.headers.get("Retry-After", "5"))
                except ValueError:
                    pause = 5.0
                time.sleep(pause + random.uniform(0, 2))
                continue
            response.raise_for_status()
            return response.json()
        raise AssertionError("unreachable: the third attempt returns or raises")

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1

    def create(self, image: str) -> str:
        created = self.request("POST", "/sandboxes", json={"image": image, "block_network": True})
        sandbox_id = created["sandbox_id"]
        with self.lock:
            self.live.add(sandbox_id)
        try:
            wait = {"timeout": created.get("timeout", 3600)}
            ready = self.request("GET", f"/sandboxes/{sandbox_id}/wait", params=wait)
        except BaseException:
            self.forget(sandbox_id)  # the SDK deletes a sandbox it gave up on
            raise
        if ready.get("ready") or ready.get("status") == "ready":
            return sandbox_id
        self.forget(sandbox_id)
        raise RuntimeError(f"sandbox {sandbox_id} {ready.get('status')}: {ready.get('status_message', '')}")

    def look_up(self, sandbox_id: str) -> None:
        self.request("GET", f"/sandboxes/{sandbox_id}")

    def exec(self, sandbox_id: str, command: str, login_shell: bool) -> str | None:
        path = f"/sandboxes/{sandbox_id}/exec"
        body = {"command": command, "timeout_seconds": None, "cwd": None, "env": None, "login_shell": login_shell}
        if self.polling:
            job_id = self.request("POST", path, json={**body, "wait": False})["job_id"]
        else:
            try:
                job = self.request("POST", path, json={**body, "wait": True}, timeout=300 + 60)
                if job.get("status") in FINAL:
                    return outcome(job)
                job_id = job["job_id"]
            except Exception:  # the SDK's fallback: the same body without "wait", submitted again
                self.count("re-submissions")
                job_id = self.request("POST", path, json=body)["job_id"]
        deadline = time.monotonic() + 300 + 60
        while True:  # the SDK's polling: look first, then sleep
            self.count("job polls")
            job = self.request("GET", f"/jobs/{job_id}")
            if job.get("status") in FINAL:
                return outcome(job)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} did not complete within 360 s")
            time.sleep(POLL_SECONDS)

    def delete(self, sandbox_id: str) -> None:
        self.request("DELETE", f"/sandboxes/{sandbox_id}")
        with self.lock:
            self.live.discard(sandbox_id)

    def forget(self, sandbox_id: str) -> None:
        """Delete as well as can be (untimed, errors ignored): cleanup, not a measured delete."""
        with contextlib.suppress(Exception):
            self.delete(sandbox_id)

    def close(self) -> None:
        for sandbox_id in sorted(self.live):
            self.forget(sandbox_id)
        self.http.close()

    def counters(self) -> dict[str, int]:
        return dict(self.counts)


class OurSDK:
    """Our own SDK through the service: `Client(url=..., api_key=...)`; it deletes what is left when closed."""

    def __init__(self, url: str, api_key: str):
        self.client = Client(url=url, api_key=api_key)
        self.boxes: dict[str, Sandbox] = {}
        self.lock = threading.Lock()

    def create(self, image: str) -> str:
        box = self.client.create(image)
        with self.lock:
            self.boxes[box.id] = box
        return box.id

    def look_up(self, sandbox_id: str) -> None:
        pass  # a handle needs no look-up

    def exec(self, sandbox_id: str, command: str, login_shell: bool) -> str | None:
        result = self.boxes[sandbox_id].exec(command, login_shell=login_shell)
        if result.ok:
            return None
        return result.stderr.strip()[:200] or result.error or f"exit_code={result.exit_code}"

    def delete(self, sandbox_id: str) -> None:
        with self.lock:
            box = self.boxes.pop(sandbox_id)
        box.delete()

    def close(self) -> None:
        self.client.close()

    def counters(self) -> dict[str, int]:
        return {}


def outcome(job: dict) -> str | None:
    """None for a job that succeeded, else why it did not (as the published script words it)."""
    if job["status"] == "succeeded":
        return None
    return (job.get("stderr") or "").strip()[:200] or job.get("error") or f"exit_code={job.get('exit_code')}"


def make_driver(name: str, url: str, api_key: str) -> Driver:
    if name == "orchard":
        return OurSDK(url, api_key)
    return PublishedShaped(url, api_key, polling=name == "polling")


# -- the workload -----------------------------------------------------------------------


def timed(
    index: int, sandbox_id: str | None, operation: str, command: str, run: Callable[[], T]
) -> tuple[T | None, Record]:
    """Run one operation; its record, and its value (None when it raised: nothing is raised)."""
    started_at, started = time.time(), time.perf_counter()
    try:
        value, error = run(), None
    except Exception as exc:  # counted, not fatal
        value, error = None, describe(exc)
    ms = (time.perf_counter() - started) * 1000
    return value, Record(index, sandbox_id, operation, command, started_at, ms, error is None, error)


def create_one(driver: Driver, image: str, index: int) -> tuple[str | None, Record]:
    sandbox_id, record = timed(index, None, "create", "", lambda: driver.create(image))
    record.sandbox_id = sandbox_id
    return sandbox_id, record


def exec_all(driver: Driver, sandbox_id: str, index: int, stop: threading.Event) -> list[Record]:
    """The 4 commands in turn; a failed one does not end the run (the next is still tried)."""
    records = []
    for number, (command, login_shell) in enumerate(COMMANDS, start=1):
        if stop.is_set():
            break

        def run(command: str = command, login_shell: bool = login_shell) -> None:
            error = driver.exec(sandbox_id, command, login_shell)
            if error is not None:
                raise RuntimeError(error)

        records.append(timed(index, sandbox_id, f"exec_{number}", command, run)[1])
    return records


def delete_one(driver: Driver, sandbox_id: str, index: int, look_up: bool = False) -> Record:
    def run() -> None:
        if look_up:  # the published phased script: get_sandbox, then delete, timed together
            driver.look_up(sandbox_id)
        driver.delete(sandbox_id)

    return timed(index, sandbox_id, "delete", "", run)[1]


def lifecycle(driver: Driver, image: str, index: int, stop: threading.Event) -> list[Record]:
    """Interleaved: create, the 4 commands, delete, for one sandbox on its own."""
    if stop.is_set():
        return []
    sandbox_id, created = create_one(driver, image, index)
    records = [created]
    if sandbox_id is None:
        return records
    try:
        records += exec_all(driver, sandbox_id, index, stop)
    finally:
        records.append(delete_one(driver, sandbox_id, index))
    return records


def in_threads(items: list[T], work: Callable[[T, threading.Event], Any]) -> list[Any]:
    """`work` on every item at once, a thread each; on Ctrl-C, start nothing new, let the running finish."""
    stop = threading.Event()
    pool = ThreadPoolExecutor(max_workers=max(len(items), 1), thread_name_prefix="bench")
    try:
        futures = [pool.submit(work, item, stop) for item in items]
        return [future.result() for future in futures]
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)


def phased(driver: Driver, image: str, num: int, look_up: bool) -> tuple[list[Record], dict[str, float]]:
    """Create all, then exec all, then delete all; the records and each phase's wall time."""
    records: list[Record] = []
    phases: dict[str, float] = {}
    started = time.perf_counter()
    created = in_threads(list(range(1, num + 1)), lambda index, stop: create_one(driver, image, index))
    records += [record for _, record in created]
    phases["create"] = time.perf_counter() - started
    boxes = [(index, sandbox_id) for index, (sandbox_id, _) in enumerate(created, start=1) if sandbox_id]
    try:
        started = time.perf_counter()

        def run(box: tuple[int, str], stop: threading.Event) -> list[Record]:
            if look_up:
                with contextlib.suppress(Exception):  # untimed, as published; the commands show a failure
                    driver.look_up(box[1])
            return exec_all(driver, box[1], box[0], stop)

        records += [record for batch in in_threads(boxes, run) for record in batch]
        phases["exec"] = time.perf_counter() - started
    finally:
        started = time.perf_counter()
        records += in_threads(boxes, lambda box, stop: delete_one(driver, box[1], box[0], look_up))
        phases["delete"] = time.perf_counter() - started
    return records, phases


@dataclass
class ClientResult:
    """One client's run of the workload."""

    client: str
    num: int
    wall_s: float
    records: list[Record]
    phases: dict[str, float]
    counters: dict[str, int]

    def durations(self, prefix: str) -> list[float]:
        return sorted(r.duration_ms for r in self.records if r.operation.startswith(prefix) and r.success)

    def successes(self, prefix: str) -> int:
        return sum(r.success for r in self.records if r.operation.startswith(prefix))

    @property
    def success_rate(self) -> float:
        return sum(r.success for r in self.records) / (self.num * (len(COMMANDS) + 2))

    def failures(self) -> list[str]:
        return [f"{r.operation} #{r.sandbox_index}: {r.error}" for r in self.records if not r.success]

    def summary(self) -> dict[str, Any]:
        execs = self.durations("exec")
        return {
            "client": self.client,
            "wall_s": self.wall_s,
            "creates_ok": self.successes("create"),
            "execs_ok": self.successes("exec"),
            "deletes_ok": self.successes("delete"),
            "creates_per_s": self.successes("create") / self.wall_s,
            "execs_per_s": self.successes("exec") / self.wall_s,
            "deletes_per_s": self.successes("delete") / self.wall_s,
            "create_p50_ms": percentile(self.durations("create"), 50),
            "exec_p50_ms": percentile(execs, 50),
            "exec_p90_ms": percentile(execs, 90),
            "exec_p99_ms": percentile(execs, 99),
            "delete_p50_ms": percentile(self.durations("delete"), 50),
            "success_rate": self.success_rate,
            "phases_s": self.phases,
            "counters": self.counters,
            "failures": self.failures()[:5],
        }


def percentile(ordered: list[float], p: float) -> float | None:
    """Linear interpolation between the closest ranks, as the published report computes it."""
    if not ordered:
        return None
    k = (len(ordered) - 1) * p / 100
    low, high = math.floor(k), math.ceil(k)
    return ordered[low] + (ordered[high] - ordered[low]) * (k - low)


def measure(name: str, url: str, api_key: str, image: str, num: int, is_phased: bool) -> ClientResult:
    """One client: a warm-up sandbox (not counted), then the workload; its sandboxes deleted whatever happens."""
    driver = make_driver(name, url, api_key)
    try:
        lifecycle(driver, image, 0, threading.Event())  # warm-up: connections, caches (not counted)
        warm_up = driver.counters()
        started = time.perf_counter()
        if is_phased:
            records, phases = phased(driver, image, num, look_up=name != "orchard")
        else:
            batches = in_threads(list(range(1, num + 1)), lambda index, stop: lifecycle(driver, image, index, stop))
            records, phases = [record for batch in batches for record in batch], {}
        wall_s = time.perf_counter() - started
    finally:
        driver.close()
    counters = {what: count - warm_up[what] for what, count in driver.counters().items()}
    return ClientResult(name, num, wall_s, records, phases, counters)


# -- the service --------------------------------------------------------------------------


@contextlib.contextmanager
def running_service(engine: docker.DockerClient) -> Iterator[tuple[str, str]]:
    """`orchard up` in a process and session of its own (Ctrl-C reaches only this script, which
    then stops it in order), on a free loopback port, with a throwaway ORCHARD_HOME: (url, key).
    Afterwards every container labelled with the service as owner is removed (a leak is raised)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = tempfile.mkdtemp(prefix="orchard-bench-")
    key = "bench-" + secrets.token_hex(8)
    env = {k: v for k, v in os.environ.items() if k not in ("ORCHARD_DB_URL", "ORCHARD_URL", "SANDBOX_BASE_URL")}
    env |= {"ORCHARD_HOME": home, "ORCHARD_API_KEY": key}
    argv = [sys.executable, "-m", "orchard.env.service", "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    owner = process_owner(process.pid)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(trust_env=False) as probe:
            while True:
                if process.poll() is not None:
                    raise SystemExit(f"the service did not start (exit status {process.returncode})")
                try:
                    probe.get(f"{url}/health", timeout=1)
                    break
                except httpx.HTTPError:
                    time.sleep(0.05)
        yield url, key
    finally:
        process.terminate()  # it deletes its sandboxes on the way out
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(home, ignore_errors=True)
        if left := sweep(engine, owner):
            raise RuntimeError(f"LEAKED: {left} sandbox container(s) of the service were still there (now removed)")


def sweep(engine: docker.DockerClient, owner: str) -> int:
    """Remove every sandbox container of `owner`; how many there were (0 when nothing leaked)."""
    leftovers = engine.containers.list(all=True, filters={"label": f"{LABEL_PREFIX}owner={owner}"})
    for container in leftovers:
        with contextlib.suppress(docker.errors.NotFound):  # removed meanwhile
            container.remove(force=True)
    return len(leftovers)


# -- report -----------------------------------------------------------------------------


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def print_table(results: list[ClientResult]) -> dict[str, float | None]:
    """The table, the failures and counters under it; returns each client's exec p50 over the baseline's."""
    baseline = next((r for r in results if r.client == BASELINE), None)
    base_p50 = percentile(baseline.durations("exec"), 50) if baseline else None
    ratios: dict[str, float | None] = {}
    head = f"{'client':<34}{'ok c/e/d':>12}{'success':>9}{'wall s':>8}{'creates/s':>10}{'create p50':>11}"
    print(f"\n{head}{'exec p50/p90/p99 ms':>22}{'deletes/s':>10}{'delete p50':>11}  exec p50 vs orchard SDK")
    for r in results:
        s = r.summary()
        p50 = s["exec_p50_ms"]
        ratios[r.client] = p50 / base_p50 if p50 is not None and base_p50 else None
        ratio = "-" if ratios[r.client] is None else f"{ratios[r.client]:.2f}x"
        counts = f"{s['creates_ok']}/{r.num} {s['execs_ok']}/{r.num * len(COMMANDS)} {s['deletes_ok']}/{r.num}"
        execs = f"{ms(p50)}/{ms(s['exec_p90_ms'])}/{ms(s['exec_p99_ms'])}"
        creates, deletes = f"{s['creates_per_s']:.2f}", f"{s['deletes_per_s']:.2f}"
        line = f"{CLIENTS[r.client]:<34}{counts:>12}{s['success_rate']:>9.0%}{r.wall_s:>8.2f}{creates:>10}"
        print(f"{line}{ms(s['create_p50_ms']):>11}{execs:>22}{deletes:>10}{ms(s['delete_p50_ms']):>11}  {ratio}")
    for r in results:
        notes = [f"{what} {count}" for what, count in r.counters.items() if count]
        notes += [f"{phase} phase {seconds:.2f} s" for phase, seconds in r.phases.items()]
        failures = r.failures()
        if failures:
            notes.append(f"{len(failures)} failed, first: {failures[0]}")
        if notes:
            print(f"  {r.client}: " + "; ".join(notes))
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num", type=int, default=8, help="sandboxes at once (the published default is 10)")
    parser.add_argument("--image", default=BASE_IMAGE)
    parser.add_argument("--phased", action="store_true", help="create all, then exec all, then delete all")
    parser.add_argument(
        "--clients", nargs="+", choices=list(CLIENTS), default=list(CLIENTS), help="which clients, in this order"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures and every operation's record")
    args = parser.parse_args()
    if args.num < 1:
        parser.error("--num must be at least 1")
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # unwind: delete everything

    engine = docker.from_env(timeout=300)
    engine.images.get(args.image)  # fails now, clearly, when the image is missing
    results: list[ClientResult] = []
    mode = "phased" if args.phased else "interleaved"
    try:
        with running_service(engine) as (url, key):
            for name in dict.fromkeys(args.clients):  # each client once
                print(f"{CLIENTS[name]}: {args.num} sandboxes, {mode} ...", flush=True)
                result = measure(name, url, key, args.image, args.num, args.phased)
                print(f"  done in {result.wall_s:.2f} s, success {result.success_rate:.0%}", flush=True)
                results.append(result)
    except KeyboardInterrupt:
        raise SystemExit("interrupted; every sandbox made so far is deleted") from None
    except RuntimeError as exc:
        if str(exc).startswith("LEAKED"):
            print(exc, file=sys.stderr)
            raise SystemExit(1) from None
        raise
    finally:
        engine.close()
    print(f"\n{args.num} sandboxes, {mode}, image {args.image}, {os.cpu_count()} CPUs; each client after one warm-up")
    ratios = print_table(results)
    summaries = [r.summary() for r in results]
    config = {"num": args.num, "image": args.image, "phased": args.phased, "clients": args.clients}
    run_id = record_bench("env-concurrency", config, {"clients": summaries, "exec_p50_vs_orchard": ratios})
    print(f"recorded as run {run_id}")
    if args.json:
        document = {
            **config,
            "cpus": os.cpu_count(),
            "exec_p50_vs_orchard": ratios,
            "clients": [
                {**s, "records": [asdict(rec) for rec in r.records]} for s, r in zip(summaries, results, strict=True)
            ],
        }
        with open(args.json, "w") as f:
            json.dump(document, f, indent=2)


if __name__ == "__main__":
    main()
