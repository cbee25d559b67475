"""Faults and attacks: each asserts the harm stayed inside, nothing hung, and nothing was lost."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time

import httpx
import pytest

from orchard.errors import AgentError, ConfigError, EngineUnavailable, SandboxError


def test_memory_hog_is_killed_and_reported_as_such(client, base_image):
    with client.create(base_image, memory="64Mi") as box:
        hog = box.exec("python3 -c 'x = bytearray(512 * 2**20); print(len(x))'", timeout=60)
        assert hog.exit_code == 137 and "out-of-memory" in hog.error
        assert box.exec("echo still answering").stdout == "still answering\n"


def test_fork_storm_stays_in_its_sandbox(client, base_image):
    with client.create(base_image) as bystander:
        from orchard.env.backends import SandboxSpec

        storm = client._manager.create(SandboxSpec(image=base_image, pids=64))
        try:
            from orchard.env.calls import AgentCalls, send
            from orchard.env.manager import agent_http

            with agent_http(storm.endpoint) as http:
                bomb = send(http, AgentCalls().exec(":(){ :|:& };: ; sleep 60", timeout=3))
                assert bomb.timed_out and bomb.exit_code == 124  # the whole group went with it
                assert send(http, AgentCalls().exec("echo survived")).stdout == "survived\n"
            assert bystander.exec("echo unharmed").stdout == "unharmed\n"
        finally:
            client._manager.delete(storm.sandbox_id)


def test_filling_a_capped_folder_stops_there(client, base_image, docker_client):
    """The engine here (overlay2 on ext4) cannot cap the writable layer: `disk=` is refused with
    the reason and nothing is started; a capped in-memory folder is filled instead."""

    def ours() -> set[str]:  # this client's containers only: another test worker runs beside us
        mine = {"label": f"org.orchard.owner={client._manager.owner}"}
        return {c["Id"] for c in docker_client.api.containers(all=True, filters=mine)}

    before = ours()
    driver = docker_client.info()["Driver"]
    if "xfs" not in str(docker_client.info().get("DriverStatus")) and driver not in ("btrfs", "zfs"):
        with pytest.raises(ConfigError, match="cannot cap a sandbox's disk: its storage driver is"):
            client.create(base_image, disk="1Gi")
        assert ours() == before
    with client.create(base_image, tmpfs={"/scratch": "16Mi"}, memory="256Mi") as box:
        box.write_file("/workspace/kept.txt", "precious\n")
        fill = box.exec("dd if=/dev/zero of=/scratch/fill bs=1M count=64", timeout=60)
        assert fill.exit_code != 0 and "No space left on device" in fill.stderr
        assert box.exec("du -m /scratch/fill | cut -f1").stdout.strip() in ("15", "16")
        with pytest.raises(SandboxError, match="no space left in the sandbox"):
            box.write_file("/scratch/more.bin", b"x" * 2**20)
        assert box.read_file("/workspace/kept.txt") == b"precious\n"  # nothing else lost
        box.exec("rm /scratch/fill")
        assert box.write_file("/scratch/more.bin", b"x" * 2**20) == 2**20  # room again once freed


def test_a_blocked_sandbox_reaches_no_engine_no_host_and_no_other_agent(client, base_image):
    with client.create(base_image) as other, client.create(base_image) as box:
        assert box.exec("ls /var/run/docker.sock /run/docker.sock").exit_code != 0
        assert box.exec("ls /.orchard-run").stdout == "agent.sock\n"  # its own socket, nobody else's
        assert other.id not in box.exec("ls -a / /.orchard-run /tmp").stdout
        # the host's loopback is not the sandbox's: nothing of the host listens there
        probe = "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 22), 1)'"
        assert box.exec(probe).exit_code != 0
        assert box.exec("tail -n +2 /proc/net/route").stdout == ""  # no route anywhere: nothing can leave


def test_agent_killed_inside_its_sandbox(client, base_image, docker_client):
    box = client.create(base_image)
    try:
        with pytest.raises(AgentError, match="no answer"):  # it dies running this: an error, no hang
            box.exec("kill -9 $(cat /proc/1/task/1/children)")  # init's only child: the agent
        with pytest.raises(AgentError, match="no answer"):
            box.exec("echo anyone?", timeout=5)
        for _ in range(200):  # its container ends with it: nothing is left running
            if not docker_client.containers.list(filters={"name": f"orchard-{box.id}"}):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the sandbox's container kept running without its agent")
        assert client._manager.check_alive(box.id).status == "failed"
    finally:
        box.delete()


def test_engine_unreachable_is_one_clear_error(monkeypatch, tmp_path):
    from orchard.env.backends.docker import DockerBackend

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(EngineUnavailable, match="cannot reach the Docker engine") as caught:
        DockerBackend()
    assert "\n" not in str(caught.value)
    from typer.testing import CliRunner

    from orchard.cli import app

    status = CliRunner().invoke(app, ["status"], env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert status.exit_code == 0 and "not reachable" in status.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_service(home, port: int) -> subprocess.Popen:
    env = {**os.environ, "ORCHARD_HOME": str(home), "ORCHARD_API_KEY": "k"}
    service = subprocess.Popen([sys.executable, "-m", "orchard.env.service", "--port", str(port)], env=env)
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return service
        except httpx.HTTPError:
            time.sleep(0.05)
    raise AssertionError("the service did not start")


def test_service_killed_mid_commands_then_restarted(tmp_path, base_image, docker_client):
    """SIGKILL with 20 commands running: after a restart, no orphan, store intact, every job accounted for."""
    home, port = tmp_path / "home", _free_port()
    url = f"http://127.0.0.1:{port}"
    service = _start_service(home, port)
    try:
        with httpx.Client(base_url=url, headers={"X-API-Key": "k"}, timeout=60) as http:
            sandbox_id = http.post("/sandboxes", json={"image": base_image}).json()["sandbox_id"]
            assert http.get(f"/sandboxes/{sandbox_id}/wait").json()["ready"]
            done = http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": "echo done", "wait": True}).json()
            jobs = [
                http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": f"sleep 30; echo {i}"}).json()["job_id"]
                for i in range(20)
            ]
            for _ in range(200):  # the finished job reaches the store in the recorder's next batch
                with sqlite3.connect(home / "orchard.db") as db:
                    if db.execute("SELECT 1 FROM exec_jobs WHERE id = ?", (done["job_id"],)).fetchone():
                        break
                time.sleep(0.05)
            service.send_signal(signal.SIGKILL)
            service.wait(timeout=30)
            assert docker_client.containers.list(filters={"name": f"orchard-{sandbox_id}"})  # left behind
            service = _start_service(home, port)
            assert not docker_client.containers.list(all=True, filters={"name": f"orchard-{sandbox_id}"})
            for job_id in jobs:
                job = http.get(f"/jobs/{job_id}").json()
                assert job["status"] == "failed" and "stopped" in job["error"], job
            assert http.get(f"/sandboxes/{sandbox_id}").status_code == 404
            assert http.get(f"/jobs/{done['job_id']}").json()["status"] == "succeeded"
    finally:
        service.terminate()
        service.wait(timeout=60)
    with sqlite3.connect(home / "orchard.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        statuses = dict(db.execute("SELECT id, status FROM exec_jobs").fetchall())
    assert all(statuses[job_id] == "failed" for job_id in jobs)
    assert statuses[done["job_id"]] == "succeeded"
