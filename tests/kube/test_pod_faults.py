"""Faults on the Kubernetes backend, end to end: a Pod's container killed under a live sandbox.

The real stack: the kube-apiserver of the `kube` fixture, the test kubelet running the Pods with
Docker (each at its own loopback address), the backend's watch cache, the manager, and on top
either the `orchard up` service with the SDK over HTTP or the manager as the embedded SDK uses it.
The kubelet's `kill` SIGKILLs the sandbox's main container (exit 137, as the OOM killer or a crash
would); then the sandbox must be reported failed with that reason everywhere it is looked at, a
command in flight and every command after must end at once with an error (never hang), and the
Pod, its containers and its volumes must all be gone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from kubelet import TestKubelet, _Api, pod_path

from orchard.env import Client, images
from orchard.env.backends.base import SandboxState, make_spec
from orchard.env.backends.kubernetes import KubernetesBackend, KubernetesConfig
from orchard.env.calls import AgentCalls, send
from orchard.env.manager import SandboxManager, agent_http
from orchard.errors import AgentError, NotFound
from orchard.store import Store

T = TypeVar("T")

PROMPT = 20.0
"""Seconds within which a command must end once its container is dead (it would hang for minutes)."""
STARTED = "/tmp/long-command-started"
LOST = "no answer from the sandbox's agent"
"""How a command whose agent died ends (an error, not an exit code)."""


@pytest.fixture(scope="module")
def agent_image(docker_client) -> str:
    """The injector image the Pods' init container runs, built offline once."""
    return images.build_agent()


@pytest.fixture
def backend(kube, namespace, kubelet, agent_image) -> Iterator[KubernetesBackend]:
    """The Kubernetes backend on the test namespace, built here so a test can read its state."""
    built = KubernetesConfig(kubeconfig=kube.kubeconfig, namespace=namespace, unschedulable_grace=0).build()
    yield built
    built.close()  # idempotent: a manager over it closes it too


def _until(what: str, probe: Callable[[], T | None], seconds: float = 30.0) -> T:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out after {seconds:g} s waiting for {what}")


def _stopped(backend: KubernetesBackend, sandbox_id: str, seconds: float = 30.0) -> SandboxState:
    """The sandbox's state once it is no longer running, waiting on the backend's watch."""
    deadline = time.monotonic() + seconds
    state = backend.state(sandbox_id)
    while state.running and time.monotonic() < deadline:
        backend.wait_for_change(sandbox_id, state, deadline - time.monotonic())
        state = backend.state(sandbox_id)
    assert not state.running, f"still running {seconds:g} s after its container was killed"
    return state


def _terminated(api: _Api, namespace: str, pod: str) -> dict:
    """The main container's terminated state as the kubelet wrote it into the Pod."""
    status = api.call("GET", pod_path(namespace, pod))["status"]
    [main] = [c for c in status["containerStatuses"] if c["name"] == "sandbox"]
    assert status["phase"] == "Failed" and "terminated" in main["state"], status
    return main["state"]["terminated"]


def _assert_nothing_left(api: _Api, namespace: str, pod: str, kubelet: TestKubelet, backend: KubernetesBackend):
    """The Pod deleted from the API server, and no container or volume of it left in Docker."""

    _until(f"the Pod {pod} to be deleted", lambda: not api.exists(pod_path(namespace, pod)))
    _until("the kubelet to remove its containers and volumes", lambda: kubelet.leftovers() == [], 10)
    assert backend.state(pod.removeprefix("orchard-")).exists is False
    assert backend.list() == []


def test_a_killed_container_fails_the_sandbox_through_the_service(
    api, namespace, kubelet, backend, base_image, start_service, tmp_path: Path
) -> None:
    """Through `orchard up` and the SDK over HTTP: the command in flight ends with an error, the
    backend names the reason (exit code 137), the next command fails at once with that reason and
    the service removes the Pod then, GET /sandboxes/{id} says failed and why, and nothing is left."""
    with (
        start_service(tmp_path / "service.db", backend=backend) as (url, key),
        Client(url, api_key=key) as client,
        ThreadPoolExecutor(1) as pool,
    ):
        box = client.create(base_image)
        pod = backend.pod_name(box.id)
        assert box.exec("echo alive").stdout == "alive\n"
        in_flight = pool.submit(box.exec, f"touch {STARTED}; sleep 300", timeout=600)
        _until("the long command to start", lambda: box.exec(f"test -e {STARTED}").ok)

        kubelet.kill(pod)
        killed = time.monotonic()
        long = in_flight.result(timeout=PROMPT)
        assert time.monotonic() - killed < PROMPT
        assert long.exit_code is None and LOST in (long.error or ""), long

        state = _stopped(backend, box.id)  # the kubelet's status write, seen by the backend's watch
        assert not state.starting and state.exists
        ended = _terminated(api, namespace, pod)
        assert ended["exitCode"] == 137
        reason = f"{ended['reason']} (exit code 137)"  # Error here; OOMKilled for the OOM killer
        assert state.message == f"the container exited: {reason}"

        started = time.monotonic()
        why = f"sandbox {box.id} stopped: the container exited: {reason}"
        if why in (long.error or ""):  # the watch had seen the kill when the command in flight ended
            with pytest.raises(NotFound, match=r"failed.*exit code 137"):
                box.exec("echo hi")
        else:  # the next command finds the agent dead, the service looks, and says why
            after = box.exec("echo hi")
            assert after.exit_code is None and LOST in (after.error or "") and after.error.endswith(why), after
        assert time.monotonic() - started < PROMPT
        _assert_nothing_left(api, namespace, pod, kubelet, backend)  # removed then, before anyone asked

        found = httpx.get(f"{url}/sandboxes/{box.id}", headers={"X-API-Key": key}, timeout=30).json()
        assert (found["status"], found["ready"]) == ("failed", False)
        assert found["status_message"] == f"sandbox {box.id} stopped: the container exited: {reason}"

        started = time.monotonic()
        with pytest.raises(NotFound, match=r"failed.*exit code 137"):
            box.exec("echo hi")
        assert time.monotonic() - started < PROMPT
        box.delete()  # idempotent on a failed sandbox
    assert kubelet.leftovers() == []


def test_a_killed_container_fails_the_sandbox_in_the_manager(
    api, namespace, kubelet, backend, base_image, tmp_path: Path
) -> None:
    """Embedded (the manager and the agent at the Pod IP, as the SDK in-process uses them): the
    command in flight raises, `check_alive` says failed with the reason and deletes the Pod."""
    store = Store.open(f"sqlite:///{tmp_path / 'orchard.db'}")
    with SandboxManager(backend, store=store, reap_interval=None) as manager, ThreadPoolExecutor(1) as pool:
        info = manager.create(make_spec(base_image), sandbox_id="killed", timeout=120)
        assert info.endpoint is not None
        with agent_http(info.endpoint, timeout=30) as http, agent_http(info.endpoint) as long_http:
            assert send(http, AgentCalls().exec("echo alive")).stdout == "alive\n"
            in_flight = pool.submit(send, long_http, AgentCalls().exec(f"touch {STARTED}; sleep 300", timeout=600))
            _until("the long command to start", lambda: send(http, AgentCalls().exec(f"test -e {STARTED}")).ok)

            kubelet.kill("orchard-killed")
            killed = time.monotonic()
            with pytest.raises(AgentError, match=LOST):
                in_flight.result(timeout=PROMPT)
            assert time.monotonic() - killed < PROMPT

            state = _stopped(backend, "killed")
            assert state.message == "the container exited: Error (exit code 137)" and not state.starting
            failed = manager.check_alive("killed")
            assert (failed.status, failed.status_message) == (
                "failed",
                "sandbox killed stopped: the container exited: Error (exit code 137)",
            )
            assert manager.recorded("killed").status_message == failed.status_message  # the store says so too
            with pytest.raises(NotFound):
                manager.check_alive("killed")  # no longer held: nothing hands it out again

            started = time.monotonic()
            with pytest.raises(AgentError, match=LOST):
                send(http, AgentCalls().exec("echo hi"))
            assert time.monotonic() - started < PROMPT
        _assert_nothing_left(api, namespace, "orchard-killed", kubelet, backend)


def test_connections_to_a_pod_ip_bound_the_connect_and_probe_a_silent_peer() -> None:
    """A Pod IP on a lost node drops packets instead of refusing: a connect gets its own bound
    (not the command's timeout), and keep-alive probes notice a peer gone silent mid-command."""
    import asyncio
    import socket

    from orchard.env.backends.base import AgentEndpoint
    from orchard.env.transport import CONNECT_SECONDS, KEEPALIVE, _Connection, open_agent_connection

    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        endpoint = AgentEndpoint(token="t", url=f"http://127.0.0.1:{port}")
        connection = _Connection(endpoint, "127.0.0.1", port, timeout=3600)
        try:
            sock = connection.sock
            assert sock.gettimeout() == CONNECT_SECONDS  # until the first exchange sets the call's own
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert [(option, sock.getsockopt(socket.IPPROTO_TCP, option)) for option, _ in KEEPALIVE] == list(KEEPALIVE)
        finally:
            connection.sock.close()

        async def service_side() -> list[tuple[int, int]]:  # the service's path: asyncio streams
            _reader, writer = await open_agent_connection(endpoint, "127.0.0.1", port)
            try:
                sock = writer.get_extra_info("socket")
                return [(option, sock.getsockopt(socket.IPPROTO_TCP, option)) for option, _ in KEEPALIVE]
            finally:
                writer.close()

        assert asyncio.run(service_side()) == list(KEEPALIVE)


def test_a_create_abandoned_in_an_api_server_outage_leaves_no_pod_once_it_ends(
    kube, api, namespace, kubelet, agent_image, base_image, tmp_path: Path
) -> None:
    """The create's POST is stored, but its answer is lost as the API server goes away; the retries
    find no server, and the create gives up (the manager records it failed, its caller is told so).
    The Pod must not live on until its TTL: once the API server is back, it is deleted within seconds.

    Slow: it stops and starts the real kube-apiserver.
    """
    import urllib3

    from orchard.errors import EngineUnavailable

    config = KubernetesConfig(kubeconfig=kube.kubeconfig, namespace=namespace, retry_for=2, unschedulable_grace=0)
    backend = config.build()
    real_send = backend._send
    lost: list[str] = []

    def send_then_lose_the_server(method, path, query, body, timeout, content_type="application/json"):
        response = real_send(method, path, query, body, timeout, content_type)
        if method == "POST" and path.endswith("/pods") and not lost:
            response.read()
            assert response.status == 201  # stored by the API server ...
            lost.append(body["metadata"]["name"])
            kube.stop()  # ... which goes away before its answer arrives
            raise urllib3.exceptions.ProtocolError("Connection aborted: the answer was lost")
        return response

    backend._send = send_then_lose_the_server  # type: ignore[method-assign]
    store = Store.open(f"sqlite:///{tmp_path / 'orchard.db'}")
    try:
        with SandboxManager(backend, store=store, reap_interval=None) as manager:
            with pytest.raises(EngineUnavailable):
                manager.launch(make_spec(base_image), sandbox_id="abandoned")
            assert lost == ["orchard-abandoned"] and manager.recorded("abandoned").status == "failed"
            assert backend.abandoned() == ["orchard-abandoned"]
            kube.start()  # the Pod is there (its TTL an hour off), until the backend deletes it
            _until("the abandoned create's Pod to be deleted", lambda: not api.exists(pod_path(namespace, lost[0])), 20)
            assert backend.abandoned() == []
            _until("the kubelet to remove its containers and volumes", lambda: kubelet.leftovers() == [], 30)
    finally:
        if not kube.running:
            kube.start()
        backend.close()
