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


KILLED_OWNER = """
import sys, time
from dataclasses import replace
from orchard.env.backends.base import make_spec
from orchard.env.backends.kubernetes import KubernetesConfig
from orchard.process import process_owner

backend = KubernetesConfig(kubeconfig=sys.argv[1], namespace=sys.argv[2]).build()  # the default 40 s Lease
backend.create("killed-1", replace(make_spec("orchard/base:bookworm"), owner=process_owner()), "token")
print(process_owner(), flush=True)
time.sleep(600)
"""


def test_a_manager_starting_after_an_owner_of_this_host_was_killed_sweeps_its_lease(
    kube, namespace, api, tmp_path: Path
) -> None:
    """An owner of this host SIGKILLed (no goodbye: its Lease stays, renewed a moment ago, and its
    Pod names it). The next manager to start reaps the Pod (its owner's process is gone) and sweeps
    the Lease at once: neither waiting out the Lease (2 x 40 s) nor needing a second round."""
    owner = subprocess.Popen(
        [sys.executable, "-c", KILLED_OWNER, kube.kubeconfig, namespace], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        name = owner.stdout.readline().strip()
        lease = _lease_path(namespace, name)
        assert api.exists(lease) and api.exists(pod_path(namespace, "orchard-killed-1"))
    finally:
        owner.kill()
        owner.wait()
    config = KubernetesConfig(kubeconfig=kube.kubeconfig, namespace=namespace)
    store = Store.open(f"sqlite:///{tmp_path / 'orchard.db'}")
    with SandboxManager(config, store=store, reap_interval=None) as manager:
        assert manager.reaped_at_start == ["killed-1"]
        assert not api.exists(lease), "the killed owner's Lease outlived the first reaping round"
        assert manager.backend.list() == []  # its Pod is going (the watch may not have said so yet)


def test_orchard_down_after_a_kubernetes_service_was_killed_reaps_its_pods_and_its_lease(
    kube, namespace, api, orchard_home
) -> None:
    """`orchard up --backend kubernetes`, a sandbox created through it, then the service SIGKILLed:
    `orchard down` has no service to stop, but reaps what it left in the cluster, its Pod and its
    owner's Lease (nothing else would: no manager runs).

    Slow: a real `orchard up` service process on the kube-apiserver, killed, then `orchard down`.
    """
    import contextlib
    import os
    import signal

    import httpx
    from typer.testing import CliRunner

    from orchard.cli import app
    from orchard.env.discovery import read_state
    from orchard.process import process_alive, process_owner

    runner = CliRunner()
    _up_on_kubernetes(runner, kube, namespace)
    state = read_state()
    assert state is not None
    try:
        created = httpx.post(
            f"{state['url']}/sandboxes",
            json={"image": "orchard/base:bookworm"},
            headers={"X-API-Key": state["api_key"]},
        )
        assert created.status_code == 200, created.text
        pod = f"orchard-{created.json()['sandbox_id']}"
        lease = _lease_path(namespace, process_owner(state["pid"]))
        assert api.exists(pod_path(namespace, pod)) and api.exists(lease)
    finally:
        os.kill(state["pid"], signal.SIGKILL)  # no goodbye: its Pod and its Lease stay
    with contextlib.suppress(ChildProcessError):  # `orchard up` here made it this process's child: reap it
        os.waitpid(state["pid"], 0)
    assert not process_alive(state["pid"])
    stopped = runner.invoke(app, ["down"])
    assert stopped.exit_code == 0 and "1 leftover sandbox(es) removed" in stopped.stdout, stopped.output
    assert not api.exists(lease)
    _eventually(lambda: not api.exists(pod_path(namespace, pod)), 30, "the leftover stayed")
    assert "no Orchard service is running" in runner.invoke(app, ["down"]).stdout  # the state file is gone too


def _up_on_kubernetes(runner, kube, namespace: str) -> int:
    """`orchard up --backend kubernetes` in the background on a free loopback port; the port."""
    import socket

    from orchard.cli import app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    up = ["up", "--backend", "kubernetes", "--kubeconfig", kube.kubeconfig, "--namespace", namespace]
    started = runner.invoke(app, [*up, "--port", str(port)])
    assert started.exit_code == 0, started.output
    return port


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

    from typer.testing import CliRunner

    from orchard.cli import app

    runner = CliRunner()
    port = _up_on_kubernetes(runner, kube, namespace)
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
