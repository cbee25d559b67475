"""The Kubernetes backend end to end: a real kube-apiserver (the `kube` fixture), the test kubelet
running the Pods with Docker (tests/kube/kubelet.py), and the manager on top, as the SDK uses it.

A sandbox is created (its Pod checked: the policies, no token), reached at its Pod IP with its
token, listed, and deleted; every manifest passes the API server's own validation (a dry run);
failures (an image that cannot be pulled, a Pod no node takes) fail at once with their reason;
an API server restarted mid-run loses no sandbox and the watch resumes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubelet import _Api, pod_path

from orchard.env import images
from orchard.env.backends.base import make_spec
from orchard.env.backends.kubernetes import KubernetesConfig
from orchard.env.calls import AgentCalls, send
from orchard.env.manager import SandboxManager, agent_http
from orchard.errors import SandboxError
from orchard.store import Store


@pytest.fixture(scope="module")
def agent_image(docker_client) -> str:
    """The injector image, built offline once (`orchard image build-agent`)."""
    return images.build_agent()


@pytest.fixture
def manager(kube, namespace, kubelet, agent_image, tmp_path: Path) -> Iterator[SandboxManager]:
    config = KubernetesConfig(kubeconfig=kube.kubeconfig, namespace=namespace, unschedulable_grace=0)
    store = Store.open(f"sqlite:///{tmp_path / 'orchard.db'}")
    with SandboxManager(config, store=store, reap_interval=None) as running:
        yield running


def _gone(api: _Api, namespace: str, name: str, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            api.call("GET", pod_path(namespace, name))
        except Exception as exc:  # the kubelet module's ApiError: 404 once the Pod is gone
            if getattr(exc, "status", None) == 404:
                return True
            raise
        time.sleep(0.1)
    return False


def test_create_exec_list_delete_at_the_pod_ip(manager, api, namespace, kubelet, base_image) -> None:
    spec = make_spec(
        base_image,
        cpu="500m",
        memory="512Mi",
        tmpfs={"/scratch": "16Mi"},
        env={"GREETING": "hi", "PRICE": "$(GREETING) $5"},
    )
    info = manager.create(spec, sandbox_id="e2e-1", timeout=120)
    assert info.ready and info.endpoint is not None
    assert info.endpoint.url.startswith("http://127.0.0.") and info.endpoint.url.endswith(":7000")

    with agent_http(info.endpoint, timeout=30) as http:
        result = send(
            http, AgentCalls().exec("echo $GREETING; pwd; grep CapEff /proc/self/status; df /scratch; echo $PRICE")
        )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[:2] == ["hi", "/workspace"]
    assert lines[2].split()[1] == "0000000000000000"  # every capability dropped
    assert "tmpfs" in result.stdout
    assert lines[-1] == "$(GREETING) $5"  # as given: Kubernetes' $(VAR) expansion escaped

    pod = api.call("GET", pod_path(namespace, "orchard-e2e-1"))
    assert info.endpoint.token not in json.dumps(pod)  # only its SHA-256 is in the Pod
    assert pod["metadata"]["annotations"]["orchard.sandbox/owner"] == manager.owner
    [found] = manager.backend.list()
    assert (found.sandbox_id, found.owner) == ("e2e-1", manager.owner)
    assert found.expires_at > time.time()

    manager.delete("e2e-1")
    assert _gone(api, namespace, "orchard-e2e-1")
    assert manager.backend.state("e2e-1").exists is False
    assert manager.backend.list() == []


def test_every_manifest_passes_the_api_servers_validation(manager) -> None:
    backend = manager.backend
    for spec in (
        make_spec("busybox"),
        make_spec("python:3.11", network="open", cpu=2, memory="1Gi", disk="10Gi", tmpfs={"/tmp": "1Gi"}, run_id="r-1"),
        make_spec("busybox", network="dropped", cpu="100m", run_id="not a label value: /"),
    ):
        stored = backend.dry_run("dry-1", spec)
        assert stored["metadata"]["name"] == "orchard-dry-1"
        assert stored["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert backend.list() == []  # a dry run stores nothing


def test_an_image_that_cannot_be_pulled_fails_at_once_and_leaves_nothing(manager, api, namespace) -> None:
    started = time.monotonic()
    with pytest.raises(SandboxError, match="ErrImagePull"):
        manager.create(make_spec("orchard/no-such-image:0"), sandbox_id="e2e-pull", timeout=120)
    assert time.monotonic() - started < 30
    assert _gone(api, namespace, "orchard-e2e-pull")


def test_a_pod_no_node_takes_fails_as_unschedulable(
    kube, namespace, kubelet, agent_image, base_image, tmp_path
) -> None:
    config = KubernetesConfig(
        kubeconfig=kube.kubeconfig, namespace=namespace, node_selector={"pool": "gpu"}, unschedulable_grace=0
    )
    store = Store.open(f"sqlite:///{tmp_path / 'o.db'}")
    with SandboxManager(config, store=store, reap_interval=None) as manager, pytest.raises(SandboxError) as failed:
        manager.create(make_spec(base_image), sandbox_id="e2e-nowhere", timeout=60)
    assert "cannot be scheduled" in str(failed.value)


def test_an_api_server_restart_loses_no_sandbox_and_the_watch_resumes(kube, manager, base_image) -> None:
    first = manager.create(make_spec(base_image), sandbox_id="e2e-before", timeout=120)
    kube.restart()
    assert first.endpoint is not None
    with agent_http(first.endpoint, timeout=30) as http:  # straight to the Pod: no API server on the way
        assert send(http, AgentCalls().exec("echo still")).stdout == "still\n"
    second = manager.create(make_spec(base_image), sandbox_id="e2e-after", timeout=120)  # seen by the resumed watch
    assert second.ready
    assert {s.sandbox_id for s in manager.backend.list()} == {"e2e-before", "e2e-after"}
