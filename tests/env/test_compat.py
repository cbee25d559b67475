"""Compatibility with the published Orchard Env API, spoken on the wire exactly as its SDK speaks it.

Clients written for the published service must work against `orchard up` unchanged (issue 14).
Every request here is written from the published SDK's *wire behaviour* (the bodies it sends, the
query parameters, the fields it reads, the frames of its PTY handles), not from its code, which is
neither vendored nor imported: plain httpx for REST, the `websockets` client for the PTY, against
a real service on loopback and real Docker sandboxes.

What is checked: create as the SDK sends it (Kubernetes quantities echoed, Kubernetes names as
ids, nulls meaning the defaults); the sandbox object (`pod_name`, `status_message`), `/wait`,
idempotent DELETE and heartbeats; exec as the SDK sends it (`timeout_seconds: null` and friends),
the job object and its lifecycle polled every 0.1 s, time-outs, login shells, env, cwd and list
commands; one sandbox's jobs running one at a time in submission order (and `concurrent: true`,
ours, beside them); 404 for exec on a failed or unknown sandbox; FastAPI's 422 `detail` list;
files, listings and patches; `/resources`; X-Request-ID; the PTY WebSocket (the published
benchmark's four checks, resize, signals, pings, refusal at the handshake); auth and JSON content
types. Where ours decided otherwise than published (the client's X-Request-ID is echoed, exec on
a failed sandbox is 404 at once), the test holds our decision.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shlex
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from orchard.env.service import host_memory

CREATE_KEYS = {"sandbox_id", "namespace", "image", "block_network", "cpu", "memory", "timeout", "status"}
"""The keys of the published create answer (ours may add more)."""
SANDBOX_KEYS = {
    "sandbox_id",
    "namespace",
    "image",
    "pod_name",
    "block_network",
    "cpu",
    "memory",
    "created_at",
    "ready",
    "status",
    "status_message",
}
"""The keys of the published sandbox object (`GET /sandboxes/{id}` and `/wait`)."""
JOB_KEYS = {
    "job_id",
    "sandbox_id",
    "command",
    "status",
    "stdout",
    "stderr",
    "exit_code",
    "created_at",
    "started_at",
    "completed_at",
    "error",
}
"""The 11 keys of the published job object."""
FINAL = ("succeeded", "failed")
NUMBER = (int, float)


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def service(default_service) -> tuple[str, str]:
    """`orchard up` with its default settings (the shared fixture reaps a sandbox 1.5 s after its
    last heartbeat, which a heartbeat test on the shared sandbox cannot live with)."""
    return default_service


@pytest.fixture(scope="module")
def http(service) -> Iterator[httpx.Client]:
    """A plain HTTP client holding the key as the SDK does: the `X-API-Key` session header."""
    url, key = service
    with httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=60) as http:
        yield http


class Box(NamedTuple):
    id: str
    created: dict[str, Any]
    """The create answer, as the SDK read it."""


@pytest.fixture(scope="module")
def box(http, base_image) -> Iterator[Box]:
    """One ready sandbox, created exactly as the SDK's `create_sandbox(image)` does it."""
    created = http.post("/sandboxes", json={"image": base_image, "block_network": True})
    assert created.status_code == 200, created.text
    answer = created.json()
    sdk_wait(http, answer)
    yield Box(answer["sandbox_id"], answer)
    http.delete(f"/sandboxes/{answer['sandbox_id']}")


@pytest.fixture
def make_sandbox(http) -> Iterator[Callable[[dict[str, Any]], dict[str, Any]]]:
    """`make_sandbox(body)`: POST /sandboxes, expect 200, and delete it when the test ends."""
    made: list[str] = []

    def make(body: dict[str, Any]) -> dict[str, Any]:
        answer = http.post("/sandboxes", json=body)
        assert answer.status_code == 200, answer.text
        made.append(answer.json()["sandbox_id"])
        return answer.json()

    yield make
    for sandbox_id in made:
        http.delete(f"/sandboxes/{sandbox_id}")


# -- the SDK's requests, written from its wire behaviour ------------------------------------------


def sdk_wait(http: httpx.Client, created: dict[str, Any]) -> httpx.Response:
    """What `create_sandbox` does after the POST: `GET /wait?timeout=<the answer's timeout, an int>`."""
    timeout = int(created.get("timeout") or 3600)
    return http.get(f"/sandboxes/{created['sandbox_id']}/wait", params={"timeout": timeout}, timeout=timeout + 30)


def exec_body(
    command: str | list[str],
    *,
    timeout: int | None = None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    login_shell: bool = False,
    wait: bool = True,
) -> dict[str, Any]:
    """The body the SDK's `exec()` POSTs: every key always, `null` for what the caller left out."""
    return {
        "command": command,
        "timeout_seconds": timeout,
        "cwd": cwd,
        "env": env,
        "login_shell": login_shell,
        "wait": wait,
    }


def sdk_exec(http: httpx.Client, sandbox_id: str, command: str | list[str], **options: Any) -> dict[str, Any]:
    """Run a command as the SDK's `exec()` does: POST with `wait: true`; if the answer is not final,
    poll `GET /jobs/{id}` every 0.1 s. The HTTP timeout and the deadline are `(timeout or 300) + 60`."""
    limit = (options.get("timeout") or 300) + 60
    answer = http.post(f"/sandboxes/{sandbox_id}/exec", json=exec_body(command, **options), timeout=limit)
    assert answer.status_code == 200, answer.text
    job = answer.json()
    return job if job["status"] in FINAL else poll_job(http, job["job_id"], deadline=limit)


def submit(http: httpx.Client, sandbox_id: str, command: str, **extra: Any) -> str:
    """POST an exec with `wait: false` (the SDK's body otherwise): the answer is `{job_id, status: queued}`."""
    answer = http.post(f"/sandboxes/{sandbox_id}/exec", json={**exec_body(command, wait=False), **extra})
    assert answer.status_code == 200, answer.text
    queued = answer.json()
    assert queued["status"] == "queued" and isinstance(queued["job_id"], str), queued
    return queued["job_id"]


def poll_job(http: httpx.Client, job_id: str, *, deadline: float = 60, seen: list[str] | None = None) -> dict:
    """`GET /jobs/{id}` every 0.1 s until the job is final, as the SDK polls; `seen` collects the statuses."""
    end = time.monotonic() + deadline
    while True:
        answer = http.get(f"/jobs/{job_id}")
        assert answer.status_code == 200, answer.text
        job = answer.json()
        if seen is not None:
            seen.append(job["status"])
        if job["status"] in FINAL:
            return job
        assert time.monotonic() < end, f"job {job_id} still {job['status']} after {deadline} s"
        time.sleep(0.1)


def read_file(http: httpx.Client, sandbox_id: str, path: str) -> bytes:
    """`download_content`: `GET /files?path=`, reading `content` (base64)."""
    answer = http.get(f"/sandboxes/{sandbox_id}/files", params={"path": path})
    assert answer.status_code == 200, answer.text
    return base64.b64decode(answer.json()["content"])


def is_json(response: httpx.Response) -> bool:
    """The async SDK's `response.json()` (aiohttp) refuses any other Content-Type."""
    return response.headers.get("content-type", "").split(";")[0].strip() == "application/json"


# -- create -----------------------------------------------------------------------------------------


def test_create_answer_as_the_sdk_reads_it(box, base_image):
    """`{"image", "block_network"}` only: the published keys, the defaults echoed."""
    created = box.created
    assert created.keys() >= CREATE_KEYS, created
    assert isinstance(created["sandbox_id"], str) and created["sandbox_id"]
    assert isinstance(created["namespace"], str)
    assert (created["image"], created["block_network"], created["timeout"]) == (base_image, True, 3600)
    assert (created["cpu"], created["memory"]) == ("4", "16Gi")  # the defaults, as asked, never rewritten
    assert created["status"] in ("pending", "ready")


@pytest.mark.parametrize(
    ("cpu", "memory", "cores", "size"),
    [
        ("2000m", "512Mi", 2.0, 512 * 2**20),
        ("0.5", "1Gi", 0.5, 2**30),
        ("2", "1G", 2.0, 10**9),
        ("1", "1e9", 1.0, 10**9),
    ],
)
def test_create_takes_kubernetes_quantities_and_echoes_them(
    http, make_sandbox, docker_client, base_image, cpu, memory, cores, size
):
    """cpu in cores or millicores and memory with Kubernetes suffixes, as the benchmarks send them
    (`block_network: false`); the answer echoes them as sent; the sandbox gets what they mean
    (at most what this host has)."""
    created = make_sandbox({"image": base_image, "block_network": False, "cpu": cpu, "memory": memory, "timeout": 600})
    assert (created["cpu"], created["memory"], created["timeout"]) == (cpu, memory, 600)
    waited = sdk_wait(http, created)
    assert waited.status_code == 200 and waited.json()["ready"] is True, waited.text
    assert (waited.json()["cpu"], waited.json()["memory"]) == (cpu, memory)
    limits = docker_client.containers.get(f"orchard-{created['sandbox_id']}").attrs["HostConfig"]
    assert limits["NanoCpus"] == int(min(cores, os.cpu_count() or 1) * 1e9)
    assert limits["Memory"] == min(size, host_memory())


def test_null_means_the_default_for_every_optional_create_field(http, make_sandbox, base_image):
    """`sandbox_id`, `cpu`, `memory` and `timeout` are Optional in published: null is the default.
    `/wait` without a timeout waits (its default is long), here until the sandbox is ready."""
    body = {
        "image": base_image,
        "block_network": True,
        "sandbox_id": None,
        "cpu": None,
        "memory": None,
        "timeout": None,
    }
    created = make_sandbox(body)
    assert isinstance(created["sandbox_id"], str) and created["sandbox_id"]
    assert (created["cpu"], created["memory"], created["timeout"]) == ("4", "16Gi", 3600)
    waited = http.get(f"/sandboxes/{created['sandbox_id']}/wait", timeout=120)
    assert waited.status_code == 200 and waited.json()["status"] == "ready", waited.text


@pytest.mark.parametrize(
    "make_id",
    [
        lambda: f"my.box-{secrets.token_hex(3)}",
        lambda: f"compat.{secrets.token_hex(3)}-".ljust(63, "x"),  # Kubernetes' longest: 63 characters
    ],
    ids=["dotted", "63-chars"],
)
def test_sandbox_ids_are_what_kubernetes_accepts(http, make_sandbox, base_image, make_id):
    sandbox_id = make_id()
    created = make_sandbox({"image": base_image, "block_network": True, "sandbox_id": sandbox_id})
    assert created["sandbox_id"] == sandbox_id
    shown = http.get(f"/sandboxes/{sandbox_id}")
    assert shown.status_code == 200 and shown.json()["sandbox_id"] == sandbox_id, shown.text


# -- the sandbox object, /wait, delete, heartbeat --------------------------------------------------


def test_sandbox_object_has_the_published_keys(http, box):
    shown = http.get(f"/sandboxes/{box.id}")
    assert shown.status_code == 200, shown.text
    sandbox = shown.json()
    assert sandbox.keys() >= SANDBOX_KEYS, sandbox
    assert isinstance(sandbox["pod_name"], str) and sandbox["pod_name"]
    assert sandbox["status_message"] == ""  # a string, empty when there is nothing to say
    assert (sandbox["ready"], sandbox["status"], sandbox["block_network"]) == (True, "ready", True)
    assert isinstance(sandbox["created_at"], NUMBER) and isinstance(sandbox["namespace"], str)
    assert isinstance(sandbox["cpu"], str) and isinstance(sandbox["memory"], str)


def test_wait_answers_a_ready_sandbox_at_once_with_the_sandbox_object(http, box):
    for params in ({}, {"timeout": 3600}):  # the default, and what the SDK sends after a create
        started = time.monotonic()
        waited = http.get(f"/sandboxes/{box.id}/wait", params=params)
        assert waited.status_code == 200, waited.text
        assert waited.json().keys() >= SANDBOX_KEYS and waited.json()["ready"] is True
        assert isinstance(waited.json()["pod_name"], str) and waited.json()["pod_name"]
        assert waited.json()["status_message"] == ""
        assert time.monotonic() - started < 5


def test_delete_is_idempotent_and_200_for_unknown_ids(http, make_sandbox, base_image):
    sandbox_id = make_sandbox({"image": base_image, "block_network": True})["sandbox_id"]
    for _ in range(2):
        deleted = http.delete(f"/sandboxes/{sandbox_id}")
        assert deleted.status_code == 200 and is_json(deleted)
        assert deleted.json() == {"status": "deleted", "sandbox_id": sandbox_id}
    assert http.get(f"/sandboxes/{sandbox_id}").status_code == 404
    unknown = http.delete("/sandboxes/never-was-0")
    assert unknown.status_code == 200 and unknown.json() == {"status": "deleted", "sandbox_id": "never-was-0"}


def test_heartbeat(http, box):
    """`start_heartbeat()`: POST with no body; 404 for an unknown sandbox."""
    beat = http.post(f"/sandboxes/{box.id}/heartbeat")
    assert beat.status_code == 200 and is_json(beat)
    assert beat.json() == {"status": "ok", "sandbox_id": box.id}
    assert http.post("/sandboxes/never-was-0/heartbeat").status_code == 404


# -- exec and jobs ----------------------------------------------------------------------------------


def test_exec_exactly_as_the_sdk_sends_it(http, box):
    """`sandbox.exec("echo hi")`: timeout_seconds, cwd and env go as null (issue 14's 422)."""
    job = sdk_exec(http, box.id, "echo hi")
    assert (job["status"], job["exit_code"], job["stdout"], job["stderr"]) == ("succeeded", 0, "hi\n", "")


def test_job_object_has_the_published_keys_and_types(http, box):
    done = sdk_exec(http, box.id, "echo out; echo err >&2; exit 3")
    for job in (done, http.get(f"/jobs/{done['job_id']}").json()):
        assert job.keys() >= JOB_KEYS, job
        assert all(isinstance(job[k], str) for k in ("job_id", "sandbox_id", "command", "status", "stdout", "stderr"))
        assert (job["sandbox_id"], job["status"], job["exit_code"]) == (box.id, "failed", 3)
        assert (job["stdout"], job["stderr"]) == ("out\n", "err\n")
        assert all(isinstance(job[k], NUMBER) for k in ("created_at", "started_at", "completed_at"))
        assert job["created_at"] <= job["started_at"] <= job["completed_at"]
        assert job["error"] is None or isinstance(job["error"], str)


def test_job_lifecycle_with_wait_false_then_polling(http, box):
    job_id = submit(http, box.id, "sleep 0.5; echo later")
    seen: list[str] = []
    done = poll_job(http, job_id, seen=seen)
    assert (done["status"], done["stdout"], done["exit_code"]) == ("succeeded", "later\n", 0)
    order = ["queued", "running", "succeeded"]
    assert set(seen) <= set(order) and [order.index(s) for s in seen] == sorted(order.index(s) for s in seen)
    assert "running" in seen  # half a second of sleep is seen at 0.1 s polls
    waited = http.get(f"/jobs/{job_id}/wait", params={"timeout": 300})
    assert waited.status_code == 200 and waited.json()["status"] == "succeeded"


def test_timeout_seconds_zero_means_the_default(http, box):
    job = sdk_exec(http, box.id, "echo zero", timeout=0)
    assert (job["status"], job["stdout"]) == ("succeeded", "zero\n")


def test_a_command_past_its_timeout_exits_124(http, box):
    started = time.monotonic()
    job = sdk_exec(http, box.id, "sleep 10", timeout=1)
    assert (job["status"], job["exit_code"]) == ("failed", 124)
    assert "timed out" in (job["error"] or "").lower()
    assert time.monotonic() - started < 8


def test_login_shell(http, box):
    """The benchmark's fourth command, and a login shell it is."""
    job = sdk_exec(http, box.id, "cat /etc/os-release | head -1; shopt -q login_shell && echo LOGIN", login_shell=True)
    assert job["status"] == "succeeded", job
    assert job["stdout"].endswith("LOGIN\n") and len(job["stdout"].splitlines()) == 2


def test_login_shell_sources_bashrc_past_its_interactivity_guard(http, box):
    """Published runs `bash --login -i` and sources ~/.bashrc, so the usual `case $- in *i*)` guard of
    Debian's and SWE-bench's .bashrc (conda activation after it) does not stop it."""
    guarded = "case $- in *i*) ;; *) return;; esac\nexport COMPAT_BASHRC=sourced\n"
    saved = sdk_exec(
        http, box.id, f"cp -a ~/.bashrc /tmp/bashrc.saved 2>/dev/null; printf %s {shlex.quote(guarded)} > ~/.bashrc"
    )
    try:
        assert saved["status"] == "succeeded", saved
        job = sdk_exec(http, box.id, 'echo "bashrc:$COMPAT_BASHRC"', login_shell=True)
        assert "bashrc:sourced" in job["stdout"], job
    finally:
        sdk_exec(
            http, box.id, "if [ -e /tmp/bashrc.saved ]; then mv /tmp/bashrc.saved ~/.bashrc; else rm -f ~/.bashrc; fi"
        )


def test_env_and_cwd(http, box):
    job = sdk_exec(http, box.id, 'echo "$GREETING"; pwd', cwd="/tmp", env={"GREETING": "hello"})
    assert (job["status"], job["stdout"]) == ("succeeded", "hello\n/tmp\n")


def test_list_commands(http, box):
    """A list runs as its words joined (published joins with spaces; words that need no quoting here)."""
    job = sdk_exec(http, box.id, ["echo", "hello", "world"])
    assert (job["status"], job["stdout"], job["command"]) == ("succeeded", "hello world\n", "echo hello world")


def test_one_sandboxs_jobs_run_one_at_a_time_in_submission_order(http, box):
    out = f"/tmp/order-{secrets.token_hex(4)}"
    first = submit(http, box.id, f"sleep 1; echo a >> {out}")
    second = submit(http, box.id, f"echo b >> {out}")
    first_done, second_done = poll_job(http, first), poll_job(http, second)
    assert (first_done["status"], second_done["status"]) == ("succeeded", "succeeded")
    assert read_file(http, box.id, out) == b"a\nb\n"
    assert second_done["started_at"] >= first_done["completed_at"]


def test_concurrent_true_runs_beside_the_queue(http, box):
    """Ours: `"concurrent": true` opts a job out of the sandbox's FIFO."""
    slow = submit(http, box.id, "sleep 2")
    answer = http.post(f"/sandboxes/{box.id}/exec", json={**exec_body("echo beside"), "concurrent": True})
    assert answer.status_code == 200 and answer.json()["stdout"] == "beside\n", answer.text
    assert answer.json()["completed_at"] < poll_job(http, slow)["completed_at"]


def test_exec_on_a_failed_or_unknown_sandbox_is_404(http, make_sandbox):
    failed = make_sandbox({"image": "orchard/no-such-image:0", "block_network": True})
    shown = sdk_wait(http, failed)
    assert shown.status_code == 200 and shown.json()["status"] == "failed", shown.text
    assert isinstance(shown.json()["status_message"], str) and shown.json()["status_message"]
    on_failed = http.post(f"/sandboxes/{failed['sandbox_id']}/exec", json=exec_body("true"))
    assert on_failed.status_code == 404 and isinstance(on_failed.json()["detail"], str), on_failed.text
    unknown = http.post("/sandboxes/never-was-0/exec", json=exec_body("true"))
    assert unknown.status_code == 404, unknown.text


@pytest.mark.parametrize(
    ("route", "body", "problem"),
    [
        (
            "/sandboxes/{id}/exec",
            {**exec_body("true"), "timeout_seconds": "soon"},  # not 2.5: fractional seconds are ours to accept
            {"loc": ["body", "timeout_seconds"], "input": "soon"},
        ),
        (
            "/sandboxes",
            {"block_network": True},
            {"type": "missing", "loc": ["body", "image"], "msg": "Field required", "input": {"block_network": True}},
        ),
    ],
    ids=["timeout-not-a-number", "missing-image"],
)
def test_422_keeps_fastapis_detail_list(http, box, route, body, problem):
    answer = http.post(route.format(id=box.id), json=body)
    assert answer.status_code == 422 and is_json(answer), answer.text
    detail = answer.json()["detail"]
    assert isinstance(detail, list) and len(detail) == 1, detail
    assert {"type", "loc", "msg", "input"} <= detail[0].keys() and isinstance(detail[0]["msg"], str)
    assert {k: detail[0][k] for k in problem} == problem


# -- files and patches ----------------------------------------------------------------------------


def test_upload_and_download(http, box):
    path, data = f"/tmp/compat-{secrets.token_hex(4)}/data.bin", bytes(range(256))
    content = base64.b64encode(data).decode()
    put = http.post(f"/sandboxes/{box.id}/files", json={"path": path, "content": content})
    assert put.status_code == 200, put.text
    assert {k: put.json()[k] for k in ("success", "path", "size")} == {"success": True, "path": path, "size": 256}
    got = http.get(f"/sandboxes/{box.id}/files", params={"path": path})
    assert got.status_code == 200
    assert {k: got.json()[k] for k in ("path", "content", "size")} == {"path": path, "content": content, "size": 256}
    assert http.get(f"/sandboxes/{box.id}/files", params={"path": f"{path}.missing"}).status_code == 404


def test_file_listing_entries(http, box):
    folder = f"/tmp/compat-list-{secrets.token_hex(4)}"
    for path in (f"{folder}/a.txt", f"{folder}/sub/b.txt"):
        upload = {"path": path, "content": base64.b64encode(b"hello").decode()}
        assert http.post(f"/sandboxes/{box.id}/files", json=upload).status_code == 200
    listing = http.get(f"/sandboxes/{box.id}/files/list", params={"path": folder})
    assert listing.status_code == 200, listing.text
    assert listing.json()["path"] == folder
    files = listing.json()["files"]
    assert [(f["name"], f["type"]) for f in files] == [("a.txt", "file"), ("sub", "directory")]
    assert files[0]["size"] == 5
    assert isinstance(files[1]["size"], int) and not isinstance(files[1]["size"], bool)
    now = datetime.now(UTC).replace(tzinfo=None)  # container time: no zone, whole seconds
    for entry in files:
        assert isinstance(entry["modified"], str), entry
        assert abs(datetime.strptime(entry["modified"], "%Y-%m-%dT%H:%M:%S") - now) < timedelta(days=1)


def test_apply_patch(http, box):
    """`apply_patch(patch)`: `{"patch", "timeout_seconds": 30}`, applied in /workspace."""
    name = f"compat-{secrets.token_hex(4)}.txt"
    patch = f"--- /dev/null\n+++ b/{name}\n@@ -0,0 +1 @@\n+patched\n"
    applied = http.post(f"/sandboxes/{box.id}/apply_patch", json={"patch": patch, "timeout_seconds": 30})
    assert applied.status_code == 200, applied.text
    assert {"success", "stdout", "stderr", "exit_code", "error"} <= applied.json().keys()
    assert (applied.json()["success"], applied.json()["exit_code"]) == (True, 0), applied.json()
    assert read_file(http, box.id, f"/workspace/{name}") == b"patched\n"
    again = http.post(f"/sandboxes/{box.id}/apply_patch", json={"patch": patch, "timeout_seconds": 30}).json()
    assert again["success"] is False and again["exit_code"] not in (0, None)


# -- /resources, X-Request-ID, auth, content types -------------------------------------------------


def _cores_and_bytes(amount: Any) -> bool:
    return isinstance(amount["cpu"], NUMBER) and isinstance(amount["memory_bytes"], int)


def test_resources_has_the_published_shape(http, box):
    answer = http.get("/resources")
    assert answer.status_code == 200, answer.text
    resources = answer.json()
    assert resources["nodes"] and all(
        isinstance(n["name"], str) and _cores_and_bytes(n["capacity"]) and _cores_and_bytes(n["allocatable"])
        for n in resources["nodes"]
    ), resources["nodes"]
    for total in ("total_capacity", "total_allocatable", "total_requested", "available"):
        assert _cores_and_bytes(resources[total]), (total, resources.get(total))
    pods = resources["sandbox_pods"]
    assert all({"name", "namespace", "phase", "cpu_request", "memory_request_bytes"} <= p.keys() for p in pods), pods
    sandbox = http.get(f"/sandboxes/{box.id}").json()
    mine = [p for p in pods if p["name"] == sandbox.get("pod_name")]
    assert len(mine) == 1, (sandbox.get("pod_name"), pods)
    assert mine[0]["namespace"] == sandbox["namespace"] and isinstance(mine[0]["phase"], str)
    assert isinstance(mine[0]["cpu_request"], NUMBER) and isinstance(mine[0]["memory_request_bytes"], int)


def test_every_response_has_a_fresh_x_request_id(service, http, box):
    url, _ = service
    answers = [
        httpx.get(f"{url}/health"),
        httpx.get(f"{url}/resources"),  # 401
        http.get("/resources"),
        http.get("/sandboxes/never-was-0"),  # 404
        http.post("/sandboxes", json={}),  # 422
        http.post(f"/sandboxes/{box.id}/heartbeat"),
    ]
    ids = [a.headers.get("x-request-id") for a in answers]
    assert all(ids) and len(set(ids)) == len(ids), ids


def test_the_clients_x_request_id_is_echoed(http):
    for route in ("/health", "/sandboxes/never-was-0"):
        answer = http.get(route, headers={"X-Request-ID": "compat-7f3a"})
        assert answer.headers.get("x-request-id") == "compat-7f3a", (route, dict(answer.headers))


def test_auth(service):
    url, key = service
    assert httpx.get(f"{url}/").json()["status"] == "running"
    assert httpx.get(f"{url}/health").json() == {"status": "healthy"}
    for method, route in (("GET", "/resources"), ("GET", "/sandboxes/never-was-0"), ("POST", "/sandboxes")):
        missing = httpx.request(method, f"{url}{route}", json={})  # refused before the body is validated
        wrong = httpx.request(method, f"{url}{route}", json={}, headers={"X-API-Key": key + "x"})
        assert (missing.status_code, wrong.status_code) == (401, 403), (route, missing.text, wrong.text)
        assert isinstance(missing.json()["detail"], str) and isinstance(wrong.json()["detail"], str)


def test_every_json_answer_says_application_json(service, http, box):
    url, _ = service
    answers = {
        "root": httpx.get(f"{url}/"),
        "health": httpx.get(f"{url}/health"),
        "401": httpx.get(f"{url}/resources"),
        "resources": http.get("/resources"),
        "sandbox": http.get(f"/sandboxes/{box.id}"),
        "404": http.get("/sandboxes/never-was-0"),
        "422": http.post("/sandboxes", json={}),
        "heartbeat": http.post(f"/sandboxes/{box.id}/heartbeat"),
        "exec": http.post(f"/sandboxes/{box.id}/exec", json=exec_body("true")),
        "delete": http.delete("/sandboxes/never-was-0"),
    }
    job_id = answers["exec"].json()["job_id"]
    answers["job"] = http.get(f"/jobs/{job_id}")
    assert {name: a.headers.get("content-type") for name, a in answers.items() if not is_json(a)} == {}


# -- the PTY WebSocket -------------------------------------------------------------------------------


class Pty:
    """One PTY session, driven as the SDK's process handles drive it; the reader stops at the
    first `exit` or `error` frame, and an `error` frame fails the test (the SDK's `wait()` raises)."""

    def __init__(self, ws: ClientConnection):
        self.ws = ws
        self.output = bytearray()
        self.code: int | None = None

    def send(self, frame: dict[str, Any]) -> None:
        self.ws.send(json.dumps(frame))

    def write_stdin(self, text: str) -> None:
        self.send({"type": "stdin", "data": base64.b64encode(text.encode()).decode()})

    def kill(self, sig: str = "TERM") -> None:
        self.send({"type": "signal", "sig": sig})

    def resize(self, rows: int, cols: int) -> None:
        self.send({"type": "resize", "rows": rows, "cols": cols})

    def next_frame(self, timeout: float) -> dict[str, Any]:
        frame = json.loads(self.ws.recv(timeout=timeout))
        if frame["type"] == "stdout":
            self.output += base64.b64decode(frame["data"])
        elif frame["type"] == "exit":
            self.code = frame.get("code", -1)
        elif frame["type"] == "error":
            pytest.fail(f"pty session error: {frame.get('message')}")
        return frame

    def read_until(self, token: bytes, timeout: float) -> None:
        end = time.monotonic() + timeout
        while token not in self.output:
            assert self.code is None, f"exited {self.code} before {token!r}: {bytes(self.output)!r}"
            self.next_frame(max(end - time.monotonic(), 0.01))

    def wait(self, timeout: float) -> int:
        end = time.monotonic() + timeout
        while self.code is None:
            self.next_frame(max(end - time.monotonic(), 0.01))
        return self.code


def pty_url(service: tuple[str, str], sandbox_id: str, key: str | None = None) -> str:
    url, service_key = service
    return f"{url.replace('http://', 'ws://')}/sandboxes/{sandbox_id}/exec/pty?api_key={key or service_key}"


@contextmanager
def pty(service, sandbox_id: str, cmd: list[str], *, rows: int = 24, cols: int = 80, subprotocol: bool = False):
    """Connect as the SDK does (key in the query, or as the subprotocol `api_key.KEY`), send its init
    frame and expect `ready` within 10 s."""
    _, key = service
    address = pty_url(service, sandbox_id).split("?")[0] if subprotocol else pty_url(service, sandbox_id)
    offered = [f"api_key.{key}"] if subprotocol else None
    with connect(address, subprotocols=offered, open_timeout=10, max_size=4 * 2**20, proxy=None) as ws:
        session = Pty(ws)
        init = {"type": "init", "cmd": cmd, "env": {}, "cwd": None, "rows": rows, "cols": cols, "login_shell": False}
        session.send(init)
        ready = session.next_frame(10)
        assert ready["type"] == "ready" and isinstance(ready["pid"], int), ready
        yield session


def handshake_refusal(address: str) -> int | None:
    """The HTTP status a WebSocket handshake is refused with; None when it is accepted."""
    try:
        with connect(address, open_timeout=10, proxy=None):
            return None
    except InvalidStatus as refused:
        return refused.response.status_code


def test_pty_has_a_tty_and_reports_the_exit_code(service, box):
    with pty(service, box.id, ["bash", "-c", "tty -s && echo HAS_TTY; echo done; exit 7"]) as session:
        assert session.wait(15) == 7
        assert b"HAS_TTY" in session.output and b"done" in session.output


def test_pty_echoes_stdin_and_term_ends_it(service, box):
    token = f"tok-{secrets.token_hex(4)}"
    with pty(service, box.id, ["cat"]) as session:
        session.write_stdin(token + "\n")
        session.read_until(token.encode(), 2)
        session.kill("TERM")
        assert session.wait(5) == -15


def test_pty_kill_ends_it_at_once(service, box):
    with pty(service, box.id, ["sleep", "60"]) as session:
        started = time.monotonic()
        session.kill("KILL")
        assert session.wait(5) == -9
        assert time.monotonic() - started < 3


def test_pty_resize(service, box):
    with pty(service, box.id, ["bash", "-c", "stty size; sleep 0.4; stty size; exit 0"], rows=24, cols=80) as session:
        time.sleep(0.1)
        session.resize(50, 200)
        assert session.wait(10) == 0
        assert b"24 80" in session.output and b"50 200" in session.output


def test_pty_unknown_signal_is_term_not_an_error(service, box):
    """Published takes an unknown signal name for TERM; an error frame would end the SDK's session."""
    with pty(service, box.id, ["sleep", "60"]) as session:
        session.kill("FOO")
        assert session.wait(5) == -15


def test_pty_key_as_subprotocol(service, box):
    with pty(service, box.id, ["bash", "-c", "echo via-subprotocol"], subprotocol=True) as session:
        assert session.wait(10) == 0 and b"via-subprotocol" in session.output


def test_pty_answers_websocket_pings(service, box):
    """The async SDK pings every 30 s and drops a connection that does not pong."""
    with pty(service, box.id, ["cat"]) as session:
        assert session.ws.ping().wait(5)
        session.write_stdin("still here\n")
        session.read_until(b"still here", 2)
        session.kill("TERM")
        assert session.wait(5) == -15


def test_pty_to_an_unknown_sandbox_is_refused_at_the_handshake(service):
    """Refused before the WebSocket is accepted, not accepted and then closed: 404 with a `detail`
    where the server can answer a handshake with a body (uvicorn can), else 403 (as published)."""
    assert handshake_refusal(pty_url(service, "never-was-0")) in (403, 404)


def test_pty_with_a_wrong_key_is_refused_at_the_handshake(service, box):
    assert handshake_refusal(pty_url(service, box.id, key="wrong")) == 403
