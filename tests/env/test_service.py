"""The `orchard up` service: the Orchard Env API over real HTTP, through the SDK and raw requests."""

from __future__ import annotations

import base64
import time
from pathlib import Path

import httpx
import pytest

from orchard.env import Client
from orchard.env.service import host_memory
from orchard.errors import AuthError, Conflict, InvalidRequest, SandboxError


@pytest.fixture(scope="module")
def http(service):
    url, key = service
    with httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=120) as http:
        yield http


@pytest.fixture(scope="module")
def remote(service):
    url, key = service
    with Client(url=url, api_key=key) as client:
        yield client


@pytest.fixture
def sandbox_id(http, base_image):
    """A ready sandbox made through the raw API, deleted afterwards."""
    sandbox_id = http.post("/sandboxes", json={"image": base_image}).json()["sandbox_id"]
    assert http.get(f"/sandboxes/{sandbox_id}/wait", params={"timeout": 60}).json()["ready"]
    yield sandbox_id
    http.delete(f"/sandboxes/{sandbox_id}")


def test_open_routes_and_auth(service):
    url, key = service
    assert httpx.get(f"{url}/").json()["status"] == "running"
    assert httpx.get(f"{url}/health").json() == {"status": "healthy"}
    assert httpx.get(f"{url}/resources").status_code == 401
    assert httpx.get(f"{url}/resources", headers={"X-API-Key": "wrong"}).status_code == 403
    for route in ("/docs", "/openapi.json"):  # nothing else is open, nor even said to exist without the key
        assert httpx.get(f"{url}{route}").status_code == 401
        assert httpx.get(f"{url}{route}", headers={"X-API-Key": key}).status_code == 404
    with pytest.raises(AuthError), Client(url=url, api_key="wrong") as client:
        client.create("orchard/base:bookworm")


def test_sdk_through_the_service_runs_in_an_image_without_python(remote, busybox_image, tmp_path: Path):
    with remote.create(busybox_image) as box:
        result = box.exec("echo hi; which python3 || echo none")
        assert (result.exit_code, result.stdout) == (0, "hi\nnone\n")
        assert box.exec(["sh", "-c", "exit 4"]).exit_code == 4
        box.write_file("/tmp/b", bytes(range(256)))
        assert box.read_file("/tmp/b") == bytes(range(256))
        assert [f.name for f in box.list_files("/tmp")] == ["b"]
        with pytest.raises(InvalidRequest, match="cwd does not exist"):
            box.exec("true", cwd="/nope")
        box.exec("cd /tmp; X=1", session="s")  # a persistent shell through the service
        assert box.exec("pwd; echo $X", session="s").stdout == "/tmp\n1\n"
        assert box.close_session("s") is True
        (tmp_path / "src" / "deep").mkdir(parents=True)
        (tmp_path / "src" / "deep" / "f.txt").write_text("folder upload")
        box.upload(tmp_path / "src", "/work")
        assert box.exec("cat /work/deep/f.txt").stdout == "folder upload"
        box.download("/work", tmp_path / "back")
        assert (tmp_path / "back" / "deep" / "f.txt").read_text() == "folder upload"


def test_sandbox_lifecycle_routes(http, base_image):
    created = http.post("/sandboxes", json={"image": base_image, "cpu": "999", "memory": "9999Gi"})
    assert created.status_code == 200
    body = created.json()
    assert body["status"] == "pending" and body["block_network"] is True and body["timeout"] == 3600
    sandbox_id = body["sandbox_id"]
    early = http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": "echo early", "wait": True}).json()
    assert early["stdout"] == "early\n"  # an exec on a pending sandbox waits for it
    ready = http.get(f"/sandboxes/{sandbox_id}/wait", params={"timeout": 60}).json()
    assert ready["ready"] is True and ready["status"] == "ready"
    # echoed as asked; clamped to this host, not refused
    assert (ready["cpu"], ready["memory"]) == ("999", "9999Gi")
    assert ready["allocated"] == {"cpu": float(os_cpus()), "memory_bytes": host_memory()}
    pods = http.get("/resources").json()["sandbox_pods"]
    assert {"name": ready["pod_name"], "phase": "Running", "cpu_request": float(os_cpus())}.items() <= next(
        pod for pod in pods if pod["sandbox_id"] == sandbox_id
    ).items()
    assert sandbox_id in [s["sandbox_id"] for s in http.get("/sandboxes").json()["sandboxes"]]

    job = http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": "sleep 0.5; echo later"}).json()
    assert job["status"] == "queued"
    assert http.get(f"/jobs/{job['job_id']}").json()["status"] in ("queued", "running")
    done = http.get(f"/jobs/{job['job_id']}/wait", params={"timeout": 30}).json()
    assert (done["status"], done["stdout"], done["stderr"], done["exit_code"]) == ("succeeded", "later\n", "", 0)
    assert done["started_at"] <= done["completed_at"]

    failed = http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": ["sh", "-c", "exit 3"], "wait": True}).json()
    assert (failed["status"], failed["exit_code"], failed["command"]) == ("failed", 3, "sh -c 'exit 3'")
    slow = http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": "sleep 5", "timeout_seconds": 0.5, "wait": True})
    assert slow.json()["exit_code"] == 124 and "timed out" in slow.json()["error"]
    refused = http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": "true", "cwd": "/nope", "wait": True})
    assert refused.status_code == 200
    assert (refused.json()["status"], refused.json()["exit_code"]) == ("failed", None)
    assert "cwd does not exist: /nope" in refused.json()["error"]

    assert http.delete(f"/sandboxes/{sandbox_id}").json() == {"status": "deleted", "sandbox_id": sandbox_id}
    assert http.delete(f"/sandboxes/{sandbox_id}").status_code == 200  # idempotent
    assert http.get(f"/sandboxes/{sandbox_id}").status_code == 404
    assert http.post("/sandboxes", json={"image": base_image, "network": "wide"}).status_code == 422


def test_the_network_extension_overrides_block_network(http, remote, base_image):
    """`network` (ours) says what `block_network` cannot: a `dropped` sandbox, through the SDK too."""
    with remote.create(base_image, network="dropped") as box:
        shown = http.get(f"/sandboxes/{box.id}").json()
        assert (shown["network"], shown["block_network"]) == ("dropped", True)
        connect = "python3 -c \"import socket; socket.create_connection(('10.255.255.1', 80), timeout=0.5)\""
        assert "TimeoutError" in box.exec(connect).stderr
    created = http.post("/sandboxes", json={"image": base_image, "block_network": False, "network": "blocked"}).json()
    assert (created["network"], created["block_network"]) == ("blocked", True)
    http.delete(f"/sandboxes/{created['sandbox_id']}")


def os_cpus() -> int:
    import os

    return os.cpu_count() or 1


def test_file_and_patch_routes(http, sandbox_id):
    content = base64.b64encode(b"\x00data").decode()
    put = http.post(f"/sandboxes/{sandbox_id}/files", json={"path": "d/f.bin", "content": content}).json()
    assert put == {"success": True, "path": "d/f.bin", "size": 5}
    got = http.get(f"/sandboxes/{sandbox_id}/files", params={"path": "d/f.bin"}).json()
    assert got == {"path": "d/f.bin", "content": content, "size": 5}
    assert http.get(f"/sandboxes/{sandbox_id}/files", params={"path": "nope"}).status_code == 404
    assert http.get(f"/sandboxes/{sandbox_id}/files", params={"path": "d"}).status_code == 400
    assert http.get(f"/sandboxes/{sandbox_id}/files", params={"path": ""}).status_code == 400
    listing = http.get(f"/sandboxes/{sandbox_id}/files/list", params={"path": "d"}).json()
    assert [(f["name"], f["type"], f["size"]) for f in listing["files"]] == [("f.bin", "file", 5)]
    assert http.get(f"/sandboxes/{sandbox_id}/files/list", params={"path": "d/f.bin"}).status_code == 400
    tar = http.get(f"/sandboxes/{sandbox_id}/archive", params={"path": "d"})
    assert tar.headers["content-type"] == "application/x-tar"
    assert http.put(f"/sandboxes/{sandbox_id}/archive", params={"path": "copy"}, content=tar.content).status_code == 200
    copied = http.get(f"/sandboxes/{sandbox_id}/files", params={"path": "copy/d/f.bin"}).json()
    assert copied["content"] == content

    patch = "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+patched\n"
    applied = http.post(f"/sandboxes/{sandbox_id}/apply_patch", json={"patch": patch}).json()
    assert applied["success"] is True, applied
    again = http.post(f"/sandboxes/{sandbox_id}/apply_patch", json={"patch": patch}).json()
    assert again["success"] is False and "already exists" in again["stderr"]


def test_bad_requests_name_the_problem(http, sandbox_id):
    for body, field in [
        ({}, "image"),
        ({"image": "x", "memory": "lots"}, "memory"),
        ({"image": "x", "memory": "1e400"}, "memory"),
        ({"image": "x", "cpu": "nan"}, "cpu"),
        ({"image": "x", "cpu": "-1"}, "cpu"),
        ({"image": "x", "sandbox_id": "../etc"}, "sandbox_id"),
        ({"image": "x", "timeout": "soon"}, "timeout"),
    ]:
        answer = http.post("/sandboxes", json=body)
        assert answer.status_code == 422 and answer.json()["message"].startswith(field), (body, answer.text)
        assert answer.json()["detail"][0]["loc"] == ["body", field]  # FastAPI's list, as published clients read it
    assert http.get("/sandboxes/doesnotexist").status_code == 404
    assert http.post("/sandboxes/doesnotexist/exec", json={"command": "true"}).status_code == 404
    assert http.get("/jobs/nope").status_code == 404
    assert http.delete("/sandboxes/%2E%2E").json() == {"status": "deleted", "sandbox_id": ".."}  # never a path
    assert http.get("/sandboxes/%2E%2E").status_code == 404
    wrong_type = http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": 5})
    assert wrong_type.status_code == 422 and "command" in wrong_type.json()["message"]
    over = base64.b64encode(b"x" * (2**20 + 1)).decode()  # the fixture's limit is 1 MiB
    too_big = http.post(f"/sandboxes/{sandbox_id}/files", json={"path": "big", "content": over})
    assert too_big.status_code == 413 and "too large" in too_big.json()["detail"]
    huge = http.post(f"/sandboxes/{sandbox_id}/files", json={"path": "big", "content": over * 2})
    assert huge.status_code == 413
    assert http.get(f"/sandboxes/{sandbox_id}/files", params={"path": "big"}).status_code == 404


def test_duplicate_id_is_409_and_harms_nothing(http, remote, base_image, sandbox_id):
    again = http.post("/sandboxes", json={"image": base_image, "sandbox_id": sandbox_id})
    assert again.status_code == 409 and sandbox_id in again.json()["detail"]
    with pytest.raises(Conflict):
        remote.create(base_image, sandbox_id=sandbox_id)
    alive = http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": "echo alive", "wait": True}).json()
    assert alive["stdout"] == "alive\n"


def test_failed_starts_are_reported_at_once_and_cleaned(http, remote, base_image, docker_client):
    unknown = http.post("/sandboxes", json={"image": "orchard/nope:0"})
    assert unknown.status_code == 200
    body = unknown.json()
    assert body["status"] == "failed" and "orchard/nope:0" in body["status_message"]
    assert http.get(f"/sandboxes/{body['sandbox_id']}").json()["status"] == "failed"

    sandbox_id = http.post("/sandboxes", json={"image": base_image, "memory": "6Mi"}).json()["sandbox_id"]
    started = time.monotonic()
    status = http.get(f"/sandboxes/{sandbox_id}/wait", params={"timeout": 60}).json()
    assert status["status"] == "failed" and "exited" in status["status_message"]
    assert time.monotonic() - started < 30
    assert not docker_client.api.containers(all=True, filters={"name": f"orchard-{sandbox_id}"})
    with pytest.raises(SandboxError, match="exited"):
        remote.create(base_image, memory="6Mi")
    with pytest.raises(SandboxError, match="not found"):
        remote.create("orchard/nope:0")


def test_wait_times_out_with_408(http, base_image):
    sandbox_id = http.post("/sandboxes", json={"image": base_image}).json()["sandbox_id"]
    try:
        answer = http.get(f"/sandboxes/{sandbox_id}/wait", params={"timeout": 0})
        assert answer.status_code == 408 and sandbox_id in answer.json()["detail"]
    finally:
        http.delete(f"/sandboxes/{sandbox_id}")


def test_a_dead_container_shows_as_failed(http, sandbox_id, docker_client):
    docker_client.containers.get(f"orchard-{sandbox_id}").kill()
    status = http.get(f"/sandboxes/{sandbox_id}").json()
    assert status["status"] == "failed" and "stopped" in status["status_message"]


def test_silent_heartbeats_get_a_sandbox_reaped(http, sandbox_id, docker_client):
    """The fixture's service reaps after 1.5 s of silence (180 s by default)."""
    assert http.post(f"/sandboxes/{sandbox_id}/heartbeat").json() == {"status": "ok", "sandbox_id": sandbox_id}
    for _ in range(600):  # a busy engine (the other test worker) can take seconds to remove it
        if http.get(f"/sandboxes/{sandbox_id}").status_code == 404:
            break
        time.sleep(0.1)
    assert http.get(f"/sandboxes/{sandbox_id}").status_code == 404
    assert not docker_client.api.containers(all=True, filters={"name": f"orchard-{sandbox_id}"})


def test_a_sandbox_made_again_under_an_id_does_not_inherit_the_earlier_ones_heartbeats(http, base_image):
    """An id deleted after heartbeats and created again starts with none: the new sandbox is not
    reaped for the old one's silence."""
    sandbox_id = f"again-{time.time_ns() % 10**9}"
    assert http.post("/sandboxes", json={"image": base_image, "sandbox_id": sandbox_id}).status_code == 200
    assert http.get(f"/sandboxes/{sandbox_id}/wait", params={"timeout": 60}).json()["ready"]
    assert http.post(f"/sandboxes/{sandbox_id}/heartbeat").status_code == 200
    assert http.delete(f"/sandboxes/{sandbox_id}").status_code == 200
    assert http.post("/sandboxes", json={"image": base_image, "sandbox_id": sandbox_id}).status_code == 200
    try:
        assert http.get(f"/sandboxes/{sandbox_id}/wait", params={"timeout": 60}).json()["ready"]
        time.sleep(3.0)  # twice the fixture's heartbeat silence, six housekeeping rounds
        assert http.get(f"/sandboxes/{sandbox_id}").json()["status"] == "ready"
    finally:
        http.delete(f"/sandboxes/{sandbox_id}")


async def test_async_sdk_through_the_service(service, base_image):
    from orchard.env import AsyncClient

    url, key = service
    async with AsyncClient(url=url, api_key=key) as client:
        box = await client.create(base_image)
        result = await box.exec("echo async")
        assert result.stdout == "async\n"
        await box.write_file("x.txt", "y")
        assert await box.read_file("x.txt") == b"y"
        await box.delete()


def test_warm_pool_through_the_service(http, base_image):
    assert http.post("/pools", json={"image": base_image, "size": 1, "memory": "1Gi"}).json()["size"] == 1
    for _ in range(600):
        pools = http.get("/pools").json()["pools"]
        if pools and pools[0]["ready"] == 1:
            break
        time.sleep(0.05)
    created = http.post("/sandboxes", json={"image": base_image, "memory": "1Gi"}).json()
    assert created["status"] == "ready" and created["ready"] is True  # handed over, not started
    run = http.post(f"/sandboxes/{created['sandbox_id']}/exec", json={"command": "echo pooled", "wait": True})
    assert run.json()["stdout"] == "pooled\n"
    assert http.post("/pools", json={"image": base_image, "size": 0, "memory": "1Gi"}).status_code == 200
    http.delete(f"/sandboxes/{created['sandbox_id']}")


async def test_async_sdk_through_the_service_has_what_the_sync_one_has(service, http, base_image):
    """Warm, keep, list, attach and terminals (over the WebSocket) through `orchard up`."""
    from orchard.env import AsyncClient

    url, key = service
    async with AsyncClient(url=url, api_key=key) as client:
        await client.warm(base_image, 1, memory="1Gi")  # the pool of test_warm_pool_through_the_service
        sizes = [(p["image"], p["size"]) for p in http.get("/pools").json()["pools"]]
        assert (base_image, 1) in sizes
        await client.warm(base_image, 0, memory="1Gi")
        kept = await client.create(base_image, keep=True)
        assert kept.image == base_image
        assert kept.id in [row["sandbox_id"] for row in await client.list()]
    assert http.get(f"/sandboxes/{kept.id}").json()["status"] == "ready"  # it outlived its client
    async with AsyncClient(url=url, api_key=key) as other:
        box = other.attach(kept.id)
        assert (await box.exec("echo attached")).stdout == "attached\n"
        async with await box.terminal(["bash", "-c", "read line; echo got:$line; exit 7"]) as term:
            assert (await term.recv())["type"] == "ready"
            await term.write("ping\n")
            assert b"got:ping" in await term.read_until(b"got:ping")
            assert await term.wait() == 7
        await box.delete()
    assert http.get(f"/sandboxes/{kept.id}").status_code == 404
    async with AsyncClient(url=url, api_key="wrong") as stranger:
        with pytest.raises(InvalidRequest, match="API key"):
            await stranger.attach(kept.id).terminal()


def test_overload_is_503_and_the_sdk_waits_it_out(base_image, tmp_path, start_service):
    """One sandbox may start at a time: the second create is refused, then retried by the SDK."""
    from concurrent.futures import ThreadPoolExecutor

    with start_service(tmp_path / "o.db", max_starting=1) as (url, key):
        with httpx.Client(base_url=url, headers={"X-API-Key": key}) as http:
            first = http.post("/sandboxes", json={"image": base_image})
            second = http.post("/sandboxes", json={"image": base_image})
            assert first.status_code == 200
            assert second.status_code == 503 and second.headers["retry-after"] == "1"
            assert "starting already" in second.json()["detail"]
            http.get(f"/sandboxes/{first.json()['sandbox_id']}/wait")
        with Client(url=url, api_key=key) as client, ThreadPoolExecutor(3) as pool:
            boxes = list(pool.map(lambda _: client.create(base_image), range(3)))
            assert [box.exec("echo ok").stdout for box in boxes] == ["ok\n"] * 3
