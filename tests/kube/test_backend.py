"""The Kubernetes backend end to end: a real kube-apiserver (the `kube` fixture), the test kubelet
running the Pods with Docker (tests/kube/kubelet.py), and the manager on top, as the SDK uses it.

A sandbox is created (its Pod checked: the policies, no token), reached at its Pod IP with its
token, listed, and deleted; every manifest passes the API server's own validation (a dry run);
failures (an image that cannot be pulled, a Pod no node takes) fail at once with their reason;
an API server restarted mid-run loses no sandbox and the watch resumes.
"""

from __future__ import annotations

import json
import shlex
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
        if not api.exists(pod_path(namespace, name)):
            return True
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


LOOPBACK_PROBE = """
import socket
try:
    socket.create_connection(("127.0.0.1", 7000), timeout=5).close()
    print("loopback reaches the agent")
except ConnectionRefusedError:
    print("loopback refused")
mine = socket.create_server(("127.0.0.1", 7000))  # the port on loopback is the sandbox's own
print("bound 127.0.0.1:7000")
for line in open("/proc/net/tcp").read().splitlines()[1:]:
    local, state = line.split()[1], line.split()[3]
    address, port = local.split(":")
    if state == "0A" and int(port, 16) == 7000:
        print("listening", socket.inet_ntoa(bytes.fromhex(address)[::-1]))
"""


def test_the_agent_listens_at_the_pod_ip_only_never_on_the_pods_loopback(manager, base_image) -> None:
    """The agent is reached at the Pod IP (the host's route, as ever), but a program in the Pod that
    dials 127.0.0.1:7000 is refused, and may listen there itself: the agent listens at the Pod's own
    address only (on the test kubelet, whose Pod IPs are forwarded from the host's loopback, the
    Pod's interface address, where that forward lands)."""
    info = manager.create(make_spec(base_image), sandbox_id="e2e-listen", timeout=120)
    assert info.endpoint is not None
    with agent_http(info.endpoint, timeout=30) as http:
        probe = send(http, AgentCalls().exec(f"python3 -c {shlex.quote(LOOPBACK_PROBE)}; hostname -i"))
        assert probe.exit_code == 0, probe.output
        assert send(http, AgentCalls().exec("echo still served")).stdout == "still served\n"
    lines = probe.stdout.splitlines()
    assert lines[:2] == ["loopback refused", "bound 127.0.0.1:7000"], probe.output
    interface = lines[-1].split()[0]
    assert sorted(lines[2:-1]) == sorted(["listening 127.0.0.1", f"listening {interface}"]), probe.output
    assert not interface.startswith("127.")
    manager.delete("e2e-listen")


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


def test_an_api_server_restart_loses_no_sandbox_and_the_watch_resumes(
    kube, manager, api, namespace, base_image
) -> None:
    """After a restart the API server's watch cache starts at etcd's revision then: the watch's last
    version is too old (410 Gone), so the cache lists anew, and resumes.

    Slow: it stops and restarts the real kube-apiserver, which takes seconds to serve again.
    """
    first = manager.create(make_spec(base_image), sandbox_id="e2e-before", timeout=120)
    cache = manager.backend._cache  # type: ignore[attr-defined]
    expired = cache.expired
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "not-a-pod"}}
    api.call("POST", f"/api/v1/namespaces/{namespace}/configmaps", body=other)  # etcd moves past the Pods' last version
    kube.restart()
    assert first.endpoint is not None
    with agent_http(first.endpoint, timeout=30) as http:  # straight to the Pod: no API server on the way
        assert send(http, AgentCalls().exec("echo still")).stdout == "still\n"
    second = manager.create(make_spec(base_image), sandbox_id="e2e-after", timeout=120)  # seen by the resumed watch
    assert second.ready
    assert {s.sandbox_id for s in manager.backend.list()} == {"e2e-before", "e2e-after"}
    assert cache.expired > expired  # the 410 was met, and the relist found both


def test_the_sdk_works_unchanged_on_kubernetes(kube, namespace, kubelet, agent_image, base_image, tmp_path) -> None:
    """The SDK over the Kubernetes backend: commands, sessions, files, folders and a terminal, all at
    the Pod IP, exactly as on Docker."""
    from orchard.env import Client

    config = KubernetesConfig(kubeconfig=kube.kubeconfig, namespace=namespace, unschedulable_grace=0)
    with Client(backend=config, store=Store.open(f"sqlite:///{tmp_path / 'sdk.db'}")) as client:
        box = client.create(base_image)
        assert box.exec("echo hi; id -u").stdout == "hi\n0\n"
        assert (
            box.exec("cd /tmp && X=1", session="s").ok and box.exec("pwd; echo $X", session="s").stdout == "/tmp\n1\n"
        )
        box.write_file("/tmp/data.bin", bytes(range(256)))
        assert box.read_file("/tmp/data.bin") == bytes(range(256))
        assert "data.bin" in [f.name for f in box.list_files("/tmp")]
        (tmp_path / "src" / "deep").mkdir(parents=True)
        (tmp_path / "src" / "deep" / "f.txt").write_text("folder upload")
        box.upload(tmp_path / "src", "/work")
        box.download("/work", tmp_path / "back")
        assert (tmp_path / "back" / "deep" / "f.txt").read_text() == "folder upload"
        with box.terminal(["sh", "-c", "tty -s && echo HAS_TTY; exit 7"]) as term:
            assert b"HAS_TTY" in term.read_until(b"HAS_TTY")
            assert term.wait() == 7
        box.delete()
    assert _gone(_Api(kube.client()), namespace, f"orchard-{box.id}")


def test_orchard_eval_through_a_service_on_kubernetes(
    kube, api, namespace, kubelet, agent_image, example_repos, start_service, orchard_home, monkeypatch, tmp_path
) -> None:
    """`orchard up --backend kubernetes` (the service over this backend) and `orchard eval` of two
    example tasks through it, unchanged: every episode and every grade in a Pod of its own.

    Slow: a real eval through a service on the kube-apiserver, its Pods run by the test kubelet.
    """
    from typer.testing import CliRunner

    from orchard.cli import app

    tasks = Path(__file__).parents[2] / "examples" / "tasks" / "tasks.jsonl"
    config = KubernetesConfig(kubeconfig=kube.kubeconfig, namespace=namespace, unschedulable_grace=0)
    with start_service(tmp_path / "service.db", backend=config) as (url, key):
        monkeypatch.setenv("ORCHARD_URL", url)
        monkeypatch.setenv("ORCHARD_API_KEY", key)
        ids = "orchard-examples__timecalc-1,orchard-examples__inventory-1"
        args = ["eval", "--tasks", str(tasks), "--repos", str(example_repos), "--ids", ids, "--predictions", "gold"]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        assert "2/2" in result.output and "resolved 2" in result.output
    deadline = time.monotonic() + 30
    while api.call("GET", f"/api/v1/namespaces/{namespace}/pods")["items"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert api.call("GET", f"/api/v1/namespaces/{namespace}/pods")["items"] == []  # every Pod deleted
