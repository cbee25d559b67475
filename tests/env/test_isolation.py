"""Attacks from inside a sandbox on what isolates it: its run folder on the host, the processes a
command leaves behind, the network of `blocked`, `dropped` and `open` sandboxes, the kernel's surface (seccomp), containers
that only have a sandbox's name, and the agent's accept queue. Each attack is real: a hostile
process in a real sandbox, the host folder, Docker's own containers and networks."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import secrets
import selectors
import shutil
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import docker.errors
import httpx
import pytest

from orchard.env.backends.docker import LOOPBACK_HOSTS
from orchard.errors import NotFound, SandboxError
from orchard.store import Store


def _run_dir(client, box) -> Path:
    return client._manager.backend._run_dir(box.id)


# -- the run folder ------------------------------------------------------------------------

ATTACK_RUN_FOLDER = r"""
cd /.orchard-run
try() { if "$@" >/dev/null 2>&1; then echo "DID: $*"; fi; }
try dd if=/dev/zero of=fill bs=1M count=300
try cp /bin/bash suid-bash
try chmod u+s suid-bash
try mknod dev b 8 0
try mkfifo fifo
try mkdir keep
try mv agent.sock moved.sock
try ln -f agent.sock linked.sock
try rm -f agent.sock
try python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind("/.orchard-run/agent.sock.evil")'
try chmod 0777 /.orchard-run
echo done
"""


def _attack_run_folder(client, image: str) -> None:
    """As the sandbox's root, fill, plant and move things in /.orchard-run: nothing may happen."""
    with client.create(image) as box:
        _attack_run_folder_of(client, box)


def _attack_run_folder_of(client, box) -> None:
    run_dir = _run_dir(client, box)
    socket_before = os.lstat(run_dir / "agent.sock").st_ino
    assert box.exec("id -u").stdout == "0\n"  # the image's user is root, the strongest attacker
    attack = box.exec(ATTACK_RUN_FOLDER, timeout=120)
    assert attack.stdout == "done\n", attack.stdout
    assert sorted(os.listdir(run_dir)) in (["agent.sock"], ["agent.sock", "agent.sock.new"])
    assert os.lstat(run_dir / "agent.sock").st_ino == socket_before
    assert box.exec("echo the agent still answers").ok
    box.delete()
    assert not run_dir.exists()


def test_the_sandboxs_root_can_neither_fill_nor_plant_nor_move_anything_in_its_run_folder(client, base_image):
    _attack_run_folder(client, base_image)


def test_the_run_folder_holds_under_gvisor_too(runsc, base_image, tmp_path):
    """gVisor's Sentry checks permissions itself, from what the gofer reports: the seal holds there too."""
    from orchard.env import Client
    from orchard.env.backends import DockerConfig

    with Client(backend=DockerConfig(runtime="runsc"), store=Store.open(f"sqlite:///{tmp_path}/g.db")) as gvisor:
        _attack_run_folder(gvisor, base_image)


ATTACK_AGENT = r"""
import ctypes, os, sys
def argv(pid):
    return open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
agent = next(  # the interpreter running the agent (not the init in front of it, which names it too)
    int(pid) for pid in os.listdir("/proc")
    if pid.isdigit() and argv(pid)[0].startswith(b"/.orchard/") and b"/.orchard/agent/__main__.py" in argv(pid)
)
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206
for request in (PTRACE_ATTACH, PTRACE_SEIZE):
    if libc.ptrace(request, agent, 0, 0) == 0:
        print("DID: ptrace", request)
for name, mode in (("mem", "r+b"), ("mem", "rb"), ("environ", "rb"), ("maps", "rb")):
    try:
        with open(f"/proc/{agent}/{name}", mode):
            print("DID: open", name, mode)
    except OSError:
        pass
try:
    os.readlink(f"/proc/{agent}/fd/0")
    print("DID: readlink fd")
except OSError:
    pass
iov = (ctypes.c_char * 8)()
class Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
local = Iovec(ctypes.addressof(iov), 8)
remote = Iovec(0x400000, 8)
if libc.process_vm_writev(agent, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0) >= 0:
    print("DID: process_vm_writev")
print("checked", agent, "own maps readable:", bool(open(f"/proc/{os.getpid()}/maps").read()))  # still dumpable
"""


def _attack_agent(client, image: str) -> list[str]:
    """From a command as the sandbox's root: attach to the agent, write or read its memory, its
    environment (its token was there), its descriptors. What succeeded."""
    with client.create(image) as box:
        box.write_file("/tmp/attack.py", ATTACK_AGENT)
        done = box.exec("python3 /tmp/attack.py")
        assert done.ok and "checked" in done.stdout and "own maps readable: True" in done.stdout, done
        assert box.exec("echo still-here").stdout == "still-here\n"
        return [line for line in done.stdout.splitlines() if line.startswith("DID:")]


def test_commands_can_neither_attach_to_the_agent_nor_touch_its_memory(client, base_image):
    assert _attack_agent(client, base_image) == []


def test_the_agent_is_out_of_reach_under_gvisor_too(runsc, base_image, tmp_path):
    """gVisor refuses attaching and the memory by itself (it keeps Yama's `ptrace_scope` 1: only a
    parent may attach), whatever the flag; it does not apply dumpability to the agent's other `/proc`
    entries (its environment, maps, descriptors stay readable), as the README says."""
    from orchard.env import Client
    from orchard.env.backends import DockerConfig

    with Client(backend=DockerConfig(runtime="runsc"), store=Store.open(f"sqlite:///{tmp_path}/g.db")) as gvisor:
        did = _attack_agent(gvisor, base_image)
    assert not [line for line in did if "ptrace" in line or "mem" in line or "process_vm" in line], did


OPERATOR_SCRIPT = """
import json, os, sys
from orchard.env import Client
from orchard.errors import SandboxError
from orchard.store import Store
with Client(store=Store.open("sqlite:///" + os.environ["ORCHARD_HOME"] + "/o.db")) as client:
    box = client.create(sys.argv[1])
    run_dir = client._manager.backend._run_dir(box.id)
    leave = box.exec("mkdir /.orchard-run/keep && cp /bin/bash /.orchard-run/keep/bash && chmod u+s /.orchard-run/keep/bash")
    box.delete()
    try:  # an image whose user has the operator's uid would own the run folder from inside
        client.create(sys.argv[2], sandbox_id="same-uid")
        refused = ""
    except SandboxError as exc:
        refused = str(exc)
    same_uid = client._manager.backend._run_dir("same-uid").exists()
    print(json.dumps({"left": leave.ok, "exists": run_dir.exists() or same_uid, "refused": refused}))
"""


def test_a_non_root_operator_removes_the_run_folder_completely(root, docker_client, base_image):
    """Orchard run by a real unprivileged user (setpriv: a uid without capabilities, in the docker
    group): the sandbox's root tries to leave a root-owned folder with a setuid file behind. Then
    an image whose user has the operator's uid, which the seal cannot hold against, is refused."""
    uid = 40000 + secrets.randbelow(20000)
    docker_gid = os.stat("/var/run/docker.sock").st_gid
    home = Path(tempfile.mkdtemp(prefix="orchard-operator-", dir="/tmp"))
    same_uid_image = f"orchard-test/same-uid:{uid}"
    (home / "Dockerfile").write_text(f"FROM {base_image}\nUSER {uid}\n")
    docker_client.images.build(path=str(home), tag=same_uid_image, rm=True)
    try:
        os.chown(home, uid, uid)
        # The system's Python with this checkout and its packages: the operator cannot read this
        # process's interpreter (under /root), and the agent bundle is built from the interpreter.
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), sysconfig.get_paths()["purelib"]]),
            "HOME": str(home),
            "ORCHARD_HOME": str(home),
            "ORCHARD_RUN_DIR": str(home / "run"),
            "ORCHARD_CACHE_DIR": str(home / "cache"),
        }
        as_operator = ["setpriv", f"--reuid={uid}", f"--regid={uid}", f"--groups={docker_gid}", "--"]
        done = subprocess.run(
            [
                *as_operator,
                shutil.which("python3", path="/usr/bin:/bin") or "python3",
                "-c",
                OPERATOR_SCRIPT,
                base_image,
                same_uid_image,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=home,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        outcome = json.loads(done.stdout.strip().splitlines()[-1])
        assert outcome["left"] is False and outcome["exists"] is False
        assert f"(uid {uid}) is this operator's uid" in outcome["refused"]
        assert [p.name for p in (home / "run").iterdir()] == [".hosts"]  # the blocked sandboxes' /etc/hosts
    finally:
        shutil.rmtree(home, ignore_errors=True)
        docker_client.images.remove(same_uid_image, force=True)


# -- what a command leaves behind ----------------------------------------------------------

DAEMONS = r"""
setsid sh -c 'sleep 1001 & sleep 1002' </dev/null >/dev/null 2>&1 &
(setsid sleep 1003 </dev/null >/dev/null 2>&1 &)
setsid sh -c 'trap "" TERM HUP INT; exec sleep 1004' </dev/null >/dev/null 2>&1 &
setsid sh -c 'while :; do (sleep 1005 &); sleep 0.02; done' </dev/null >/dev/null 2>&1 &
sleep 1000
"""
LIST_PROCESSES = r"for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done"


def _survivors(box) -> list[str]:
    return [line for line in box.exec(LIST_PROCESSES).stdout.splitlines() if "sleep" in line or "while" in line]


def test_a_timeout_kills_daemons_that_called_setsid(client, base_image):
    """Double forks, setsid, SIGTERM ignored, a loop forking orphans: none outlives the timeout."""
    with client.create(base_image) as box:
        started = box.exec("setsid sh -c 'sleep 999' </dev/null >/dev/null 2>&1 & sleep 0.5")
        assert any("999" in line for line in _survivors(box))  # a command that ends in time keeps its background
        result = box.exec(DAEMONS, timeout=3)
        assert result.timed_out and result.exit_code == 124 and started.ok
        assert [line for line in _survivors(box) if "999" not in line] == []
        assert box.exec("echo the agent still answers").stdout == "the agent still answers\n"


def test_a_session_timeout_kills_what_the_session_started(client, base_image):
    with client.create(base_image) as box:
        assert box.exec("X=1", session="s").ok
        result = box.exec(DAEMONS, session="s", timeout=3)
        assert result.timed_out
        assert _survivors(box) == []
        assert box.exec("echo ${X:-fresh}", session="s").stdout == "fresh\n"


CLONE_PARENT_ESCAPE = r"""
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
pid = libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0)  # clone(CLONE_PARENT | SIGCHLD): a sibling, the agent's child
if pid == 0:
    os.setsid()
    os.execvp("sleep", ["sleep", "1006"])
print("clone:", pid, os.strerror(ctypes.get_errno()) if pid < 0 else "made", flush=True)
time.sleep(1000)
"""


def test_a_timeout_kills_what_clone_parent_made(client, base_image):
    """clone(CLONE_PARENT) makes a child of the agent, outside the command's tree: seccomp refuses it."""
    with client.create(base_image) as box:
        result = box.exec(["python3", "-c", CLONE_PARENT_ESCAPE], timeout=3)
        assert result.timed_out
        assert "clone: -1 Operation not permitted" in result.stdout, result.stdout
        assert _survivors(box) == []
        assert box.exec("sh -c 'sleep 0 & wait' && python3 -c 'import os; os.fork() or os._exit(0)'").ok


def test_no_sandbox_id_reaches_the_shared_hosts_file(client):
    """Deleting the sandbox `hosts` once chmodded the /etc/hosts that every blocked sandbox mounts."""
    backend = client._manager.backend
    backend.delete("hosts")
    hosts = backend._loopback_hosts
    assert stat.S_IMODE(hosts.stat().st_mode) == 0o644 and hosts.read_text() == LOOPBACK_HOSTS


def test_a_run_folder_written_before_the_seal_refuses_the_sandbox(client, base_image, docker_client, tmp_path):
    """An image whose PYTHONPATH reaches the agent's interpreter runs code before the seal, which keeps a
    folder of its own writable in the run folder: the seal sees it and the sandbox fails, leaving nothing."""
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "base64.py").write_text(  # the agent imports base64 at start, before it listens
        "import os, sys\n"
        "with __import__('contextlib').suppress(OSError): os.mkdir('/.orchard-run/stash', 0o777)\n"
        "sys.path.remove('/evil'); del sys.modules['base64']; import base64 as real; sys.modules['base64'] = real\n"
    )
    (tmp_path / "Dockerfile").write_text(f"FROM {base_image}\nCOPY evil /evil\nENV PYTHONPATH=/evil\n")
    tag = f"orchard-test/pre-seal:{secrets.token_hex(4)}"
    docker_client.images.build(path=str(tmp_path), tag=tag, network_mode="none", rm=True)
    try:
        with pytest.raises(SandboxError, match="instead of the agent's socket alone"):
            client.create(tag)
        assert not [c for c in docker_client.containers.list(all=True) if c.image.tags == [tag]]
        run_root = client._manager.backend._run_root
        assert not [p for p in run_root.iterdir() if (p / "stash").exists()]
    finally:
        docker_client.images.remove(tag, force=True)


# -- the network of `open` sandboxes -------------------------------------------------------

ANSWER = textwrap.dedent(
    """
    import socket, sys
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((sys.argv[1], int(sys.argv[2])))
    server.listen()
    print("listening", flush=True)
    while True:
        conn, _ = server.accept()
        conn.sendall(sys.argv[3].encode())
        conn.close()
    """
)
ASK = (
    "python3 -c 'import socket, sys; print(socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)"
    ".recv(100).decode())' {} {}"
)
GATEWAY = (
    "python3 -c \"import socket, struct; print([socket.inet_ntoa(struct.pack('<I', int(f[2], 16))) "
    "for f in map(str.split, open('/proc/net/route')) if f[1] == '00000000'][0])\""
)


@contextlib.contextmanager
def _server_in_a_netns(host_address: str, address: str, answer: str) -> Iterator[tuple[str, int]]:
    """A server in a network namespace of this test, behind a veth pair (`host_address` on the
    host's end, `address` /30 on the other), routed through the host like any other network."""
    tag = secrets.token_hex(3)
    netns, host_end, ns_end = f"orchard-t-{tag}", f"ot{tag}h", f"ot{tag}n"
    steps = [
        ["ip", "netns", "add", netns],
        ["ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end],
        ["ip", "link", "set", ns_end, "netns", netns],
        ["ip", "addr", "add", f"{host_address}/30", "dev", host_end],
        ["ip", "link", "set", host_end, "up"],
        ["ip", "-n", netns, "addr", "add", f"{address}/30", "dev", ns_end],
        ["ip", "-n", netns, "link", "set", ns_end, "up"],
        ["ip", "-n", netns, "route", "add", "default", "via", host_address],
    ]
    server = None
    try:
        for step in steps:
            subprocess.run(step, check=True, capture_output=True)
        server = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-c", ANSWER, address, "8000", answer],
            stdout=subprocess.PIPE,
        )
        assert server.stdout is not None and server.stdout.readline() == b"listening\n"
        yield address, 8000
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run(["ip", "link", "del", host_end], capture_output=True)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)


@pytest.fixture
def outside(root) -> Iterator[tuple[str, int]]:
    """A server "outside", at an address of the documentation range 198.51.100.0/30."""
    with _server_in_a_netns("198.51.100.1", "198.51.100.2", "outside") as server:
        yield server


@pytest.fixture
def metadata(root) -> Iterator[tuple[str, int]]:
    """A server at a link-local address, where clouds answer with the host's credentials (169.254.169.254)."""
    with _server_in_a_netns("169.254.200.1", "169.254.200.2", "metadata") as server:
        with socket.create_connection(server, timeout=5) as conn:  # the host itself reaches it
            assert conn.recv(100) == b"metadata"
        yield server


@pytest.fixture
def host_service() -> Iterator[int]:
    """A service of this host bound to 0.0.0.0 (every address, the bridges' gateways included)."""
    server = socket.create_server(("0.0.0.0", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def answer() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.sendall(b"host")
            conn.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


def test_open_sandboxes_reach_outside_but_not_each_other_nor_the_host(
    client, base_image, outside, metadata, host_service
):
    with client.create(base_image, network="open") as first, client.create(base_image, network="open") as second:
        assert second.exec(ASK.format(*outside)).stdout == "outside\n"  # `open` still reaches out
        reached = second.exec(ASK.format(*metadata))
        assert not reached.ok and "refused" in reached.stderr.lower(), "an open sandbox reached a link-local address"
        first.write_file("/tmp/answer.py", ANSWER)
        first.exec("nohup python3 /tmp/answer.py 0.0.0.0 8001 sandbox >/tmp/answer.log 2>&1 &")
        for _ in range(100):
            if "listening" in first.exec("cat /tmp/answer.log").stdout:
                break
        assert first.exec(ASK.format("127.0.0.1", 8001)).stdout == "sandbox\n"  # it listens
        neighbour = first.exec("hostname -i").stdout.split()[0]
        reached = second.exec(ASK.format(neighbour, 8001))
        assert not reached.ok and "sandbox" not in reached.stdout, "an open sandbox reached another one"
        gateway = second.exec(GATEWAY).stdout.strip()
        reached = second.exec(ASK.format(gateway, host_service))
        assert not reached.ok and "host" not in reached.stdout, f"an open sandbox reached the host at {gateway}"
        assert "refused" in reached.stderr.lower()  # rejected at once, not left to time out


CONNECT = (
    "python3 -c 'import socket, sys, time; start = time.monotonic()\n"
    'try: socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5).recv(100); print("reached")\n'
    "except OSError as e: print(type(e).__name__, round(time.monotonic() - start))' {} {}"
)


def test_dropped_sandboxes_time_out_where_blocked_ones_fail_and_neither_reaches_anything(
    client, base_image, outside, host_service
):
    """`dropped` (the grader's network) answers a connection out with a timeout, as a network that
    drops packets would, `blocked` with an immediate error; neither reaches a server outside nor a
    service of this host (at the address it has toward that server), and the links `dropped`
    needs are in the sandbox's namespace only, never in this host's."""
    host_links = set(os.listdir("/sys/class/net"))
    targets = [outside, ("198.51.100.1", host_service), ("10.255.255.1", 80)]  # 198.51.100.1: this host
    with (
        client.create(base_image, network="blocked") as blocked,
        client.create(base_image, network="dropped") as dropped,
    ):
        for target in targets:
            assert blocked.exec(CONNECT.format(*target)).stdout == "OSError 0\n", target  # ENETUNREACH, at once
            assert dropped.exec(CONNECT.format(*target)).stdout == "TimeoutError 2\n", target
        assert dropped.exec("ls /sys/class/net").stdout.split() == ["lo", "orchard0", "orchard1"]
        assert (
            dropped.exec("cat /etc/resolv.conf 2>/dev/null; cat /etc/hosts").stdout
            == blocked.exec("cat /etc/resolv.conf 2>/dev/null; cat /etc/hosts").stdout
        )
    # Docker's own veths (`vethXXXXXXX`) come and go with other tests' open sandboxes and builds.
    added = {name for name in set(os.listdir("/sys/class/net")) - host_links if not name.startswith("veth")}
    assert added == set()


# -- the kernel's surface ------------------------------------------------------------------

IO_URING_SETUP = (
    "python3 -c 'import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
    "fd = libc.syscall(425, 8, ctypes.create_string_buffer(120)); print(fd, ctypes.get_errno())'"
)


def test_io_uring_is_denied(client, base_image):
    with client.create(base_image) as box:
        fd, errno_ = box.exec(IO_URING_SETUP).stdout.split()
        assert fd == "-1" and int(errno_) in (1, 38)  # EPERM or ENOSYS


# -- ownership -----------------------------------------------------------------------------


@pytest.fixture
def victim(docker_client, busybox_image) -> Iterator[str]:
    """A plain container, not Orchard's, that has the name a sandbox `victim` would have."""
    name = "orchard-victim"
    if docker_client.api.containers(all=True, filters={"name": f"^/{name}$"}):  # left by a killed run
        docker_client.api.remove_container(name, force=True)
    container = docker_client.containers.run(busybox_image, ["sleep", "600"], name=name, detach=True)
    yield container.id
    with contextlib.suppress(docker.errors.NotFound):  # removed by the code under test: it failed
        container.remove(force=True)


def test_delete_leaves_a_container_that_merely_has_the_name(victim, docker_client, tmp_path):
    from orchard.env.manager import SandboxManager

    with SandboxManager("docker", store=Store.open(f"sqlite:///{tmp_path}/o.db"), reap_interval=None) as manager:
        with pytest.raises(NotFound, match="orchard-victim is not Orchard's; left alone"):
            manager.delete("victim")
        assert manager.backend.state("victim").exists is False
    assert docker_client.api.inspect_container(victim)["State"]["Running"]


def test_the_service_does_not_delete_a_container_that_merely_has_the_name(victim, docker_client, service):
    url, key = service
    answer = httpx.delete(f"{url}/sandboxes/victim", headers={"X-API-Key": key}, timeout=60)
    assert answer.status_code == 404, answer.text
    assert docker_client.api.inspect_container(victim)["State"]["Running"]


# -- the agent's accept queue --------------------------------------------------------------


def test_a_burst_of_a_thousand_connections_is_all_answered(client, base_image):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    with client.create(base_image) as box:
        endpoint = client._manager.get(box.id).endpoint
        request = f"GET /health HTTP/1.1\r\nAuthorization: Bearer {endpoint.token}\r\n\r\n".encode()
        conns, refused = [], 0
        try:
            for _ in range(1000):  # as fast as the host can: the agent accepts them meanwhile
                conn = socket.socket(socket.AF_UNIX)
                conn.setblocking(False)
                try:
                    conn.connect(endpoint.uds)
                except BlockingIOError:  # EAGAIN: the accept queue was full
                    refused += 1
                    conn.close()
                    continue
                conns.append(conn)
            assert refused == 0, f"{refused} of 1000 connections were refused"
            answered = 0
            with selectors.DefaultSelector() as selector:
                for conn in conns:
                    conn.setblocking(True)
                    conn.sendall(request)
                    selector.register(conn, selectors.EVENT_READ)
                while answered < len(conns):
                    events = selector.select(timeout=60)
                    assert events, f"only {answered} of {len(conns)} answered"
                    for key, _ in events:
                        assert key.fileobj.recv(4096).startswith(b"HTTP/1.1 200")
                        selector.unregister(key.fileobj)
                        answered += 1
        finally:
            for conn in conns:
                conn.close()
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
