"""The `orchard up` service under hostile clients and hostile sandboxes, attacked for real.

A real `orchard up` runs as its own process (its memory is read from /proc); clients speak raw
HTTP to it on loopback, and hostile sandboxes are real sandboxes whose processes make big files
and big outputs.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from hostile_http import send_chunked
from typer.testing import CliRunner

from orchard.cli import app

runner = CliRunner()
MiB = 2**20
SMALL_RSS = 300 * MiB
"""Peak memory the service may reach under these attacks (it idles near 100 MiB); each took it past 1.5 GiB."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Up:
    """A running `orchard up` (its own process): where it listens, its key, pid and home."""

    def __init__(self, home: Path, port: int, key: str, pid: int):
        self.home, self.port, self.key, self.pid = home, port, key, pid
        self.url = f"http://127.0.0.1:{port}"

    def reset_peak(self) -> None:
        """Start measuring the peak memory afresh (Linux: `5` to clear_refs resets VmHWM)."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")

    def peak_memory(self) -> int:
        """The service process's peak resident memory since the last reset (VmHWM), in bytes."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmHWM in /proc status")


@pytest.fixture(scope="module")
def up(docker_client, base_image, tmp_path_factory) -> Iterator[Up]:
    """`orchard up` in the background, in an ORCHARD_HOME that was made wide open (0755) before."""
    home = tmp_path_factory.mktemp("hostile") / "home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    key = "hostile-test-key-" + os.urandom(8).hex()
    port = free_port()
    env = {"ORCHARD_HOME": str(home), "ORCHARD_API_KEY": key, "ORCHARD_DB_URL": None}
    started = runner.invoke(app, ["up", "--port", str(port)], env=env)
    assert started.exit_code == 0, started.output
    pid = json.loads((home / "service.json").read_text())["pid"]
    try:
        yield Up(home, port, key, pid)
    finally:
        stopped = runner.invoke(app, ["down"], env=env)
        assert stopped.exit_code == 0, stopped.output


@pytest.fixture(scope="module")
def http(up) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=up.url, headers={"X-API-Key": up.key}, timeout=300) as http:
        yield http


@pytest.fixture(scope="module")
def sandbox_id(http, base_image) -> Iterator[str]:
    sandbox_id = http.post("/sandboxes", json={"image": base_image}).json()["sandbox_id"]
    assert http.get(f"/sandboxes/{sandbox_id}/wait", params={"timeout": 120}).json()["ready"]
    yield sandbox_id
    http.delete(f"/sandboxes/{sandbox_id}")


# -- bodies ----------------------------------------------------------------------------------


def test_a_huge_chunked_body_without_a_key_is_refused_before_it_is_read(up):
    """800 MiB chunked, no key: 401 at once; the service never took the body into memory."""
    up.reset_peak()
    status, sent = send_chunked(up.port, "/sandboxes", {}, 800 * MiB)
    assert sent < 64 * MiB, f"the service read {sent / MiB:.0f} MiB"  # what the kernel's buffers took
    assert status == 401
    status, sent = send_chunked(up.port, "/sandboxes", {"X-API-Key": "wrong"}, 800 * MiB)
    assert status == 403 and sent < 64 * MiB
    assert up.peak_memory() < SMALL_RSS
    assert httpx.get(f"{up.url}/health").status_code == 200


def _unfinished_head(port: int, size: int) -> tuple[bytes, int]:
    """A request whose one header grows to `size` bytes without ending, no key: what the service
    answered, and how much it took before it stopped reading."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        try:
            conn.sendall(b"GET /sandboxes HTTP/1.1\r\nHost: orchard\r\nX-Flood: ")
            chunk = b"a" * MiB
            while sent < size:
                conn.sendall(chunk)
                sent += len(chunk)
        except OSError:  # the service closed the connection: what it was sent last never arrived
            pass
        try:
            answer = conn.recv(4096)
        except OSError:
            answer = b""
    return answer, sent


def test_fifty_unfinished_64_mib_heads_without_a_key_leave_the_service_small_and_serving(up):
    """A request head is capped before the key is read: each flood gets a 431 after its first
    64 KiB (plus the kernel's buffers), while `/health` and a client with the key are served."""
    up.reset_peak()
    with ThreadPoolExecutor(50) as pool:
        floods = [pool.submit(_unfinished_head, up.port, 64 * MiB) for _ in range(50)]
        assert httpx.get(f"{up.url}/health", timeout=30).status_code == 200
        listed = httpx.get(f"{up.url}/sandboxes", headers={"X-API-Key": up.key}, timeout=30)
        assert listed.status_code == 200
        answers = [flood.result() for flood in floods]
    for answer, sent in answers:
        assert sent < 16 * MiB, f"the service read {sent / MiB:.0f} MiB of one head"
        assert answer.startswith(b"HTTP/1.1 431 ") or answer == b"", answer[:100]  # or reset first
    assert any(answer.startswith(b"HTTP/1.1 431 ") for answer, _ in answers)
    assert up.peak_memory() < SMALL_RSS, f"peak {up.peak_memory() / MiB:.0f} MiB"
    assert httpx.get(f"{up.url}/health").status_code == 200


def test_a_huge_chunked_body_with_a_key_is_cut_off_at_the_cap(start_service, tmp_path):
    """800 MiB chunked to an upload route with a valid key: 413 past the 1 MiB cap, the rest never read."""
    with start_service(tmp_path / "s.db", max_upload_bytes=MiB) as (url, key):
        port = int(url.rsplit(":", 1)[1])
        status, sent = send_chunked(port, "/sandboxes/nosuchbox/files", {"X-API-Key": key}, 800 * MiB)
        assert sent < 64 * MiB, f"the service read {sent / MiB:.0f} MiB"
        assert status == 413
        assert httpx.get(f"{url}/health").status_code == 200


def test_the_default_cap_holds_chunked_bodies_of_a_real_service(up):
    """The same against `orchard up` itself (256 MiB cap): 413 before the 800 MiB are in.

    A JSON body is parsed whole, so up to the cap (341 MiB of base64) is held, and no more.
    """
    up.reset_peak()
    status, sent = send_chunked(up.port, "/sandboxes/nosuchbox/files", {"X-API-Key": up.key}, 800 * MiB)
    assert sent < 400 * MiB, f"the service read {sent / MiB:.0f} MiB"  # the cap and the kernel's buffers
    assert up.peak_memory() < SMALL_RSS + 341 * MiB
    assert status == 413


# -- fair shares --------------------------------------------------------------------------------


def test_one_client_cannot_take_every_command_slot(start_service, tmp_path, busybox_image):
    """A client floods 8 slots with long commands, each naming itself another client in X-Forwarded-For;
    a client from another address still runs at once."""
    with start_service(tmp_path / "f.db", max_running=8) as (url, key):
        headers = {"X-API-Key": key}
        with (
            httpx.Client(base_url=url, headers=headers, timeout=120) as flooder,
            httpx.Client(
                base_url=url, headers=headers, timeout=120, transport=httpx.HTTPTransport(local_address="127.0.0.2")
            ) as other,
        ):
            sandbox_id = flooder.post("/sandboxes", json={"image": busybox_image}).json()["sandbox_id"]
            try:
                assert flooder.get(f"/sandboxes/{sandbox_id}/wait", params={"timeout": 120}).json()["ready"]
                flood = [
                    flooder.post(
                        f"/sandboxes/{sandbox_id}/exec",
                        json={"command": "sleep 120", "timeout_seconds": 120, "concurrent": True},
                        headers={"X-Forwarded-For": f"198.51.100.{i}"},  # claims no address: the peer's counts
                    )
                    for i in range(20)
                ]
                accepted = [r for r in flood if r.status_code == 200]
                refused = [r for r in flood if r.status_code == 503]
                assert len(accepted) + len(refused) == 20 and 0 < len(accepted) < 8
                assert "share" in refused[0].json()["detail"]

                mine = other.post(  # beside the flood (a FIFO would put it after)
                    f"/sandboxes/{sandbox_id}/exec", json={"command": "echo mine", "wait": True, "concurrent": True}
                )
                assert mine.status_code == 200 and mine.json()["stdout"] == "mine\n"
                more = flooder.post(f"/sandboxes/{sandbox_id}/exec", json={"command": "true"})
                assert more.status_code == 503  # over its share now that another client runs commands
            finally:
                flooder.delete(f"/sandboxes/{sandbox_id}")


# -- the key ---------------------------------------------------------------------------------


def _command_lines() -> list[bytes]:
    lines = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                lines.append((entry / "cmdline").read_bytes())
            except OSError:  # ended meanwhile, or not ours to read
                continue
    return lines


def test_the_api_key_is_in_no_command_line(tmp_path, docker_client, base_image):
    """`orchard up --api-key-file`: the key works and no process's argv holds it; `--api-key KEY` is refused."""
    key = "argv-secret-" + os.urandom(8).hex()
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    port = free_port()
    env = {**os.environ, "ORCHARD_HOME": str(tmp_path / "home")}
    env.pop("ORCHARD_API_KEY", None)
    orchard = [sys.executable, "-m", "orchard"]
    service = subprocess.Popen(
        [*orchard, "up", "--foreground", "--port", str(port), "--api-key-file", str(key_file)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(600):
            assert service.poll() is None, service.stderr.read().decode() if service.stderr else ""
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert httpx.get(f"http://127.0.0.1:{port}/resources", headers={"X-API-Key": key}).status_code == 200
        assert not [line for line in _command_lines() if key.encode() in line]
    finally:
        service.terminate()
        service.wait(timeout=120)
    on_argv = subprocess.run([*orchard, "up", "--api-key", key], env=env, capture_output=True, text=True)
    assert on_argv.returncode != 0 and "--api-key-file" in on_argv.stderr
    missing = runner.invoke(
        app, ["up", "--api-key-file", str(tmp_path / "nope")], env={"ORCHARD_HOME": env["ORCHARD_HOME"]}
    )
    assert missing.exit_code == 1 and missing.stderr.startswith("error: cannot read the API key file")
    assert missing.stderr.count("\n") == 1


def test_the_key_is_in_no_command_line_of_a_background_service(up):
    """The service `orchard up` started gets its key from its environment, never from argv."""
    assert not [line for line in _command_lines() if up.key.encode() in line]


# -- file modes ------------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_home_store_and_logs_are_private_after_up(up):
    assert _mode(up.home) == 0o700  # it was 0755 before `orchard up`
    for name in ("service.json", "service.log", "orchard.db", "orchard.db-wal", "orchard.db-shm"):
        assert _mode(up.home / name) == 0o600, name


def test_a_store_and_a_key_are_created_private_and_wide_ones_tightened(tmp_path, monkeypatch):
    from orchard import store
    from orchard.env.service import load_or_create_key

    home = tmp_path / "home"
    monkeypatch.setenv("ORCHARD_HOME", str(home))
    monkeypatch.delenv("ORCHARD_DB_URL", raising=False)
    monkeypatch.delenv("ORCHARD_API_KEY", raising=False)
    old = os.umask(0o022)
    try:
        key = load_or_create_key()
        assert len(key) >= 32 and load_or_create_key() == key
        assert _mode(home) == 0o700 and _mode(home / "api_key") == 0o600
        home.chmod(0o755)
        db = home / "orchard.db"
        with store.session() as session:  # the default store, in ORCHARD_HOME
            session.add(
                store.RunRecord(
                    id="r", kind="k", name="n", config="{}", status="done", owner="o", host="h", started_at=0.0
                )
            )
        assert _mode(home) == 0o700
        for path in (db, db.with_name("orchard.db-wal"), db.with_name("orchard.db-shm")):
            assert _mode(path) == 0o600, path

        elsewhere = tmp_path / "elsewhere" / "o.db"  # a store of the operator's choosing: a new folder is 0700
        elsewhere.parent.mkdir()
        elsewhere.touch(mode=0o644)
        elsewhere.chmod(0o644)
        store.get_engine(f"sqlite:///{elsewhere}").dispose()
        assert _mode(elsewhere) == 0o600
    finally:
        os.umask(old)


# -- bounded reads from a sandbox ----------------------------------------------------------------


def test_a_2_gib_file_is_refused_not_read_into_memory(up, http, sandbox_id):
    """Slow: it streams a 2 GiB upload at the service to show it is refused as it comes, not read."""
    made = http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": "truncate -s 2G /tmp/big", "wait": True})
    up.reset_peak()
    assert made.json()["exit_code"] == 0
    answer = http.get(f"/sandboxes/{sandbox_id}/files", params={"path": "/tmp/big"})
    tar = http.get(f"/sandboxes/{sandbox_id}/archive", params={"path": "/tmp/big"})
    assert up.peak_memory() < SMALL_RSS
    assert answer.status_code == 413 and "archive" in answer.json()["detail"]
    assert tar.status_code == 413 and "smaller folder" in tar.json()["detail"]
    small = http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": "echo still fine", "wait": True})
    assert small.json()["stdout"] == "still fine\n"


def test_many_big_outputs_keep_the_service_bounded(up, http, sandbox_id):
    """80 commands of 8 MB output each (640 MB in all): memory stays bounded; the oldest outputs are dropped.

    Slow: many commands of big output at once through the real service, to show its memory stays bounded.
    """
    command = "head -c 8000000 /dev/zero | tr '\\0' x"
    up.reset_peak()

    def run(_: int) -> dict:
        return http.post(f"/sandboxes/{sandbox_id}/exec", json={"command": command, "wait": True}).json()

    with ThreadPoolExecutor(4) as pool:
        jobs = list(pool.map(run, range(80)))
    assert up.peak_memory() < SMALL_RSS + 256 * MiB  # the service's budget for finished jobs' output
    assert all(len(job["stdout"]) == 8_000_000 for job in jobs)
    first = http.get(f"/jobs/{jobs[0]['job_id']}").json()
    assert (first["status"], first["exit_code"], first["stdout"], first["output_dropped"]) == ("succeeded", 0, "", True)
    assert "output dropped" in first["error"]
    last = http.get(f"/jobs/{jobs[-1]['job_id']}").json()
    assert len(last["stdout"]) == 8_000_000 and not last["output_dropped"]
