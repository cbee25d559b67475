"""Owners' Leases on the real API server: a sandbox whose owner lives on another host (where no
process check can reach) is reaped by any other owner once the owner's Lease lapses, and not while
the owner renews it; an owner that closes gives its Lease up; lapsed Leases are swept.

No kubelet runs here: the Pods stay Pending, which is all reaping looks at.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from kubelet import pod_path

from orchard.env.backends.kubernetes import KubernetesConfig, lease_name
from orchard.env.manager import SandboxManager
from orchard.store import Store

LEASE = 4.0
OTHER_HOST_OWNER = "another-host:4242:99"
"""An owner on another host: `owner_alive` cannot tell whether it runs, so only its Lease can."""

OWNER = f"""
import sys, time
from dataclasses import replace
from orchard.env.backends.base import make_spec
from orchard.env.backends.kubernetes import KubernetesConfig

config = KubernetesConfig(kubeconfig=sys.argv[1], namespace=sys.argv[2], owner_lease={LEASE})
backend = config.build()
backend.create("orphan-1", replace(make_spec("orchard/base:bookworm"), owner={OTHER_HOST_OWNER!r}), "token")
print("created", flush=True)
time.sleep(600)
"""


def _lease_path(namespace: str, owner: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease_name(owner)}"


def _eventually(check, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.25)


def test_a_killed_owners_sandbox_is_reaped_once_its_lease_lapses_and_not_before(
    kube, namespace, api, tmp_path: Path
) -> None:
    """Slow: it waits out a real lease, checking the sandbox is kept until then."""
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, kube.kubeconfig, namespace], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline() == "created\n"
        config = KubernetesConfig(kubeconfig=kube.kubeconfig, namespace=namespace, owner_lease=LEASE)
        store = Store.open(f"sqlite:///{tmp_path / 'orchard.db'}")
        with SandboxManager(config, store=store, reap_interval=None) as other:
            assert other.reaped_at_start == []
            time.sleep(LEASE * 1.5)  # longer than the Lease: only renewals keep it
            assert other.reap() == [] and api.exists(pod_path(namespace, "orchard-orphan-1"))

            owner.kill()  # as a lost host would: no goodbye
            owner.wait()
            reaped: list[str] = []
            _eventually(lambda: bool(reaped.extend(other.reap()) or reaped), LEASE * 4, "the orphan was not reaped")
            assert reaped == ["orphan-1"]
            _eventually(lambda: not api.exists(pod_path(namespace, "orchard-orphan-1")), 30, "its Pod stayed")
            lease = _lease_path(namespace, OTHER_HOST_OWNER)
            _eventually(lambda: other.reap() == [] and not api.exists(lease), LEASE * 4, "its Lease was not swept")
    finally:
        owner.kill()
        owner.wait()


def test_an_owner_that_closes_gives_up_its_lease_and_a_fleet_holds_none(kube, namespace, api) -> None:
    from dataclasses import replace

    from orchard.env.backends.base import make_spec

    backend = KubernetesConfig(kubeconfig=kube.kubeconfig, namespace=namespace, owner_lease=LEASE).build()
    try:
        backend.create("closing-1", replace(make_spec("orchard/base:bookworm"), owner=OTHER_HOST_OWNER), "token")
        backend.create("fleet-1", replace(make_spec("orchard/base:bookworm"), owner="fleet:lab"), "token")
        pods = {p["metadata"]["name"]: p for p in api.call("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]}
        annotations = {name: pod["metadata"]["annotations"] for name, pod in pods.items()}
        assert annotations["orchard-closing-1"]["orchard.sandbox/lease"] == lease_name(OTHER_HOST_OWNER)
        assert "orchard.sandbox/lease" not in annotations["orchard-fleet-1"]
        assert api.exists(_lease_path(namespace, OTHER_HOST_OWNER))
        assert not api.exists(_lease_path(namespace, "fleet:lab"))
        for sandbox_id, owner in (("closing-1", OTHER_HOST_OWNER), ("fleet-1", "fleet:lab")):
            backend.delete(sandbox_id, owner)
    finally:
        backend.close()
    assert not api.exists(_lease_path(namespace, OTHER_HOST_OWNER))


LEFTOVER = """
import sys
from orchard.env.backends.base import make_spec
from orchard.env.backends.kubernetes import KubernetesConfig
from orchard.process import process_owner
from dataclasses import replace

backend = KubernetesConfig(kubeconfig=sys.argv[1], namespace=sys.argv[2]).build()
backend.create("leftover-1", replace(make_spec("orchard/base:bookworm"), owner=process_owner()), "token")
"""


def test_orchard_down_reaps_a_kubernetes_services_leftovers_in_its_cluster(kube, namespace, api, orchard_home) -> None:
    """`orchard up --backend kubernetes` in the background, then `orchard down`: what dead owners of
    this host left in the cluster is reaped there (not in the local Docker engine), and `orchard
    status` names the backend."""
    import socket

    from typer.testing import CliRunner

    from orchard.cli import app

    runner = CliRunner()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    up = ["up", "--backend", "kubernetes", "--kubeconfig", kube.kubeconfig, "--namespace", namespace]
    started = runner.invoke(app, [*up, "--port", str(port)])
    assert started.exit_code == 0, started.output
    try:
        subprocess.run([sys.executable, "-c", LEFTOVER, kube.kubeconfig, namespace], check=True)  # it exits: an orphan
        assert api.exists(pod_path(namespace, "orchard-leftover-1"))
        status = runner.invoke(app, ["status"])
        assert f"http://127.0.0.1:{port} (pid" in status.stdout and "kubernetes), 0 sandbox(es)" in status.stdout
    finally:
        stopped = runner.invoke(app, ["down"])
    assert stopped.exit_code == 0 and "1 leftover sandbox(es) removed" in stopped.stdout, stopped.output
    _eventually(lambda: not api.exists(pod_path(namespace, "orchard-leftover-1")), 30, "the leftover stayed")


def test_an_owner_whose_clock_is_an_hour_behind_is_not_taken_for_dead(
    kube, namespace, api, tmp_path, monkeypatch
) -> None:
    """Lease silence is timed on the reader's clock: an owner renewing with times an hour old (its
    clock behind) keeps its Pods; once it closes (its Lease deleted) they are reaped.

    Slow: a lease is waited out to show that an owner an hour behind is not taken for dead.
    """
    from dataclasses import replace

    from orchard.env.backends import kubernetes
    from orchard.env.backends.base import make_spec

    true_time = kubernetes._micro_time
    monkeypatch.setattr(kubernetes, "_micro_time", lambda seconds: true_time(seconds - 3600))
    config = KubernetesConfig(kubeconfig=kube.kubeconfig, namespace=namespace, owner_lease=LEASE)
    skewed = config.build()
    try:
        skewed.create("skewed-1", replace(make_spec("orchard/base:bookworm"), owner=OTHER_HOST_OWNER), "token")
        store = Store.open(f"sqlite:///{tmp_path / 'orchard.db'}")
        with SandboxManager(config, store=store, reap_interval=None) as other:
            deadline = time.monotonic() + LEASE * 2.5
            while time.monotonic() < deadline:  # its renewTime is an hour old, but it keeps changing
                assert other.reap() == []
                time.sleep(LEASE / 4)
            skewed.close()  # gives its Lease up: its Pod is an orphan now
            reaped: list[str] = []
            _eventually(lambda: bool(reaped.extend(other.reap()) or reaped), LEASE * 2, "the orphan was not reaped")
            assert reaped == ["skewed-1"]
    finally:
        skewed.close()
