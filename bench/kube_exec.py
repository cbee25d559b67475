"""With real containers: N sandbox Pods through the test fixture, and exec at the Pod IP beside `docker exec`.

    .venv/bin/python bench/kube_exec.py [--n 50] [--rounds 10] [--workers 8] [--json PATH]

Not a test: it prints figures. The tests' control plane (`tests/kube/cluster.py`: kube-apiserver
1.20.2 and etcd on loopback) and the test kubelet in its containers mode (`tests/kube/kubelet.py`:
each Pod's init container and main container run with Docker, the Pod at its own loopback address
127.0.0.N with the agent's port published there as its Pod IP).

1. `--n` sandboxes are created by `--workers` threads through `SandboxManager.create` over
   `KubernetesBackend`, the path `orchard up --backend kubernetes` takes: the Pod is created, the
   watch reports it Running with an IP and its container ready, and `wait_ready` has the agent
   answer its health check at the Pod IP. Measured: wall time from the first create until the last
   sandbox is ready, create-to-ready p50/p95 per sandbox, and the success rate.
2. In every ready sandbox, `--rounds` times (after one warm-up round), a trivial command (`true`)
   three ways, interleaved so that all three see the same load:
   * through the agent at the Pod IP: `AgentChannel` (`agent_http`, pooled keep-alive, the
     sandbox's token), the channel the manager and the embedded SDK use;
   * the Docker SDK's `exec_run(["bash", "-c", "true"])` into the Pod's main container (the agent
     runs a command as `bash -c`, so the same work; `sh -c` on an image without bash): the fair
     baseline, one HTTP API exchange to the engine with no process of its own;
   * the `docker exec <container> bash -c true` CLI, as mini-swe-agent runs commands: the same
     plus the start of a `docker` process.
   Printed: p50/p95 of each and the ratio of each `docker exec` p50 to the Pod-IP p50. Beside
   them, for reading the Pod-IP figure: the same agent at its container's own address on the
   kubelet's Docker network, skipping the `docker-proxy` that publishes the agent's port on
   127.0.0.N (a cluster's CNI routes to a Pod IP with no such proxy).
3. Every sandbox is deleted through the manager, then it checks that nothing is left: no Pod in
   the namespace and no container or volume of the test kubelet in Docker.

The image is orchard/base:bookworm (the tests' `base_image`) when Docker has it, else the static
busybox image (`orchard/busybox:static`, built offline). Exit status 0 only at 100 % success with
nothing left.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "kube"))

NAMESPACE = "orchard-bench-exec"


def p95(values: list[float]) -> float | None:
    """The 95th percentile, nearest rank (None when there is nothing)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] if ordered else None


def percentiles(seconds: list[float]) -> dict[str, float | None]:
    """p50 and p95 in milliseconds (None when nothing was measured)."""
    if not seconds:
        return {"p50_ms": None, "p95_ms": None}
    return {"p50_ms": statistics.median(seconds) * 1e3, "p95_ms": (p95(seconds) or 0) * 1e3}


def pick_image(docker_client) -> str:
    """orchard/base:bookworm if Docker has it, else the static busybox image (built offline if missing)."""
    import docker

    from orchard.config import BASE_IMAGE
    from orchard.env import images

    try:
        docker_client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        return images.build_busybox()
    return BASE_IMAGE


def create_all(manager, spec, n: int, workers: int, timeout: float) -> dict:
    """Create `n` sandboxes with `workers` threads, each until its agent answers at the Pod IP."""

    def one(index: int) -> tuple[str, bool, float, str]:
        sandbox_id = f"exec-{index}"
        started = time.monotonic()
        try:
            manager.create(spec, sandbox_id=sandbox_id, timeout=timeout)
        except Exception as exc:  # counted, never fatal
            return sandbox_id, False, time.monotonic() - started, f"{type(exc).__name__}: {exc}"
        return sandbox_id, True, time.monotonic() - started, ""

    started = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        outcomes = list(pool.map(one, range(n)))
    wall = time.monotonic() - started
    ready = [seconds for _, ok, seconds, _ in outcomes if ok]
    return {
        "n": n,
        "workers": workers,
        "wall_s": wall,
        "success": len(ready) / n,
        "ready_p50_s": statistics.median(ready) if ready else None,
        "ready_p95_s": p95(ready),
        "ready_ids": [sandbox_id for sandbox_id, ok, _, _ in outcomes if ok],
        "failures": [error for _, ok, _, error in outcomes if not ok][:5],
    }


def measure_exec(manager, kubelet, sandbox_ids: list[str], rounds: int) -> dict:
    """Exec latency of `true` at the Pod IP, by the Docker SDK and by the docker CLI, interleaved."""
    from orchard.env.backends.base import AgentEndpoint
    from orchard.env.backends.kubernetes import AGENT_PORT, pod_name
    from orchard.env.calls import AgentCalls, send
    from orchard.env.manager import agent_http

    targets = []
    for sandbox_id in sandbox_ids:
        info = manager.get(sandbox_id)
        [main] = [
            c for c in kubelet.containers(pod_name(sandbox_id)) if c.labels.get("orchard.test-kubelet/kind") == "main"
        ]
        shell = "bash" if main.exec_run(["test", "-x", "/bin/bash"]).exit_code == 0 else "sh"
        [network] = main.attrs["NetworkSettings"]["Networks"].values()
        bridge = AgentEndpoint(token=info.endpoint.token, url=f"http://{network['IPAddress']}:{AGENT_PORT}")
        targets.append(((agent_http(info.endpoint, timeout=30), agent_http(bridge, timeout=30)), main, shell))
    call = AgentCalls().exec("true")

    def pod_ip(channels, _container, _shell) -> None:
        result = send(channels[0], call)
        if result.exit_code != 0:
            raise RuntimeError(f"`true` at the Pod IP: {result}")

    def bridge_ip(channels, _container, _shell) -> None:
        result = send(channels[1], call)
        if result.exit_code != 0:
            raise RuntimeError(f"`true` at the container's own address: {result}")

    def docker_sdk(_channel, container, shell) -> None:
        if container.exec_run([shell, "-c", "true"]).exit_code != 0:
            raise RuntimeError("`true` by exec_run failed")

    def docker_cli(_channel, container, shell) -> None:
        subprocess.run(["docker", "exec", container.id, shell, "-c", "true"], stdout=subprocess.DEVNULL, check=True)

    paths = {"pod_ip": pod_ip, "bridge_ip": bridge_ip, "docker_sdk": docker_sdk, "docker_cli": docker_cli}
    timings: dict[str, list[float]] = {name: [] for name in paths}
    try:
        for round_number in range(rounds + 1):  # round 0 warms up: connections, the engine's caches
            for target in targets:
                for name, run in paths.items():
                    started = time.perf_counter()
                    run(*target)
                    if round_number:
                        timings[name].append(time.perf_counter() - started)
    finally:
        for channels, _, _ in targets:
            for channel in channels:
                channel.close()
    return {name: {"count": len(values), **percentiles(values)} for name, values in timings.items()}


def delete_all(manager, kubelet, core, sandbox_ids: list[str], workers: int) -> dict:
    """Delete every sandbox through the manager, then wait (up to 60 s) until nothing of them is left."""
    started = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(manager.delete, sandbox_ids))
    import docker

    deadline = time.monotonic() + 60
    while True:
        pods = [p.metadata.name for p in core.list_namespaced_pod(NAMESPACE).items]
        leftovers = ["(not looked at yet)"]
        if not pods:  # the kubelet deletes a Pod once its containers and volumes are gone
            with contextlib.suppress(docker.errors.NotFound):  # one removed while Docker listed them
                leftovers = kubelet.leftovers()
        if (not pods and not leftovers) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return {"wall_s": time.monotonic() - started, "pods_left": pods, "docker_left": leftovers}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50, help="Sandboxes (Pods with real containers).")
    parser.add_argument("--rounds", type=int, default=10, help="Commands per path per sandbox (after one warm-up).")
    parser.add_argument("--workers", type=int, default=8, help="Threads creating and deleting sandboxes.")
    parser.add_argument("--timeout", type=float, default=180.0, help="Seconds a sandbox may take to be ready.")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import docker
    from cluster import start_cluster
    from kubelet import TestKubelet
    from kubernetes import client

    from orchard.env import images
    from orchard.env.backends.base import make_spec
    from orchard.env.backends.kubernetes import KubernetesConfig
    from orchard.env.manager import SandboxManager
    from orchard.store import Store

    docker_client = docker.from_env(timeout=120)
    image = pick_image(docker_client)
    images.build_agent()  # the injector image the Pods' init container runs (reused when current)
    with tempfile.TemporaryDirectory(prefix="orchard-kube-exec-") as folder, start_cluster(Path(folder)) as cluster:
        core = client.CoreV1Api(cluster.client())
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
        config = KubernetesConfig(kubeconfig=cluster.kubeconfig, namespace=NAMESPACE, unschedulable_grace=0)
        store = Store.open(f"sqlite:///{Path(folder) / 'orchard.db'}")
        with (
            TestKubelet(cluster.client(), docker_client, namespace=NAMESPACE, mode="containers") as kubelet,
            SandboxManager(config, store=store, reap_interval=None) as manager,
        ):
            created = create_all(manager, make_spec(image), args.n, args.workers, args.timeout)
            ids = created.pop("ready_ids")
            try:
                latency = measure_exec(manager, kubelet, ids, args.rounds)
            finally:
                deleted = delete_all(manager, kubelet, core, [s.sandbox_id for s in manager.list()], args.workers)
            kubelet_errors = list(kubelet.errors)
    docker_client.close()

    pod_ip = latency["pod_ip"]["p50_ms"] or float("nan")
    print(
        f"kube-apiserver 1.20.2 + etcd on loopback, test kubelet in containers mode (Docker), "
        f"image {image}, {args.workers} workers"
    )
    print(
        f"create -> ready (agent health check at the Pod IP): {args.n} sandboxes, wall {created['wall_s']:.1f} s, "
        f"success {created['success']:.1%}, per sandbox p50 {created['ready_p50_s'] or 0:.2f} s "
        f"p95 {created['ready_p95_s'] or 0:.2f} s"
    )
    for failure in created["failures"]:
        print(f"  failed: {failure}")
    print(f"exec `true`, {len(ids)} sandboxes x {args.rounds} rounds, p50 / p95 ms:")
    for name, label in (
        ("pod_ip", "agent at the Pod IP (AgentChannel, keep-alive)"),
        ("bridge_ip", "  the same, container address (no docker-proxy)"),
        ("docker_sdk", "Docker SDK exec_run, same container"),
        ("docker_cli", "docker exec CLI, same container"),
    ):
        figures = latency[name]
        ratio = "" if name.endswith("_ip") else f"  {(figures['p50_ms'] or 0) / pod_ip:5.1f}x the Pod-IP p50"
        print(f"  {label:<48} {figures['p50_ms'] or 0:7.2f} / {figures['p95_ms'] or 0:7.2f}{ratio}")
    left = deleted["pods_left"] + deleted["docker_left"]
    print(
        f"deleted {len(ids)}: wall {deleted['wall_s']:.1f} s; left behind: "
        + (", ".join(left) if left else "nothing (no Pod, no container, no volume)")
    )
    if kubelet_errors:
        print(f"test kubelet errors: {kubelet_errors[:3]}")
    if args.json:
        figures = {"image": image, "create": created, "exec": latency, "delete": deleted, "errors": kubelet_errors}
        args.json.write_text(json.dumps(figures, indent=2))
    return 0 if created["success"] == 1.0 and not left and not kubelet_errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
