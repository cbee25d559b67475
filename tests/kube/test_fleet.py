"""A fleet: several `orchard up --backend kubernetes --fleet NAME` replicas sharing one PostgreSQL store.

Each replica is a process of its own (`python -m orchard.env.service`, as `orchard up` starts it),
over the real API server, the test kubelet running the Pods with Docker, and a real PostgreSQL on a
Unix socket. Any replica serves a sandbox another one created (commands, files, jobs started on one
and read on another, heartbeats received by either); a replica killed outright (SIGKILL) loses no
sandbox, its running command is failed by the others; replicas stopped and started anew find the
fleet's sandboxes as they were; one delete removes the Pod.
"""

from __future__ import annotations

import base64
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from kubelet import pod_path

from orchard.env import images
from orchard.env.calls import AgentCalls, send
from orchard.env.manager import HEALTH as HEALTH_CALL

NONCE = "orchard.sandbox/token-nonce"
HOUSEKEEP = 0.5
HEARTBEAT_SILENCE = 4.0
REPLICA_SILENCE = 3.0


@pytest.fixture(scope="module")
def agent_image(docker_client) -> str:
    return images.build_agent()


class Replicas:
    """Starts replicas of one fleet; every one still running is killed at the end."""

    def __init__(self, tmp_path: Path, kubeconfig: str, namespace: str, db_url: str) -> None:
        self.tmp_path, self.kubeconfig, self.namespace, self.db_url = tmp_path, kubeconfig, namespace, db_url
        self.fleet = f"fleet-{secrets.token_hex(3)}"
        self.key = f"fleet-key-{secrets.token_hex(8)}"
        self.processes: list[subprocess.Popen] = []

    def start(self, name: str) -> tuple[httpx.Client, subprocess.Popen]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {
            **os.environ,
            "ORCHARD_HOME": str(self.tmp_path / name),
            "ORCHARD_DB_URL": self.db_url,
            "ORCHARD_API_KEY": self.key,
        }
        argv = [sys.executable, "-m", "orchard.env.service", "--port", str(port), "--backend", "kubernetes"]
        argv += ["--fleet", self.fleet, "--namespace", self.namespace, "--kubeconfig", self.kubeconfig]
        argv += ["--housekeep-interval", str(HOUSEKEEP), "--heartbeat-silence", str(HEARTBEAT_SILENCE)]
        argv += ["--replica-silence", str(REPLICA_SILENCE)]
        with open(self.tmp_path / f"{name}.log", "wb") as log:  # the process keeps its own copy
            process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(process)
        http = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"X-API-Key": self.key}, timeout=60)
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (self.tmp_path / f"{name}.log").read_text()
            try:
                if http.get("/health").status_code == 200:
                    return http, process
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"replica {name} did not answer"
            time.sleep(0.1)

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.fixture
def replicas(kube, namespace, kubelet, agent_image, postgres_url, tmp_path) -> Iterator[Replicas]:
    fleet = Replicas(tmp_path, kube.kubeconfig, namespace, postgres_url)
    try:
        yield fleet
    finally:
        fleet.stop_all()


def _exec(http: httpx.Client, sandbox_id: str, command: str) -> dict:
    answer = http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": command, "wait": True})
    assert answer.status_code == 200, answer.text
    return answer.json()


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM, as Kubernetes stops a replica (a rolling update, a node drained); uvicorn shuts down,
    then re-raises the signal."""
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) in (0, -signal.SIGTERM)


@contextmanager
def _no_pods_left(api, namespace: str) -> Iterator[None]:
    yield
    deadline = time.monotonic() + 30
    while api.call("GET", f"/api/v1/namespaces/{namespace}/pods")["items"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert api.call("GET", f"/api/v1/namespaces/{namespace}/pods")["items"] == []


def test_any_replica_serves_any_sandbox_and_a_killed_replica_loses_nothing(
    replicas, api, namespace, kubelet, base_image
) -> None:
    """Slow: three real service replicas as processes, one killed and its sandboxes served by the others."""
    a, a_process = replicas.start("a")
    b, b_process = replicas.start("b")
    with _no_pods_left(api, namespace):
        created = a.post("/sandboxes", json={"image": base_image})
        assert created.status_code == 200, created.text
        box = created.json()["sandbox_id"]
        ready = b.get(f"/sandboxes/{box}/wait", params={"timeout": 120}).json()  # B takes it over while it starts
        assert ready["ready"] and ready["status"] == "ready", ready

        # commands and files: written through one replica, read through the other
        assert _exec(b, box, "echo from-b > /tmp/note; cat /tmp/note")["stdout"] == "from-b\n"
        upload = {"path": "/tmp/data.bin", "content": base64.b64encode(bytes(range(256))).decode()}
        uploaded = a.post(f"/sandboxes/{box}/files", json=upload)
        assert uploaded.status_code == 200, (
            uploaded.text
        )  # once 404 under a loaded suite: A's view of the start lagged?
        read = b.get(f"/sandboxes/{box}/files", params={"path": "/tmp/data.bin"}).json()
        assert base64.b64decode(read["content"]) == bytes(range(256))
        assert [s["sandbox_id"] for s in b.get("/sandboxes").json()["sandboxes"]] == [box]

        # a job started on A (not waited for, as published clients do) is read, output and all, on B
        job = a.post(f"/sandboxes/{box}/exec", json={"command": "sleep 0.5; echo job-done"}).json()["job_id"]
        finished = b.get(f"/jobs/{job}/wait", params={"timeout": 30}).json()
        assert (finished["status"], finished["stdout"], finished["exit_code"]) == ("succeeded", "job-done\n", 0)

        # A is killed outright while it runs a command: B serves on, and fails that command
        long = a.post(f"/sandboxes/{box}/exec", json={"command": "sleep 60"}).json()["job_id"]
        assert a.get(f"/jobs/{long}").json()["status"] == "running"
        a_process.kill()
        a_process.wait()
        assert _exec(b, box, "cat /tmp/note")["stdout"] == "from-b\n"
        lost = b.get(f"/jobs/{long}/wait", params={"timeout": REPLICA_SILENCE * 4}).json()
        assert lost["status"] == "failed" and "replica running this command stopped" in lost["error"], lost

        # every replica stopped, new ones started: the fleet's sandbox is still there, as it was
        c, c_process = replicas.start("c")
        assert _exec(c, box, "cat /tmp/note")["stdout"] == "from-b\n"
        stopped = b.post(f"/sandboxes/{box}/exec", json={"command": "sleep 60", "concurrent": True}).json()["job_id"]
        _stop(b_process)  # mid-command: nobody will finish it
        _stop(c_process)
        assert api.call("GET", pod_path(namespace, f"orchard-{box}"))["status"]["phase"] == "Running"
        d, _ = replicas.start("d")
        assert _exec(d, box, "cat /tmp/note")["stdout"] == "from-b\n"
        ended = d.get(f"/jobs/{stopped}").json()
        assert ended["status"] == "failed" and "stopped (shut down)" in ended["error"], ended
        assert d.delete(f"/sandboxes/{box}").status_code == 200
        assert d.get(f"/sandboxes/{box}").status_code == 404


def test_heartbeats_to_any_replica_keep_a_sandbox_alive_and_once_they_stop_the_fleet_reaps_it(
    replicas, api, namespace, kubelet, base_image
) -> None:
    """Slow: it waits for real heartbeat silences and the reaper's rounds."""
    a, _ = replicas.start("a")
    b, _ = replicas.start("b")
    with _no_pods_left(api, namespace):
        box = a.post("/sandboxes", json={"image": base_image}).json()["sandbox_id"]
        assert a.get(f"/sandboxes/{box}/wait", params={"timeout": 120}).json()["ready"]
        for beat in range(6):  # A hears the first beat only, then B hears them: the fleet hears them all
            assert (a if beat == 0 else b).post(f"/sandboxes/{box}/heartbeat").status_code == 200
            time.sleep(HEARTBEAT_SILENCE / 4)
        assert a.get(f"/sandboxes/{box}").json()["status"] == "ready"  # A's own last beat is 6 s old
        deadline = time.monotonic() + HEARTBEAT_SILENCE + 10
        while a.get(f"/sandboxes/{box}").status_code == 200:
            assert time.monotonic() < deadline, "a silent sandbox of the fleet was not reaped"
            time.sleep(0.5)
    assert kubelet.leftovers() == []


def test_a_fleets_tokens_are_in_no_store_and_no_pod(replicas, api, namespace, kubelet, base_image) -> None:
    """The agent's token of a fleet's sandbox is derived on the replicas (HMAC under the API key):
    it opens the agent at the Pod IP, and it is nowhere in the store or the Pod; another key's
    derivation is refused by the agent."""
    import json

    import sqlalchemy
    from sqlmodel import SQLModel

    import orchard.store.tables  # noqa: F401  (the tables' metadata)
    from orchard.env.backends.base import AgentEndpoint
    from orchard.env.manager import Fleet, agent_http
    from orchard.errors import AuthError

    a, _ = replicas.start("a")
    with _no_pods_left(api, namespace):
        box = a.post("/sandboxes", json={"image": base_image}).json()["sandbox_id"]
        assert a.get(f"/sandboxes/{box}/wait", params={"timeout": 120}).json()["ready"]
        assert _exec(a, box, "echo hi")["stdout"] == "hi\n"
        pod = api.call("GET", pod_path(namespace, f"orchard-{box}"))
        token = Fleet(replicas.fleet, replicas.key).token(box, pod["metadata"]["annotations"][NONCE])
        address = f"http://{pod['status']['podIP']}:7000"
        with agent_http(AgentEndpoint(token=token, url=address), timeout=10) as http:
            assert http.request(HEALTH_CALL).status_code == 200
        wrong = Fleet(replicas.fleet, "another-key").token(box, pod["metadata"]["annotations"][NONCE])
        with agent_http(AgentEndpoint(token=wrong, url=address), timeout=10) as http, pytest.raises(AuthError):
            send(http, AgentCalls().exec("true"))
        assert token not in json.dumps(pod)
        engine = sqlalchemy.create_engine(replicas.db_url)
        with engine.connect() as connection:
            for table in SQLModel.metadata.sorted_tables:
                rows = connection.execute(table.select()).all()
                assert token not in repr(rows), table.name
        engine.dispose()
        assert a.delete(f"/sandboxes/{box}").status_code == 200


def test_a_sandbox_id_created_again_gets_a_new_token_and_the_old_one_opens_nothing(
    replicas, api, namespace, kubelet, base_image
) -> None:
    """Sandbox ids are the clients' to choose: whoever kept the token of an earlier sandbox of an id
    (an earlier tenant) must not open the sandbox created again with that id. The token is bound to
    the Pod's own nonce, drawn at each create: the old token is refused by the new Pod's agent,
    while every replica still derives the new one (B serves the sandbox A created again).

    Slow: two replicas as processes, and the same sandbox id created, deleted and created again.
    """
    from orchard.env.backends.base import AgentEndpoint
    from orchard.env.manager import Fleet, agent_http
    from orchard.errors import AuthError

    a, _ = replicas.start("a")
    b, _ = replicas.start("b")
    fleet = Fleet(replicas.fleet, replicas.key)

    def pod_token(box: str) -> tuple[str, str]:
        pod = api.call("GET", pod_path(namespace, f"orchard-{box}"))
        nonce = pod["metadata"]["annotations"].get(NONCE, "")  # none: the id's token alone, as before
        return fleet.token(box, nonce), f"http://{pod['status']['podIP']}:7000"

    with _no_pods_left(api, namespace):
        box = "tenant-box"
        created = a.post("/sandboxes", json={"image": base_image, "sandbox_id": box})
        assert created.status_code == 200, created.text
        assert a.get(f"/sandboxes/{box}/wait", params={"timeout": 120}).json()["ready"]
        old_token, old_address = pod_token(box)
        with agent_http(AgentEndpoint(token=old_token, url=old_address), timeout=10) as http:
            assert send(http, AgentCalls().exec("echo first tenant")).stdout == "first tenant\n"
        assert a.delete(f"/sandboxes/{box}").status_code == 200
        deadline = time.monotonic() + 30
        while api.exists(pod_path(namespace, f"orchard-{box}")):
            assert time.monotonic() < deadline, "the first Pod stayed"
            time.sleep(0.2)

        again = a.post("/sandboxes", json={"image": base_image, "sandbox_id": box})
        assert again.status_code == 200, again.text
        assert b.get(f"/sandboxes/{box}/wait", params={"timeout": 120}).json()["ready"]
        assert _exec(b, box, "echo second tenant")["stdout"] == "second tenant\n"  # B derived the new token
        assert _exec(a, box, "echo still")["stdout"] == "still\n"
        new_token, address = pod_token(box)
        with agent_http(AgentEndpoint(token=old_token, url=address), timeout=10) as http, pytest.raises(AuthError):
            send(http, AgentCalls().exec("echo the first tenant is back"))
        with agent_http(AgentEndpoint(token=new_token, url=address), timeout=10) as http:
            assert http.request(HEALTH_CALL).status_code == 200
        assert b.delete(f"/sandboxes/{box}").status_code == 200
