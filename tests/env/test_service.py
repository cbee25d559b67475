"""The `orchard up` service: the Orchard Env API over real HTTP, through the SDK and raw requests."""

from __future__ import annotations

import base64
import time

import httpx
import pytest

from orchard.env import Client
from orchard.errors import AuthError, InvalidRequest, NotFound, SandboxError

pytestmark = pytest.mark.docker


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


def test_open_routes_and_auth(service):
    url, _key = service
    assert httpx.get(f"{url}/").json()["status"] == "running"
    assert httpx.get(f"{url}/health").json() == {"status": "healthy"}
    assert httpx.get(f"{url}/resources").status_code == 401
    assert httpx.get(f"{url}/resources", headers={"X-API-Key": "wrong"}).status_code == 403
    with pytest.raises(AuthError), Client(url=url, api_key="wrong") as client:
        client.create("orchard/base:bookworm")


def test_sdk_through_the_service_runs_in_an_image_without_python(remote, busybox_image):
    with remote.create(busybox_image) as box:
        result = box.exec("echo hi; which python3 || echo none")
        assert (result.exit_code, result.stdout) == (0, "hi\nnone\n")
        assert box.exec(["sh", "-c", "exit 4"]).exit_code == 4
        box.write_file("/tmp/b", bytes(range(256)))
        assert box.read_file("/tmp/b") == bytes(range(256))
        assert [f.name for f in box.list_files("/tmp")] == ["b"]
        with pytest.raises(InvalidRequest, match="cwd does not exist"):
            box.exec("true", cwd="/nope")


def test_sandbox_lifecycle_routes(http, base_image):
    created = http.post("/sandboxes", json={"image": base_image, "cpu": "999", "memory": "9999Gi"})
    assert created.status_code == 200
    body = created.json()
    assert body["status"] == "pending" and body["block_network"] is True and body["timeout"] == 3600
    sandbox_id = body["sandbox_id"]
    ready = http.get(f"/sandboxes/{sandbox_id}/wait", params={"timeout": 60}).json()
    assert ready["ready"] is True and ready["status"] == "ready"
    assert float(ready["cpu"]) <= 64  # clamped to the host, not refused
    assert http.post(f"/sandboxes/{sandbox_id}/heartbeat").json() == {"status": "ok", "sandbox_id": sandbox_id}
    assert sandbox_id in http.get("/resources").json()["sandbox_pods"]

    job = http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": "sleep 0.3; echo later"}).json()
    assert job["status"] == "queued"
    done = http.get(f"/jobs/{job['job_id']}/wait", params={"timeout": 30}).json()
    assert (done["status"], done["stdout"], done["stderr"], done["exit_code"]) == ("succeeded", "later\n", "", 0)
    assert done["started_at"] <= done["completed_at"]

    failed = http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": ["sh", "-c", "exit 3"], "wait": True}).json()
    assert (failed["status"], failed["exit_code"], failed["command"]) == ("failed", 3, "sh -c 'exit 3'")
    slow = http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": "sleep 5", "timeout_seconds": 0.5, "wait": True})
    assert slow.json()["exit_code"] == 124 and "timed out" in slow.json()["error"]

    content = base64.b64encode(b"\x00data").decode()
    put = http.post(f"/sandboxes/{sandbox_id}/files", json={"path": "d/f.bin", "content": content}).json()
    assert put == {"success": True, "path": "d/f.bin", "size": 5}
    got = http.get(f"/sandboxes/{sandbox_id}/files", params={"path": "d/f.bin"}).json()
    assert got == {"path": "d/f.bin", "content": content, "size": 5}
    assert http.get(f"/sandboxes/{sandbox_id}/files", params={"path": "nope"}).status_code == 404
    assert http.get(f"/sandboxes/{sandbox_id}/files", params={"path": "d"}).status_code == 400
    listing = http.get(f"/sandboxes/{sandbox_id}/files/list", params={"path": "d"}).json()
    assert [(f["name"], f["type"], f["size"]) for f in listing["files"]] == [("f.bin", "file", 5)]

    patch = "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+patched\n"
    applied = http.post(f"/sandboxes/{sandbox_id}/apply_patch", json={"patch": patch}).json()
    assert applied["success"] is True, applied

    assert http.delete(f"/sandboxes/{sandbox_id}").json() == {"status": "deleted", "sandbox_id": sandbox_id}
    assert http.delete(f"/sandboxes/{sandbox_id}").status_code == 200  # idempotent
    assert http.get(f"/sandboxes/{sandbox_id}").status_code == 404


def test_bad_requests_name_the_problem(http, base_image):
    missing = http.post("/sandboxes", json={})
    assert missing.status_code == 422 and "image" in missing.json()["detail"]
    bad_memory = http.post("/sandboxes", json={"image": base_image, "memory": "lots"})
    assert bad_memory.status_code == 400 and "memory" in bad_memory.json()["detail"]
    unknown = http.post("/sandboxes", json={"image": "orchard/nope:0"})
    assert unknown.status_code == 404 and "orchard/nope:0" in unknown.json()["detail"]
    assert http.get("/sandboxes/doesnotexist").status_code == 404
    assert http.post("/sandboxes/doesnotexist/exec", json={"command": "true"}).status_code == 404
    assert http.get("/jobs/nope").status_code == 404
    sandbox_id = http.post("/sandboxes", json={"image": base_image}).json()["sandbox_id"]
    try:
        http.get(f"/sandboxes/{sandbox_id}/wait", params={"timeout": 60})
        wrong_type = http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": 5})
        assert wrong_type.status_code == 422 and "command" in wrong_type.json()["detail"]
        over = base64.b64encode(b"x" * (2**20 + 1)).decode()  # the fixture's limit is 1 MiB
        too_big = http.post(f"/sandboxes/{sandbox_id}/files", json={"path": "big", "content": over})
        assert too_big.status_code == 413 and "too large" in too_big.json()["detail"]
        huge = http.post(f"/sandboxes/{sandbox_id}/files", json={"path": "big", "content": over * 2})
        assert huge.status_code == 413
        assert http.get(f"/sandboxes/{sandbox_id}/files", params={"path": "big"}).status_code == 404
    finally:
        http.delete(f"/sandboxes/{sandbox_id}")


def test_failed_start_is_reported_at_once_and_cleaned(http, remote, base_image, docker_client):
    sandbox_id = http.post("/sandboxes", json={"image": base_image, "memory": "6Mi"}).json()["sandbox_id"]
    started = time.monotonic()
    status = http.get(f"/sandboxes/{sandbox_id}/wait", params={"timeout": 60}).json()
    assert status["status"] == "failed" and "exited" in status["status_message"]
    assert time.monotonic() - started < 30
    assert not docker_client.containers.list(all=True, filters={"name": f"orchard-{sandbox_id}"})
    with pytest.raises(SandboxError, match="exited"):
        remote.create(base_image, memory="6Mi")
    with pytest.raises(NotFound):
        remote.create("orchard/nope:0")


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


async def test_async_sdk_embedded(base_image, tmp_path):
    import asyncio

    from orchard.env import AsyncClient

    async with AsyncClient(db_url=f"sqlite:///{tmp_path}/o.db") as client:
        boxes = await asyncio.gather(*(client.create(base_image) for _ in range(3)))
        outputs = await asyncio.gather(*(box.exec(f"echo {i}") for i, box in enumerate(boxes)))
        assert [o.stdout for o in outputs] == ["0\n", "1\n", "2\n"]
