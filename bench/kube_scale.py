"""The control plane at scale: N sandbox Pods created, running and deleted against a real kube-apiserver.

    .venv/bin/python bench/kube_scale.py [--n 1000] [--workers 32] [--json PATH]

Not a test: it prints figures. The paper's figure for a real cluster is 1,000 sandboxes in 26 s at
100 % success; this runs the same count against the tests' control plane (`tests/kube/cluster.py`:
kube-apiserver 1.20.2 and etcd on loopback) with the test kubelet in its status-only mode (it binds
each Pod and reports it Running and Ready at a fake address at once: no containers, so what is
measured is the API server, the watch and the backend, not a container runtime).

Each of `--workers` threads takes sandbox ids from a queue and, through `KubernetesBackend` (the
same calls `orchard up --backend kubernetes` makes), creates the Pod, waits until its state says
running with an address (the backend's watch cache; `wait_for_change`, no polling), and deletes it.
Measured: wall time from the first create to the last delete, creates/s, ready p50/p95 (create
until running), and the success rate (a sandbox succeeds when all three steps did). The same
backend call with 1 worker on 50 sandboxes is the baseline the ratio is against (its per-sandbox
time; the ratio says what concurrency buys). No agent runs, so `wait_ready`'s health check is
left out; every address is on loopback and nothing listens there.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kube"))

NAMESPACE = "orchard-bench"


def one(backend, sandbox_id: str, spec, timeout: float) -> tuple[bool, float, str]:
    """Create, wait until running, delete: (ok, seconds until running, error)."""
    started = time.monotonic()
    try:
        backend.create(sandbox_id, spec, "bench-token")
        deadline = started + timeout
        state = backend.state(sandbox_id)
        while not state.running:
            if not (state.starting or state.exists) or time.monotonic() > deadline:
                raise RuntimeError(state.message or "not running in time")
            backend.wait_for_change(sandbox_id, state, max(0.0, deadline - time.monotonic()))
            state = backend.state(sandbox_id)
        ready = time.monotonic() - started
        backend.delete(sandbox_id, spec.owner)
        return True, ready, ""
    except Exception as exc:  # counted, never fatal
        return False, time.monotonic() - started, f"{type(exc).__name__}: {exc}"


def run(backend, n: int, workers: int, prefix: str, spec, timeout: float) -> dict:
    ids: queue.Queue[str] = queue.Queue()
    for index in range(n):
        ids.put(f"{prefix}-{index}")
    results: list[tuple[bool, float, str]] = []
    lock = threading.Lock()

    def work() -> None:
        while True:
            try:
                sandbox_id = ids.get_nowait()
            except queue.Empty:
                return
            outcome = one(backend, sandbox_id, spec, timeout)
            with lock:
                results.append(outcome)

    started = time.monotonic()
    threads = [threading.Thread(target=work) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - started
    ready = sorted(seconds for ok, seconds, _ in results if ok)
    failures = [error for ok, _, error in results if not ok]
    return {
        "n": n,
        "workers": workers,
        "wall_s": wall,
        "creates_per_s": len(ready) / wall,
        "success": len(ready) / n,
        "ready_p50_s": statistics.median(ready) if ready else None,
        "ready_p95_s": ready[int(0.95 * (len(ready) - 1))] if ready else None,
        "failures": failures[:5],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=120.0, help="Seconds a Pod may take to run.")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from cluster import start_cluster
    from kubelet import TestKubelet
    from kubernetes import client

    from orchard.env.backends.base import make_spec
    from orchard.env.backends.kubernetes import KubernetesConfig

    with tempfile.TemporaryDirectory(prefix="orchard-kube-bench-") as folder, start_cluster(Path(folder)) as cluster:
        client.CoreV1Api(cluster.client()).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE))
        )
        spec = make_spec("orchard/base:bookworm", cpu="100m", memory="64Mi")
        config = KubernetesConfig(kubeconfig=str(cluster.kubeconfig), namespace=NAMESPACE, api_concurrency=args.workers)
        with TestKubelet(cluster.client(), namespace=NAMESPACE, mode="status-only", workers=16):
            backend = config.build()
            try:
                baseline = run(backend, 50, 1, "base", spec, args.timeout)
                scaled = run(backend, args.n, args.workers, "scale", spec, args.timeout)
            finally:
                backend.close()
    per_sandbox = baseline["wall_s"] / baseline["n"]
    print(f"kube-apiserver 1.20.2 + etcd on loopback, test kubelet in status-only mode, {args.workers} workers")
    for name, figures in (("baseline, 1 worker", baseline), (f"{args.n} sandboxes", scaled)):
        print(
            f"{name:>22}: wall {figures['wall_s']:.1f} s, {figures['creates_per_s']:.1f} sandboxes/s, "
            f"success {figures['success']:.1%}, ready p50 {figures['ready_p50_s'] or 0:.3f} s "
            f"p95 {figures['ready_p95_s'] or 0:.3f} s"
        )
        for failure in figures["failures"]:
            print(f"{'':>24}failed: {failure}")
    print(
        f"speed-up over one worker: {per_sandbox * args.n / scaled['wall_s']:.1f}x (paper: 1,000 in 26 s on a cluster)"
    )
    if args.json:
        args.json.write_text(json.dumps({"baseline": baseline, "scaled": scaled}, indent=2))
    return 0 if scaled["success"] == 1.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
