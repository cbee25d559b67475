"""The Kubernetes backend's parts that need no API server: the Pod it sends, how it reads a Pod's
status, its config and its errors; the agent started with the token's SHA-256 as a Pod starts it
(a real agent process on loopback TCP); and the manager resolving an agent's address from a
backend's state, with a real agent process behind a backend that starts it the way a Pod does."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from orchard.env.backends import backend_config
from orchard.env.backends.base import AgentEndpoint, BackendSandbox, SandboxSpec, SandboxState, make_spec
from orchard.env.backends.kubernetes import (
    AGENT_MOUNT,
    INJECT_COMMAND,
    KubernetesConfig,
    Toleration,
    pod_manifest,
    pod_state,
)
from orchard.env.bundle import build_bundle
from orchard.env.calls import split_exec_answer
from orchard.env.manager import SandboxManager
from orchard.errors import ConfigError, EngineUnavailable, SandboxError
from orchard.store import Store

SERVER = Path(__file__).resolve().parents[2] / "orchard" / "env" / "agent" / "__main__.py"
TOKEN = "k8s-test-token-" + "x" * 16
SECURE = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


@pytest.fixture(scope="module")
def bundle():
    return build_bundle()


def manifest_of(spec: SandboxSpec, bundle, **config) -> dict:
    return pod_manifest("box-1", spec, TOKEN, config=KubernetesConfig(**config), bundle=bundle, created=1700000000.5)


# -- the Pod ---------------------------------------------------------------------------------


def test_the_pod_has_the_policies_limits_labels_and_injection(bundle) -> None:
    spec = make_spec(
        "python:3.11-slim",
        network="open",
        cpu="500m",
        memory="1Gi",
        disk="2Gi",
        tmpfs={"/scratch": "64Mi", "/a": "1Mi"},
        ttl=600,
        env={"FOO": "bar", "PRICE": "$(FOO) is $5", "ORCHARD_AGENT_TOKEN": "planted"},
        run_id="eval-0123abcd",
    )
    spec = replace(spec, owner="host:42:777")
    pod = manifest_of(
        spec,
        bundle,
        namespace="labs",
        agent_image="registry.lab/orchard/agent:1",
        runtime_class="gvisor",
        node_selector={"pool": "sandboxes"},
        tolerations=[Toleration(key="sandbox", operator="Exists", effect="NoSchedule", tolerationSeconds=5)],
        image_pull_secrets=["lab-registry"],
    )
    meta = pod["metadata"]
    assert (meta["name"], meta["namespace"]) == ("orchard-box-1", "labs")
    assert meta["labels"] == {
        "app.kubernetes.io/managed-by": "orchard",
        "orchard.sandbox/id": "box-1",
        "orchard.sandbox/network": "open",
        "orchard.sandbox/run": "eval-0123abcd",
    }
    assert meta["annotations"] == {
        "orchard.sandbox/owner": "host:42:777",
        "orchard.sandbox/created": "1700000000.500",
        "orchard.sandbox/ttl": "600",
        "orchard.sandbox/run": "eval-0123abcd",
    }

    podspec = pod["spec"]
    assert podspec["restartPolicy"] == "Never"
    assert podspec["automountServiceAccountToken"] is False and podspec["enableServiceLinks"] is False
    assert podspec["runtimeClassName"] == "gvisor"
    assert podspec["nodeSelector"] == {"pool": "sandboxes"}
    assert podspec["tolerations"] == [
        {"key": "sandbox", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5}
    ]
    assert podspec["imagePullSecrets"] == [{"name": "lab-registry"}]
    [init], [main] = podspec["initContainers"], podspec["containers"]
    for container in (init, main):
        assert container["securityContext"] == SECURE

    # injection: the init container copies the bundle into the emptyDir; the task image runs it, read-only
    assert (init["name"], init["image"], init["command"]) == (
        "orchard-agent",
        "registry.lab/orchard/agent:1",
        INJECT_COMMAND,
    )
    assert init["volumeMounts"] == [{"name": "orchard", "mountPath": AGENT_MOUNT}]
    assert (main["name"], main["image"]) == ("sandbox", "python:3.11-slim")
    # the agent listens at the Pod IP only (the Downward API's, expanded by the kubelet), never 0.0.0.0
    listen = ["--pod", "$(ORCHARD_AGENT_POD_IP):7000"]
    assert main["command"] == [*bundle.command(AGENT_MOUNT), "--workdir", "/workspace", *listen]
    assert main["env"][0] == {"name": "ORCHARD_AGENT_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    assert main["ports"] == [{"name": "agent", "containerPort": 7000, "protocol": "TCP"}]
    assert main["readinessProbe"] == {"tcpSocket": {"port": 7000}, "periodSeconds": 1}

    # resources: requests = limits; the disk cap as ephemeral-storage, plus what the bundle takes
    resources = main["resources"]
    assert resources["requests"] == resources["limits"]
    limits = resources["limits"]
    assert (limits["cpu"], limits["memory"]) == ("500m", str(2**30))
    bundle_bytes = bundle.size()
    assert 2 * 2**30 + bundle_bytes < int(limits["ephemeral-storage"]) <= 2 * 2**30 + bundle_bytes + 2 * 2**20
    assert init["resources"]["limits"] == {"cpu": "500m", "memory": str(2**30)}  # a quota sees the same

    # tmpfs folders: memory-backed emptyDirs capped at their size
    volumes = {v["name"]: v for v in podspec["volumes"]}
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert volumes["orchard"] == {"name": "orchard", "emptyDir": {}}
    assert mounts[AGENT_MOUNT] == {"name": "orchard", "mountPath": AGENT_MOUNT, "readOnly": True}
    for path, size in (("/scratch", 64 * 2**20), ("/a", 2**20)):
        volume = volumes[mounts[path]["name"]]
        assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": str(size)}
        assert not mounts[path].get("readOnly")

    # the token: only its SHA-256 is in the Pod; a planted agent variable is dropped
    env = {e["name"]: e["value"] for e in main["env"] if "value" in e}
    assert env["ORCHARD_AGENT_TOKEN_SHA256"] == hashlib.sha256(TOKEN.encode()).hexdigest()
    assert "ORCHARD_AGENT_TOKEN" not in env and env["FOO"] == "bar"
    assert env["PRICE"] == "$$(FOO) is $$5"  # Kubernetes would expand $(FOO): the value stays as given
    assert env | bundle.environment(AGENT_MOUNT) == env
    assert TOKEN not in json.dumps(pod)


def test_a_pod_without_limits_asks_for_nothing_and_a_run_id_that_is_no_label_value_stays_an_annotation(bundle) -> None:
    spec = SandboxSpec(image="busybox", cpu=0.0001, run_id="my run: 1/2", owner="o")
    pod = manifest_of(spec, bundle)
    [init], [main] = pod["spec"]["initContainers"], pod["spec"]["containers"]
    assert main["resources"]["limits"] == {"cpu": "1m"}  # the finest share, never 0
    assert pod["metadata"]["namespace"] == "orchard-sandboxes"
    assert init["image"].startswith("orchard/agent:")
    assert "orchard.sandbox/run" not in pod["metadata"]["labels"]
    assert pod["metadata"]["annotations"]["orchard.sandbox/run"] == "my run: 1/2"
    assert "runtimeClassName" not in pod["spec"] and "tolerations" not in pod["spec"]
    bare = manifest_of(SandboxSpec(image="busybox"), bundle)
    assert bare["spec"]["containers"][0]["resources"] == {} and bare["spec"]["initContainers"][0]["resources"] == {}


# -- reading a Pod's status ----------------------------------------------------------------------


def _pod(phase: str = "Pending", *, node: str | None = "n1", deleting: bool = False, **status) -> dict:
    meta = {"name": "orchard-box-1", "uid": "u1", "resourceVersion": "7"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}, "status": {"phase": phase, **status}}


def _container(name: str = "sandbox", ready: bool = False, **state) -> dict:
    return {"name": name, "image": "python:3.11-slim", "ready": ready, "state": state}


def test_running_with_an_ip_and_a_ready_container_is_running_at_the_pod_ip() -> None:
    ready = _pod("Running", podIP="10.1.2.3", containerStatuses=[_container(ready=True, running={})])
    assert pod_state(ready) == SandboxState(running=True, address="http://10.1.2.3:7000")
    ipv6 = _pod("Running", podIP="fd00::5", containerStatuses=[_container(ready=True, running={})])
    assert pod_state(ipv6).address == "http://[fd00::5]:7000"


@pytest.mark.parametrize(
    "pod, says",
    [
        (_pod(node=None), "scheduled"),
        (_pod(initContainerStatuses=[_container("orchard-agent", waiting={"reason": "PodInitializing"})]), "PodInit"),
        (_pod(containerStatuses=[_container(waiting={"reason": "ContainerCreating"})]), "ContainerCreating"),
        (_pod("Running", containerStatuses=[_container(running={})]), "not ready"),  # no IP yet
        (_pod("Running", podIP="10.0.0.9", containerStatuses=[_container(running={})]), "not ready"),
    ],
)
def test_a_pending_pod_or_one_not_ready_is_starting(pod: dict, says: str) -> None:
    state = pod_state(pod)
    assert (state.running, state.starting, state.exists, state.address) == (False, True, True, None)
    assert says in (state.message or "")


@pytest.mark.parametrize(
    "pod, says",
    [
        (
            _pod(containerStatuses=[_container(waiting={"reason": "ErrImagePull", "message": "no such image"})]),
            "ErrImagePull for container sandbox (image python:3.11-slim): no such image",
        ),
        (_pod(containerStatuses=[_container(waiting={"reason": "ImagePullBackOff"})]), "ImagePullBackOff"),
        (_pod(containerStatuses=[_container(waiting={"reason": "InvalidImageName"})]), "InvalidImageName"),
        (
            _pod(initContainerStatuses=[_container("orchard-agent", waiting={"reason": "ErrImagePull"})]),
            "ErrImagePull for container orchard-agent",
        ),
        (
            _pod(containerStatuses=[_container(waiting={"reason": "CreateContainerConfigError", "message": "bad"})]),
            "CreateContainerConfigError",
        ),
        (
            _pod("Failed", containerStatuses=[_container(terminated={"reason": "OOMKilled", "exitCode": 137})]),
            "OOMKilled (exit code 137): out of memory",
        ),
        (
            _pod(
                "Failed",
                containerStatuses=[_container(terminated={"reason": "Error", "exitCode": 3, "message": "boom\n"})],
            ),
            "the container exited: Error (exit code 3): boom",
        ),
        (
            _pod(initContainerStatuses=[_container("orchard-agent", terminated={"reason": "Error", "exitCode": 1})]),
            "init container orchard-agent) failed: Error (exit code 1)",
        ),
        (_pod("Failed", reason="Evicted", message="low on ephemeral-storage"), "evicted: low on ephemeral-storage"),
        (_pod("Failed", reason="DeadlineExceeded"), "the Pod failed: DeadlineExceeded"),
        (_pod("Succeeded"), "the Pod ended"),
    ],
)
def test_a_failure_is_reported_at_once_with_its_reason(pod: dict, says: str) -> None:
    state = pod_state(pod)
    assert (state.running, state.starting, state.exists) == (False, False, True)
    assert says in (state.message or ""), state.message


def test_an_unschedulable_pod_fails_after_its_grace_and_a_deleted_one_is_gone() -> None:
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes match"}
    stuck = _pod(node=None, conditions=[condition])
    assert pod_state(stuck, unschedulable_grace=3).starting
    failed = pod_state(stuck, unschedulable_grace=0)
    assert not failed.starting and not failed.running
    assert failed.message == "the Pod cannot be scheduled: 0/1 nodes match"
    going = pod_state(_pod("Running", deleting=True, podIP="10.0.0.1"))
    assert (going.exists, going.running, going.starting) == (False, False, False)


# -- config and errors -----------------------------------------------------------------------


def test_the_config_is_typed_and_importing_it_loads_no_kubernetes_client() -> None:
    script = (
        "import sys\n"
        "from orchard.env.backends import backend_config, KubernetesConfig\n"
        "config = backend_config('kubernetes')\n"
        "assert isinstance(config, KubernetesConfig) and config.type == 'kubernetes'\n"
        "assert config.namespace == 'orchard-sandboxes' and config.api_concurrency == 16\n"
        "assert 'kubernetes' not in sys.modules, 'the client library loaded early'\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    with pytest.raises(ValueError):
        KubernetesConfig(namespcae="typo")  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        KubernetesConfig(tolerations=[{"key": "a", "effect": "NoSchedul"}])
    assert backend_config("kubernetes").agent_image.startswith("orchard/agent:")


def test_a_missing_kubeconfig_and_an_unreachable_server_fail_clearly(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        KubernetesConfig(kubeconfig=tmp_path / "nope").build()
    with socket.socket() as probe:  # a loopback port where nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    started = time.monotonic()
    with pytest.raises(EngineUnavailable, match=f"127.0.0.1:{port} did not answer"):
        KubernetesConfig(kubeconfig=kubeconfig, retry_for=0.5).build()
    assert time.monotonic() - started < 5  # retried with backoff for retry_for, not forever


# -- the agent, started with the token's SHA-256 --------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_agent(env: dict[str, str], port: int, workdir: Path) -> subprocess.Popen[bytes]:
    """The agent as a Pod starts it (its entry, ``-s -S``, TCP), with only the variables given for its token."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ORCHARD_AGENT_")}
    argv = [sys.executable, "-s", "-S", str(SERVER), "--tcp", f"127.0.0.1:{port}", "--workdir", str(workdir)]
    return subprocess.Popen(argv, env={**clean, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream:
            stream.close()


def _answers(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            httpx.get(f"{url}/health", timeout=1)
            return
        except httpx.TransportError:
            if proc.poll() is not None:
                raise AssertionError(f"the agent exited: {proc.stderr.read()!r}") from None  # type: ignore[union-attr]
            if time.monotonic() > deadline:
                raise AssertionError("the agent never answered") from None
            time.sleep(0.02)


def test_the_agent_takes_the_sha256_of_its_token_and_checks_requests_by_it(tmp_path: Path) -> None:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    port = _free_port()
    proc = _start_agent({"ORCHARD_AGENT_TOKEN_SHA256": digest.upper()}, port, tmp_path)  # either case
    url = f"http://127.0.0.1:{port}"
    try:
        _answers(url, proc)
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            assert c.get("/health").status_code == 200
            answer = c.post("/exec", json={"command": "env"})
            assert answer.status_code == 200
            facts, stdout, _ = split_exec_answer(answer.content)
            assert facts["exit_code"] == 0
            assert b"ORCHARD_AGENT_TOKEN" not in stdout and digest.encode() not in stdout.lower()
        for wrong in (digest, TOKEN + "x", TOKEN[:-1]):  # the digest itself grants nothing
            response = httpx.get(f"{url}/health", headers={"Authorization": f"Bearer {wrong}"})
            assert response.status_code == 403
        assert httpx.get(f"{url}/health").status_code == 401
    finally:
        _stop(proc)


@pytest.mark.parametrize(
    "env, says",
    [
        ({"ORCHARD_AGENT_TOKEN_SHA256": "abc"}, b"64 hex digits"),
        ({"ORCHARD_AGENT_TOKEN_SHA256": "g" * 64}, b"64 hex digits"),
        ({"ORCHARD_AGENT_TOKEN_SHA256": "a" * 64, "ORCHARD_AGENT_TOKEN": TOKEN}, b"set one"),
        ({}, b"ORCHARD_AGENT_TOKEN_SHA256) is not set"),
    ],
)
def test_the_agent_refuses_a_bad_digest_or_two_tokens(env: dict[str, str], says: bytes, tmp_path: Path) -> None:
    proc = _start_agent(env, _free_port(), tmp_path)
    try:
        assert proc.wait(10) == 2
        assert says in proc.stderr.read()  # type: ignore[union-attr]
    finally:
        _stop(proc)


# -- the manager, resolving the agent's address from the backend's state ----------------------------


class PodLikeBackend:
    """A backend that starts a real agent process the way a Pod starts (test double of the protocol).

    `create` returns an endpoint without an address; the agent starts `delay` seconds later (the
    Pod is `starting` meanwhile) with the token's SHA-256, then `state` gives its address, as a
    Pod's IP once its container is ready. `fail_with` makes the Pod fail instead (an image that
    cannot be pulled, say). `wait_for_change` is woken when the state changes, as the watch does.
    """

    name = "pod-like"

    def __init__(self, root: Path, *, delay: float = 0.3, fail_with: str | None = None):
        self.root, self.delay, self.fail_with = root, delay, fail_with
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self.born: dict[str, float] = {}
        self.changed = threading.Condition()
        self.state_calls = 0
        self.deleted: list[str] = []

    def pod_name(self, sandbox_id: str) -> str:
        return f"orchard-{sandbox_id}"

    def create(self, sandbox_id: str, spec: SandboxSpec, token: str) -> AgentEndpoint:
        self.born[sandbox_id] = time.monotonic()
        self.ports[sandbox_id] = port = _free_port()

        def start() -> None:
            time.sleep(self.delay)
            if self.fail_with is None and sandbox_id in self.born:
                env = {"ORCHARD_AGENT_TOKEN_SHA256": hashlib.sha256(token.encode()).hexdigest()}
                self.procs[sandbox_id] = _start_agent(env, port, self.root)
            with self.changed:
                self.changed.notify_all()

        threading.Thread(target=start, daemon=True).start()
        return AgentEndpoint(token=token, url="")

    def state(self, sandbox_id: str) -> SandboxState:
        self.state_calls += 1
        if sandbox_id not in self.born:
            return SandboxState(running=False, exists=False, message="the Pod is gone")
        if time.monotonic() - self.born[sandbox_id] < self.delay:
            return SandboxState(running=False, starting=True, message="container sandbox is waiting: ContainerCreating")
        if self.fail_with:
            return SandboxState(running=False, message=self.fail_with)
        proc = self.procs.get(sandbox_id)
        if proc is None:
            return SandboxState(running=False, starting=True, message="the agent is starting")
        try:
            socket.create_connection(("127.0.0.1", self.ports[sandbox_id]), timeout=0.2).close()
        except OSError:  # not ready yet: the readiness probe has not passed
            return SandboxState(running=False, starting=True, message="the agent is starting")
        return SandboxState(running=True, address=f"http://127.0.0.1:{self.ports[sandbox_id]}")

    def wait_for_change(self, sandbox_id: str, state: SandboxState, timeout: float) -> None:
        with self.changed:
            self.changed.wait(min(timeout, 0.05))

    def seal(self, sandbox_id: str) -> None:
        pass

    def delete(self, sandbox_id: str, owner: str | None = None) -> None:
        self.deleted.append(sandbox_id)
        self.born.pop(sandbox_id, None)
        proc = self.procs.pop(sandbox_id, None)
        if proc is not None:
            _stop(proc)

    def list(self) -> list[BackendSandbox]:
        return []


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store.open(f"sqlite:///{tmp_path / 'orchard.db'}")


@pytest.fixture
def pod_like(tmp_path: Path) -> Iterator[PodLikeBackend]:
    backend = PodLikeBackend(tmp_path)
    yield backend
    for sandbox_id in list(backend.procs):
        backend.delete(sandbox_id)


def test_the_manager_waits_while_starting_then_talks_to_the_address_the_state_gives(pod_like, store) -> None:
    with SandboxManager(pod_like, store=store, reap_interval=None) as manager:
        info = manager.create(SandboxSpec(image="any"), sandbox_id="pod-1", timeout=20)
        assert info.ready and info.endpoint is not None
        assert info.endpoint.url == f"http://127.0.0.1:{pod_like.ports['pod-1']}"
        assert manager.get("pod-1").endpoint == info.endpoint  # kept: every later call uses it
        token = info.endpoint.token
        response = httpx.post(
            f"{info.endpoint.url}/exec", json={"command": "echo hi"}, headers={"Authorization": f"Bearer {token}"}
        )
        assert split_exec_answer(response.content)[1] == b"hi\n"
    assert pod_like.deleted == ["pod-1"]


def test_a_failure_in_the_state_fails_the_sandbox_at_once_with_its_reason(tmp_path, store) -> None:
    backend = PodLikeBackend(tmp_path, delay=0.2, fail_with="ErrImagePull for container sandbox (image nope)")
    with SandboxManager(backend, store=store, reap_interval=None) as manager:
        started = time.monotonic()
        with pytest.raises(SandboxError, match="did not start: ErrImagePull for container sandbox"):
            manager.create(SandboxSpec(image="nope"), sandbox_id="pod-2", timeout=60)
        assert time.monotonic() - started < 5  # at once, not at the timeout
        assert backend.deleted == ["pod-2"]
        recorded = manager.recorded("pod-2")
        assert recorded is not None and recorded.status == "failed"
        assert "ErrImagePull" in (recorded.status_message or "")


def test_the_agent_listens_at_a_real_pod_ip_as_given_and_never_on_loopback_for_a_forwarded_one() -> None:
    """`--pod POD_IP:PORT`: a real Pod IP is listened at as given; a loopback one (a node forwarding
    from its own loopback, as the test kubelet does) stands for the namespace's own interface address."""
    from orchard.env.agent.server import _interface_addresses, pod_host

    assert pod_host("10.1.2.3") == "10.1.2.3" and pod_host("[fd00::5]") == "fd00::5"
    own = _interface_addresses()
    assert pod_host("127.0.0.7") == (own[0] if own else "127.0.0.7")
    assert all(not address.startswith("127.") for address in own)
