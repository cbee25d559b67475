"""The SDK embedded (manager in-process) on a real Docker engine: exec, files, patches, isolation."""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchard import store
from orchard.errors import Conflict, InvalidRequest, NotFound, SandboxError
from orchard.store import Store


@pytest.fixture(scope="module")
def box(client, base_image):
    with client.create(base_image) as box:
        yield box


@pytest.fixture(scope="module")
def tiny(client, busybox_image):
    """A sandbox of an image with no Python and no libc."""
    with client.create(busybox_image) as box:
        yield box


def test_exec_exit_codes_stderr_env_and_cwd(box):
    result = box.exec("echo out; echo err >&2; exit 7")
    assert (result.exit_code, result.stdout, result.stderr) == (7, "out\n", "err\n")
    assert box.exec("pwd").stdout == "/workspace\n"
    assert box.exec("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert box.exec("echo $GREETING", env={"GREETING": "hello there"}).stdout == "hello there\n"


def test_agent_runtime_does_not_leak_into_commands(box):
    env = box.exec("env").stdout
    for name in ("PYTHONHOME", "LD_LIBRARY_PATH", "ORCHARD_AGENT_TOKEN", "PYTHONUTF8"):
        assert f"{name}=" not in env
    assert box.exec("python3 -c 'import sys; print(sys.version_info[:2])'").stdout == "(3, 11)\n"


def test_list_command_is_quoted_not_joined(box):
    result = box.exec(["printf", "[%s]\\n", "a b", "it's", '"q"', "$HOME"])
    assert result.stdout == '[a b]\n[it\'s]\n["q"]\n[$HOME]\n'


GUARDED_BASHRC = """\
# If not running interactively, don't do anything (Debian, Ubuntu, SWE-bench images)
case $- in
    *i*) ;;
      *) return;;
esac
export FROM_BASHRC=yes
"""


def test_login_shell_sources_bashrc_past_its_interactivity_guard(box, tiny):
    """As published, a login shell sources ~/.bashrc interactively, so the guard at its top does
    not stop it; bash's complaint about having no terminal for job control is not in stderr.
    Without bash (busybox), ``sh -l`` still runs."""
    box.write_file("/root/.bashrc", GUARDED_BASHRC)
    assert box.exec("echo ${FROM_BASHRC:-no}").stdout == "no\n"
    result = box.exec("echo ${FROM_BASHRC:-no}; sleep 0 & wait", login_shell=True)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "yes\n", "")
    result = tiny.exec("echo hi; echo err >&2", login_shell=True)
    assert (result.exit_code, result.stdout, result.stderr) == (0, "hi\n", "err\n")


def test_timeout_kills_a_grandchild_that_ignores_sigterm(box):
    script = "bash -c 'trap \"\" TERM; echo $$ > /tmp/grandchild; sleep 600' & echo started; wait"
    result = box.exec(script, timeout=1.5)
    assert result.exit_code == 124 and result.timed_out
    assert result.stdout == "started\n"  # partial output kept
    assert "timed out" in result.stderr
    pid = box.read_file("/tmp/grandchild").decode().strip()
    assert box.exec(f"kill -0 {pid}").exit_code != 0, "the grandchild survived the timeout"


def test_background_process_holding_stdout_does_not_hang(box):
    started = time.monotonic()
    result = box.exec("sleep 30 & echo done", timeout=20)
    assert result.stdout == "done\n" and result.exit_code == 0
    assert time.monotonic() - started < 15


def test_fifty_megabytes_of_output_is_capped_with_a_marker(box):
    result = box.exec("head -c 50000000 /dev/zero | tr '\\0' x; echo; echo END")
    assert result.exit_code == 0 and result.truncated
    assert "bytes truncated" in result.stdout
    assert result.stdout.startswith("xxxx") and result.stdout.endswith("END\n")
    assert len(result.raw_stdout) < 10 * 2**20


def test_binary_output_is_exact(box):
    payload = bytes(range(256)) * 4
    box.write_file("blob.bin", payload)
    assert box.exec("cat blob.bin").raw_stdout == payload
    assert box.exec(["base64", "-w0", "blob.bin"]).stdout == base64.b64encode(payload).decode()


def test_files_round_trip_and_listing(box, tmp_path: Path):
    payload = os.urandom(300_000)
    assert box.write_file("/data/deep/er/file.bin", payload) == len(payload)
    assert box.read_file("/data/deep/er/file.bin") == payload
    box.write_file("rel.txt", "relative")
    assert box.read_file("/workspace/rel.txt") == b"relative"
    box.exec("touch -d '2024-02-29 13:14:15.9' /data/deep/er")
    entries = box.list_files("/data/deep")
    assert [(f.name, f.type) for f in entries] == [("er", "directory")]
    assert entries[0].size == int(box.exec("stat -c %s /data/deep/er").stdout) > 0  # st_size, as published
    assert entries[0].modified == "2024-02-29T13:14:15"  # local time, as touch read it; no fraction
    with pytest.raises(NotFound):
        box.read_file("/data/missing")
    with pytest.raises(InvalidRequest):
        box.read_file("/data/deep")  # a folder where a file is expected
    with pytest.raises(InvalidRequest):
        box.write_file("", b"x")


def test_upload_and_download_folders(box, tmp_path: Path):
    source = tmp_path / "src"
    (source / "pkg" / "sub").mkdir(parents=True)
    (source / "pkg" / "__init__.py").write_text("VALUE = 42\n")
    (source / "pkg" / "sub" / "data.bin").write_bytes(os.urandom(5000))
    box.upload(source, "/workspace/project")
    assert box.exec("python3 -c 'import pkg; print(pkg.VALUE)'", cwd="/workspace/project").stdout == "42\n"
    box.download("/workspace/project", tmp_path / "back")
    assert (tmp_path / "back" / "pkg" / "sub" / "data.bin").read_bytes() == (
        source / "pkg" / "sub" / "data.bin"
    ).read_bytes()
    box.download("/workspace/project/pkg/__init__.py", tmp_path / "init.py")
    assert (tmp_path / "init.py").read_text() == "VALUE = 42\n"


def test_apply_patch(box):
    box.exec("rm -rf repo && mkdir repo && cd repo && git init -q && printf 'a\\nb\\n' > f.txt")
    patch = textwrap.dedent(
        """\
        --- a/repo/f.txt
        +++ b/repo/f.txt
        @@ -1,2 +1,2 @@
         a
        -b
        +c
        """
    )
    assert box.apply_patch(patch).success
    assert box.read_file("repo/f.txt") == b"a\nc\n"
    again = box.apply_patch(patch)
    assert not again.success and again.stderr


def test_bad_input_is_refused_clearly(box):
    with pytest.raises(InvalidRequest, match="cwd does not exist"):
        box.exec("true", cwd="/no/such/dir")
    with pytest.raises(InvalidRequest, match="command"):
        box.exec(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="command"):
        box.exec([])


def test_commands_past_the_argv_limit_run_and_one_over_the_cap_is_refused(box, tiny):
    for size in (140_000, 2 * 2**20):  # over one argv string's 128 KiB, over all of argv's ~2 MiB
        text = 'it\'s $HOME "q" `x` \\\n' * (size // 22)
        command = f"cat > /tmp/big.txt <<'EOF'\n{text}EOF\nsha256sum /tmp/big.txt"
        sha = f"{hashlib.sha256(text.encode()).hexdigest()}  /tmp/big.txt\n"
        assert box.exec(command).stdout == sha
        assert box.exec(command, session="long").stdout == sha
        assert tiny.exec(command).stdout == tiny.exec(command, session="long").stdout == sha  # sh, no bash
    with pytest.raises(InvalidRequest, match="command is 16777217 bytes, over the limit of 16777216"):
        box.exec("#" * (16 * 2**20 + 1))


def test_a_long_command_that_times_out_loses_the_orphans_it_set_loose(box):
    """Through the subreaper, which execs the shell with the script's memory file still open: the
    shell reads it and closes it, and a timeout still kills what escaped with `setsid`, before the
    answer comes back."""
    command = f"#{'x' * 200_000}\nls -l /proc/$$/fd | grep -c memfd\n"
    command += "(setsid sh -c 'trap \"\" TERM; echo $$ > /tmp/orphan; exec sleep 600' &); sleep 600"  # a double fork
    result = box.exec(command, timeout=2)
    assert (result.exit_code, result.timed_out, result.stdout) == (124, True, "0\n")
    pid = box.read_file("/tmp/orphan").decode().strip()
    dead = f"test ! -e /proc/{pid} || grep -q '^State:\\s*Z' /proc/{pid}/status"  # gone, or a zombie init reaps
    assert box.exec(dead).exit_code == 0, "the orphan survived the timeout"


def test_a_create_under_way_when_its_client_closes_is_deleted_not_handed_out(base_image, docker_client, tmp_path):
    """An abandoned worker's create (Ctrl-C closes the client under it) finishes after the close
    listed what to delete: the sandbox goes, and the create raises rather than hand out a box
    that nothing will delete. `_handle` is held (an Event) to put the close in that moment."""
    import threading

    from orchard.env import Client

    client = Client(store=Store.open(f"sqlite:///{tmp_path / 'store.db'}"))
    made, release, outcome = threading.Event(), threading.Event(), {}
    handle = client._handle

    def held(*args, **kwargs):
        made.set()
        release.wait(60)
        return handle(*args, **kwargs)

    client._handle = held  # type: ignore[method-assign]

    def create() -> None:
        try:
            outcome["box"] = client.create(base_image)
        except SandboxError as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=create)
    worker.start()
    assert made.wait(120)
    client.close()
    release.set()
    worker.join(60)
    assert "box" not in outcome and "closed while sandbox" in str(outcome["error"])
    sandbox_id = str(outcome["error"]).split("sandbox ")[1].split()[0]
    assert docker_client.containers.list(all=True, filters={"name": sandbox_id}) == []


def test_injection_into_an_image_without_python_or_libc(tiny):
    assert tiny.exec("ls /lib /usr/lib 2>&1; which python3 || echo no-python").stdout.endswith("no-python\n")
    assert tiny.exec(["echo", "a b"]).stdout == "a b\n"  # no bash: sh -c
    tiny.write_file("/tmp/x", b"\x00\xff")
    assert tiny.read_file("/tmp/x") == b"\x00\xff"


def test_blocked_network_has_no_route_and_open_has_one(client, base_image):
    """`blocked`: loopback only, so even another container's address is unreachable. (What `open`
    reaches, and what not, is attacked in tests/env/test_isolation.py.)"""
    with client.create(base_image, network="open") as open_box:
        assert "eth0" in open_box.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | xargs").stdout.split()
        address = open_box.exec("hostname -i").stdout.split()[0]
        fetch = (
            f"python3 -c \"import urllib.request as u; print(u.urlopen('http://{address}:8000/', timeout=5).status)\""
        )
        with client.create(base_image) as blocked:
            assert blocked.exec("tail -n +3 /proc/net/dev | cut -d: -f1 | xargs").stdout == "lo\n"
            assert blocked.exec("getent hosts localhost").ok  # loopback still has its name
            refused = blocked.exec(fetch, timeout=10)
            assert refused.exit_code != 0 and "unreachable" in refused.stderr.lower()


def test_unknown_image_fails_clearly_and_leaves_nothing(client, docker_client):
    with pytest.raises(NotFound, match="no-such-image"):
        client.create("orchard/no-such-image:1", sandbox_id="unknown-image")
    assert not docker_client.api.containers(all=True, filters={"name": "orchard-unknown-image"})
    assert not (client._manager.backend._run_root / "unknown-image").exists()


def test_sandbox_ids_cannot_be_paths_or_taken_twice(client, base_image, tmp_path):
    for bad in ("..", ".", "a/b", "../../etc", "UPPER", ""):
        with pytest.raises(InvalidRequest, match="sandbox id"):
            client.create(base_image, sandbox_id=bad)
    run_root = client._manager.backend._run_root
    assert run_root.is_dir() and run_root.parent.is_dir()
    with client.create(base_image, sandbox_id="taken-once") as box:
        with pytest.raises(Conflict):
            client.create(base_image, sandbox_id="taken-once")
        from orchard.env.backends import SandboxSpec
        from orchard.env.manager import SandboxManager

        other = SandboxManager("docker", store=Store.open(f"sqlite:///{tmp_path}/o.db"), reap_interval=None)
        with other, pytest.raises(Conflict):  # another manager: the name is taken on this host
            other.create(SandboxSpec(image=base_image), sandbox_id="taken-once")
        assert box.exec("echo still here").stdout == "still here\n"


def test_container_that_dies_at_once_fails_at_once(client, base_image, docker_client):
    """6 MiB is too little for the agent to start: the sandbox fails fast, with the reason."""
    started = time.monotonic()
    with pytest.raises(SandboxError, match="exited"):
        client.create(base_image, memory="6Mi", timeout=60)
    assert time.monotonic() - started < 30
    mine = f"org.orchard.owner={client._manager.owner}"  # not the other test worker's containers
    assert not docker_client.api.containers(all=True, filters={"label": mine, "status": "exited"})


def test_store_records_sandboxes_and_commands(client, base_image):
    from sqlmodel import select

    with client.create(base_image) as box:
        box.exec("echo recorded")
        sandbox_id = box.id
    client._manager.flush()
    with store.session(client._manager.store) as db:
        record = db.get(store.SandboxRecord, sandbox_id)
        jobs = db.exec(select(store.ExecRecord).where(store.ExecRecord.sandbox_id == sandbox_id)).all()
    assert record is not None and record.status == "deleted" and record.deleted_at
    assert [(j.command, j.exit_code, j.stdout_bytes) for j in jobs] == [("echo recorded", 0, 9)]


CHILD = """
import sys, time
from orchard.env import Client
from orchard.store import Store
client = Client(store=Store.open(sys.argv[1]))
box = client.create(sys.argv[2])
print(box.id, flush=True)
if sys.argv[3] == "wait":
    time.sleep(600)
"""


def _without_service(env):
    return {k: v for k, v in env.items() if k not in ("ORCHARD_URL", "SANDBOX_BASE_URL", "ORCHARD_API_KEY")}


@pytest.mark.parametrize("ending", ["exit", "sigint", "sigterm", "sigkill"])
def test_sandboxes_do_not_outlive_their_process(ending, base_image, docker_client, tmp_path):
    """Deleted at interpreter exit and on SIGTERM; after SIGKILL, the next manager reaps the orphan."""
    from orchard.env.manager import SandboxManager

    db = f"sqlite:///{tmp_path}/o.db"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, db, base_image, "exit" if ending == "exit" else "wait"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # SIGINT prints a KeyboardInterrupt traceback
        text=True,
        env={**_without_service(os.environ), "ORCHARD_HOME": str(tmp_path / "home")},  # embedded, on its own
    )
    sandbox_id = child.stdout.readline().strip()
    assert sandbox_id
    name = f"orchard-{sandbox_id}"
    if ending != "exit":
        child.send_signal({"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}[ending])
    child.wait(timeout=60)
    if ending == "sigkill":  # nothing in the child ran: the next manager (here or elsewhere) reaps it
        SandboxManager("docker", store=Store.open(db), reap_interval=None).start().close()
    assert not docker_client.api.containers(all=True, filters={"name": name})


def test_a_manager_does_nothing_until_it_is_started(base_image, tmp_path):
    """Made, a manager has touched neither the engine nor the store; `start()` connects, recovers, once."""
    import socket

    from orchard.env.backends import DockerConfig, SandboxSpec
    from orchard.env.manager import SandboxManager
    from orchard.errors import EngineUnavailable

    nowhere = SandboxManager(
        DockerConfig(base_url="unix:///nonexistent/docker.sock"), store=Store.open(f"sqlite:///{tmp_path}/n.db")
    )
    assert not (tmp_path / "n.db").exists()
    with pytest.raises(SandboxError, match="not started"):
        nowhere.create(SandboxSpec(image=base_image))
    with pytest.raises(EngineUnavailable, match="Docker engine"):
        nowhere.start()
    nowhere.close()

    db = f"sqlite:///{tmp_path}/o.db"
    with store.session(db) as session:  # what a process killed outright left open
        session.add(
            store.SandboxRecord(
                id="crashed",
                backend="docker",
                image=base_image,
                network="blocked",
                owner=f"{socket.gethostname()}:999999999:1",
                status="ready",
                created_at=time.time(),
                ttl=60.0,
            )
        )
    manager = SandboxManager("docker", store=Store.open(db), reap_interval=None)
    assert manager.recorded("crashed").status == "ready" and manager.recovered_at_start == 0
    with manager:
        assert manager.recorded("crashed").status == "deleted" and manager.recovered_at_start == 1
        assert manager.start() is manager and manager.recovered_at_start == 1  # idempotent
    with pytest.raises(SandboxError, match="closed"):
        manager.start()


def test_reaper_removes_expired_sandboxes(base_image, docker_client, tmp_path):
    from orchard.env.backends import SandboxSpec
    from orchard.env.manager import SandboxManager

    with SandboxManager("docker", store=Store.open(f"sqlite:///{tmp_path}/o.db"), reap_interval=None) as manager:
        info = manager.create(SandboxSpec(image=base_image, ttl=60))
        assert manager.reap() == []
        assert manager.reap(now=time.time() + 120) == [info.sandbox_id]
        assert not docker_client.api.containers(all=True, filters={"name": f"orchard-{info.sandbox_id}"})


def test_published_loopback_port_route(base_image, tmp_path):
    """The fallback where sockets cannot cross (Docker Desktop): agent on TCP at a loopback port."""
    from orchard.env.backends import DockerConfig, SandboxSpec
    from orchard.env.calls import AgentCalls, send
    from orchard.env.manager import SandboxManager, agent_http
    from orchard.errors import ConfigError

    with SandboxManager(
        DockerConfig(route="port"), store=Store.open(f"sqlite:///{tmp_path}/o.db"), reap_interval=None
    ) as m:
        info = m.create(SandboxSpec(image=base_image, network="open"))
        assert info.endpoint.uds is None and info.endpoint.url.startswith("http://127.0.0.1:")
        with agent_http(info.endpoint) as http:
            assert send(http, AgentCalls().exec("echo over tcp")).stdout == "over tcp\n"
        with pytest.raises(ConfigError, match="blocked"):
            m.create(SandboxSpec(image=base_image))
        assert [s.sandbox_id for s in m.list()] == [info.sandbox_id]


def test_security_profile_holds_against_attempts(client, base_image):
    """No capabilities, no privilege gain, a pids cap, limits applied: each checked by trying."""
    with client.create(base_image, memory="256Mi", cpu=0.5) as box:
        quota = box.exec("cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us 2>/dev/null")
        assert quota.stdout.split() == ["50000", "100000"]
        status = box.exec("grep -E '^(CapEff|NoNewPrivs)' /proc/self/status").stdout.split()
        assert status == ["CapEff:", "0000000000000000", "NoNewPrivs:", "1"]
        mount = box.exec("mkdir -p /mnt/x && mount -t tmpfs none /mnt/x")
        assert mount.exit_code != 0 and "permission denied" in mount.stderr.lower()
        assert box.exec("chown nobody /etc/hostname").exit_code != 0  # CAP_CHOWN is gone
        assert box.exec("mknod /tmp/disk b 8 0").exit_code != 0  # CAP_MKNOD is gone
        memory = box.exec(
            "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max"
        )
        assert memory.stdout.strip() == str(256 * 2**20)
        pids = box.exec("cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max")
        assert pids.stdout.strip() == "4096"


def test_pids_limit_stops_a_fork_storm(base_image, tmp_path):
    """Spawning past the pids limit fails inside the sandbox; the agent itself keeps answering.

    Slow: a fork storm runs in a real sandbox until its pids limit stops it.
    """
    from orchard.env.backends import SandboxSpec
    from orchard.env.calls import AgentCalls, send
    from orchard.env.manager import SandboxManager, agent_http

    with SandboxManager("docker", store=Store.open(f"sqlite:///{tmp_path}/o.db"), reap_interval=None) as manager:
        info = manager.create(SandboxSpec(image=base_image, pids=40))
        with agent_http(info.endpoint) as http:
            storm = send(http, AgentCalls().exec("for i in $(seq 100); do sleep 30 & done; wait", timeout=10))
            assert "Resource temporarily unavailable" in storm.stderr
            assert send(http, AgentCalls().exec("echo alive")).stdout == "alive\n"


async def test_async_sdk_embedded_records_and_cleans_up(base_image, tmp_path, docker_client):
    import asyncio

    from sqlmodel import select

    from orchard.env import AsyncClient

    db = f"sqlite:///{tmp_path}/o.db"
    async with AsyncClient(store=Store.open(db)) as client:
        boxes = await asyncio.gather(*(client.create(base_image) for _ in range(3)))
        outputs = await asyncio.gather(*(box.exec(f"echo {i}") for i, box in enumerate(boxes)))
        assert [o.stdout for o in outputs] == ["0\n", "1\n", "2\n"]
        ids = [box.id for box in boxes]
    for sandbox_id in ids:
        assert not docker_client.api.containers(all=True, filters={"name": f"orchard-{sandbox_id}"})
    with store.session(db) as session:
        commands = sorted(r.command for r in session.exec(select(store.ExecRecord)).all())
    assert commands == ["echo 0", "echo 1", "echo 2"]


async def test_async_sdk_embedded_has_what_the_sync_one_has(base_image, tmp_path, docker_client):
    """Warm pools, attach, list, terminals, and keep refused, as `Client` has them (and a pool per kind)."""
    import asyncio

    from orchard.env import AsyncClient
    from orchard.errors import ConfigError

    async with AsyncClient(store=Store.open(f"sqlite:///{tmp_path}/o.db")) as client:
        with pytest.raises(ConfigError, match="keep=True needs"):
            await client.create(base_image, keep=True)
        manager = client._manager
        await client.warm(base_image, 1)
        await asyncio.to_thread(_wait_for_pool, manager, 1)
        pooled = {info.sandbox_id for info in manager.list()}
        scratch = await client.create(base_image, tmpfs={"/scratch": "16Mi"})  # another kind: started anew
        assert scratch.id not in pooled
        assert (await scratch.exec("grep -c ' /scratch ' /proc/mounts")).stdout == "1\n"
        box = await client.create(base_image)  # the pool's kind: handed over
        assert box.id in pooled and repr(box) == f"<AsyncSandbox {box.id} {base_image}>"
        assert client.attach(box.id) is box
        assert {box.id, scratch.id} <= {row["sandbox_id"] for row in await client.list()}
        async with await box.terminal(["sh", "-c", "read line; echo got:$line; exit 3"], rows=30) as term:
            assert (await term.recv())["type"] == "ready" and term.pid
            await term.write("ping\n")
            assert b"got:ping" in await term.read_until(b"got:ping")
            assert await term.wait() == 3
        ids = [info.sandbox_id for info in manager.list()]
    for sandbox_id in ids:
        assert not docker_client.api.containers(all=True, filters={"name": f"orchard-{sandbox_id}"})
    with pytest.raises(SandboxError, match="closed"):
        client.attach(box.id)


def test_persistent_shell_sessions_keep_state_like_a_terminal(box):
    assert box.exec("cd /tmp && export ANSWER=42 && f() { echo in-f; }", session="a").ok
    result = box.exec("pwd; echo $ANSWER; f; echo oops >&2; printf no-newline", session="a")
    assert (result.stdout, result.stderr) == ("/tmp\n42\nin-f\nno-newline", "oops\n")
    assert box.exec("echo ${ANSWER:-unset}", session="b").stdout == "unset\n"  # sessions are apart
    assert box.exec("echo ${ANSWER:-unset}").stdout == "unset\n"  # and apart from plain exec
    assert box.exec("false", session="a").exit_code == 1
    assert box.exec(["printf", "%s|", "a b", "c"], session="a").stdout == "a b|c|"
    assert box.exec("cat", session="a", timeout=5).stdout == ""  # stdin is /dev/null, never our pipe


def test_a_session_restarts_after_a_timeout_or_an_exit(box):
    box.exec("export KEPT=yes", session="r")
    slow = box.exec("echo before; sleep 30", session="r", timeout=0.5)
    assert (slow.exit_code, slow.timed_out, slow.stdout) == (124, True, "before\n")
    assert "session" in slow.error
    assert box.exec("echo ${KEPT:-fresh}", session="r").stdout == "fresh\n"
    ended = box.exec("exit 7", session="r")
    assert ended.exit_code == 7 and "ended the shell session" in ended.error
    assert box.exec("echo again", session="r").stdout == "again\n"
    assert box.close_session("r") is True and box.close_session("r") is False
    with pytest.raises(InvalidRequest, match="cwd"):
        box.exec("true", session="r", cwd="/tmp")


def _wait_for_pool(manager, ready: int) -> None:
    for _ in range(600):
        if [r for _spec, _size, r in manager.pools.sizes()] == [ready]:
            return
        time.sleep(0.05)
    raise AssertionError(f"the pool never had {ready} ready: {manager.pools.sizes()}")


def test_warm_pool_hands_over_ready_sandboxes_and_refills(base_image, tmp_path, docker_client):
    from orchard.env import Client

    with Client(store=Store.open(f"sqlite:///{tmp_path}/o.db")) as client:
        manager = client._manager
        client.warm(base_image, 2)
        _wait_for_pool(manager, 2)
        pooled = {info.sandbox_id for info in manager.list()}
        box = client.create(base_image)  # the same kind: taken from the pool
        assert box.id in pooled and box.exec("echo warm").stdout == "warm\n"
        other = client.create(base_image, network="open")  # another kind: started anew
        assert other.id not in pooled
        _wait_for_pool(manager, 2)  # refilled in the background
        assert len(manager.list()) == 4
        ids = [info.sandbox_id for info in manager.list()]
    for sandbox_id in ids:  # pooled ones are deleted with the client too
        assert not docker_client.api.containers(all=True, filters={"name": f"orchard-{sandbox_id}"})


def test_a_session_survives_broken_commands_and_drops_background_output(box):
    box.exec("cd /tmp && export KEEP=1", session="robust")
    for broken in ("cat <<EOF\nunterminated", "echo 'open quote", "if then", "}"):
        result = box.exec(broken, session="robust", timeout=10)
        assert result.error is None, (broken, result)
    assert box.exec("echo $KEEP; pwd", session="robust").stdout == "1\n/tmp\n"  # state survived
    box.exec("(sleep 0.2; echo LATE) &", session="robust")
    time.sleep(0.5)
    assert box.exec("echo next", session="robust").stdout == "next\n"  # no stray LATE
    closed = box.exec("exec >/dev/null", session="robust", timeout=10)  # the session's output is gone
    assert "ended the shell session" in closed.error
    assert box.exec("echo again", session="robust").stdout == "again\n"
