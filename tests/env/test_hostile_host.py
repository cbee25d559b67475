"""The host under a hostile sandbox: what comes back from a sandbox's agent is bounded and checked.

A process in the sandbox takes the agent's place for real (ptrace: it makes the agent hand over its
listening socket, then stops it) and answers the host's next connection with a crafted archive or
an endless exec answer. Commands cannot do that any more (the agent is not dumpable, and a sandbox
has no CAP_SYS_PTRACE: `tests/env/test_isolation.py`), so the attacker here is started from this
host into the sandbox's namespaces (`nsenter`: its processes, files and network, but this host's
root with CAP_SYS_PTRACE): it stands for an agent hijacked some other way, which the host must
still survive. Where only the answer's bytes matter (a malformed exec line, header
floods, PTY frames, the async twin), `HostileAgent` answers from a Unix socket in the test.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import resource
import socket
import subprocess
import tarfile
import threading
import time
from pathlib import Path

import pytest

from orchard.env.backends.base import AgentEndpoint
from orchard.env.calls import AgentCalls, send
from orchard.env.client import AsyncSandbox, Sandbox
from orchard.env.pty import AgentFrames, AsyncAgentFrames, open_agent_relay
from orchard.env.transport import AgentChannel, AsyncAgentChannel
from orchard.errors import AgentError, InvalidRequest, OrchardError, TooLarge

GiB = 1024**3
EXEC_LIMIT = 64 * 1024 + 2 * 8 * 1024 * 1024
"""The most an exec answer may hold: its JSON line and both streams at the agent's 8 MiB cap."""

# -- a hostile process in a real sandbox -------------------------------------------------

ATTACKER = r'''
"""Takes the exec agent's listening socket (ptrace: the agent is made to send it over a datagram
socket), stops the agent, answers the host's next connection, then lets the agent go on.
argv: "file" PATH (send PATH's bytes as the whole answer) | "flood" CLAIM (claim CLAIM bytes, send
zeros until the host hangs up; the count sent goes to /tmp/attacker.sent)."""
import ctypes, os, signal, socket, struct, sys, time

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
NAMES = "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss fs_base gs_base ds es fs gs"
WALL = 0x40000000


class Regs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in NAMES.split()]


def ptrace(request, pid, addr=0, data=0):
    if libc.ptrace(request, pid, addr, data) == -1:
        raise OSError(ctypes.get_errno(), f"ptrace {request}")


def agent_listener():
    inodes = set()
    for line in open("/proc/net/unix").read().splitlines()[1:]:
        f = line.split()
        if f[3] == "00010000":  # listening: in a fresh sandbox, only the agent's
            inodes.add(f"socket:[{f[6]}]")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return int(pid), int(fd)
        except OSError:
            continue
    raise SystemExit("no agent listener")


def steal(pid, fd):
    me = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    address = b"\0orchard-attacker-%d" % os.getpid()
    me.bind(address)
    ptrace(16, pid)  # ATTACH
    os.waitpid(pid, WALL)
    saved = Regs()
    ptrace(12, pid, 0, ctypes.addressof(saved))  # GETREGS
    mem = os.open(f"/proc/{pid}/mem", os.O_RDWR)
    if os.pread(mem, 2, saved.rip - 2) != b"\x0f\x05":
        raise SystemExit("the agent is not in a syscall")

    def call(nr, *args):
        regs = Regs.from_buffer_copy(saved)
        regs.rax, regs.orig_rax, regs.rip = nr, 2**64 - 1, saved.rip - 2
        for name, value in zip(("rdi", "rsi", "rdx", "r10"), args):
            setattr(regs, name, value)
        ptrace(13, pid, 0, ctypes.addressof(regs))  # SETREGS
        ptrace(9, pid)  # SINGLESTEP over the syscall instruction
        os.waitpid(pid, WALL)
        ptrace(12, pid, 0, ctypes.addressof(regs))
        return ctypes.c_longlong(regs.rax).value

    base = (saved.rsp - 16384) & ~15  # scratch memory well below the agent's stack pointer
    sun = struct.pack("H", socket.AF_UNIX) + address
    os.pwrite(mem, sun, base)
    os.pwrite(mem, struct.pack("QQ", base + 512, 1), base + 256)  # iovec: one byte
    os.pwrite(mem, struct.pack("QiiI4x", 20, socket.SOL_SOCKET, socket.SCM_RIGHTS, fd), base + 384)
    os.pwrite(mem, struct.pack("QI4xQQQQi4x", base, len(sun), base + 256, 1, base + 384, 24, 0), base + 128)
    sock = call(41, socket.AF_UNIX, socket.SOCK_DGRAM, 0)
    sent = call(46, sock, base + 128, 0)  # sendmsg(sock, &msg, 0)
    call(3, sock)
    ptrace(13, pid, 0, ctypes.addressof(saved))
    os.close(mem)
    if sent < 0:
        raise SystemExit(f"sendmsg in the agent failed: {sent}")
    fds = socket.recv_fds(me, 1, 1)[1]
    os.kill(pid, signal.SIGSTOP)
    ptrace(17, pid)  # DETACH: it stays stopped
    return socket.socket(fileno=fds[0])


time.sleep(0.5)  # the agent answers the command that started us first
pid, fd = agent_listener()
listener = steal(pid, fd)
open("/tmp/attacker.ready", "w").write(str(pid))
conn, _ = listener.accept()
conn.recv(65536)
sent = 0
try:
    if sys.argv[1] == "file":
        conn.sendall(open(sys.argv[2], "rb").read())
    else:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % int(sys.argv[2]))
        zeros = bytes(1 << 16)
        while sent < int(sys.argv[2]):
            sent += conn.send(zeros)
except OSError:
    pass
open("/tmp/attacker.sent", "w").write(str(sent))
conn.close()
listener.close()
os.kill(pid, signal.SIGCONT)
'''


@pytest.fixture(scope="module")
def box(x86_64, client, base_image):
    with client.create(base_image) as box:
        box.write_file("/tmp/attacker.py", ATTACKER)
        yield box


def hijack(box: Sandbox, docker_client, *argv: str) -> None:
    """Start the attacker in `box`; return once it holds the agent's socket and the agent is stopped."""
    box.exec("rm -f /tmp/attacker.ready /tmp/attacker.sent")
    container = docker_client.containers.get(f"orchard-{box.id}")
    command = f"python3 /tmp/attacker.py {' '.join(argv)} >/tmp/attacker.log 2>&1 </dev/null"
    target = str(container.attrs["State"]["Pid"])
    subprocess.Popen(  # with CAP_SYS_PTRACE, which no sandbox has: see the module's docstring
        ["nsenter", "-t", target, "-p", "-m", "-n", "sh", "-c", command], start_new_session=True,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(200):
        if container.exec_run(["test", "-e", "/tmp/attacker.ready"]).exit_code == 0:
            break
        log = container.exec_run(["cat", "/tmp/attacker.log"]).output.decode()
        assert "Error" not in log and "SystemExit" not in log, log
        time.sleep(0.05)
    else:
        raise AssertionError("the attacker did not take the agent's socket")
    box._http.close()  # the pooled connection reached the real agent; the next call opens a fresh one


def attacker_done(box: Sandbox, docker_client) -> int:
    """Wait for the attacker to let the agent go; the bytes it managed to send."""
    container = docker_client.containers.get(f"orchard-{box.id}")
    for _ in range(600):
        result = container.exec_run(["cat", "/tmp/attacker.sent"])
        if result.exit_code == 0:
            box.exec("true")  # the agent answers again
            return int(result.output)
        time.sleep(0.05)
    raise AssertionError("the attacker did not finish")


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o777 if kind == tarfile.DIRTYPE else 0o644
    return info


def escaping_tar(local: Path, canary: Path, kind: str) -> bytes:
    """A tar from a hostile sandbox whose extraction would write into `canary` (outside `local`)."""
    top = [(_info("top", tarfile.DIRTYPE), None)]
    if kind == "dotdot":
        return _tar([*top, (_info("top/" + "../" * 40 + str(canary).lstrip("/") + "/pwned"), b"owned")])
    if kind == "absolute":
        return _tar([*top, (_info(str(canary / "pwned")), b"owned")])
    if kind == "symlink":
        return _tar([*top, (_info("top/out", tarfile.SYMTYPE, str(canary)), None), (_info("top/out/pwned"), b"owned")])
    if kind == "hardlink":
        (canary / "victim").write_bytes(b"intact")
        link = _info("top/victim", tarfile.LNKTYPE, str(canary / "victim"))
        return _tar([*top, (link, None), (_info("top/victim"), b"owned")])
    # CVE-2025-4517 (CPython gh-135034): a symlink chain whose resolved path exceeds PATH_MAX stops
    # os.path.realpath, so the `data` filter sees "top/escape" inside the target; the kernel does not.
    staging_top = len(str(local.parent)) + len("/.orchard-download-12345678/top") + 1
    component = "d" * ((4096 - staging_top) // 17)
    steps, path, members = "abcdefghijklmnop", "top", [*top]
    for step in steps:
        members.append((_info(f"{path}/{component}", tarfile.DIRTYPE), None))
        members.append((_info(f"{path}/{step}", tarfile.SYMTYPE, component), None))
        path = f"{path}/{component}"
    linkpath = "/".join([*steps, "l" * 254])
    members.append((_info(f"top/{linkpath}", tarfile.SYMTYPE, "/".join([".."] * len(steps))), None))
    escape = "/".join([linkpath, *[".."] * 17, str(canary).lstrip("/")])
    members.append((_info("top/escape", tarfile.SYMTYPE, escape), None))
    members.append((_info("top/escape/pwned"), b"owned"))
    return _tar(members)


def http_answer(body: bytes, content_type: str = "application/x-tar") -> bytes:
    head = f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def assert_one_clear_line(error: BaseException) -> None:
    assert isinstance(error, OrchardError), repr(error)
    assert "\n" not in str(error) and 10 < len(str(error)) < 400


@pytest.mark.parametrize("kind", ["long_path", "dotdot", "absolute", "symlink"])
def test_download_from_a_hijacked_agent_writes_only_inside_its_target(box, docker_client, tmp_path, kind):
    canary = tmp_path.parent / f"canary-{tmp_path.name}"
    canary.mkdir()
    local = tmp_path / "out" / "here"
    box.write_file("/tmp/answer.http", http_answer(escaping_tar(local, canary, kind)))
    hijack(box, docker_client, "file", "/tmp/answer.http")
    with pytest.raises(OrchardError) as caught:
        box.download("/workspace", local)
    attacker_done(box, docker_client)
    assert_one_clear_line(caught.value)
    assert list(canary.iterdir()) == []
    assert list(tmp_path.iterdir()) == []  # no target, no staging folder, no parent folder left


def test_hardlink_from_a_hijacked_agent_is_skipped_and_its_victim_untouched(box, docker_client, tmp_path):
    canary = tmp_path.parent / f"canary-{tmp_path.name}"
    canary.mkdir()
    local = tmp_path / "out" / "here"
    box.write_file("/tmp/answer.http", http_answer(escaping_tar(local, canary, "hardlink")))
    hijack(box, docker_client, "file", "/tmp/answer.http")
    with pytest.warns(UserWarning, match="skipped 1 link"):
        skipped = box.download("/workspace", local)
    attacker_done(box, docker_client)
    assert skipped == ["top/victim"]
    assert (canary / "victim").read_bytes() == b"intact"
    assert (local / "victim").read_bytes() == b"owned" and not (local / "victim").is_symlink()  # a plain file
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["here"]


def test_exec_answer_flood_from_a_hijacked_agent_is_cut_at_the_limit(box, docker_client):
    hijack(box, docker_client, "flood", str(3 * GiB // 2))
    with pytest.raises(TooLarge) as caught:
        box.exec("echo hi")
    sent = attacker_done(box, docker_client)
    assert_one_clear_line(caught.value)
    assert "POST /exec" in str(caught.value)
    assert sent <= EXEC_LIMIT  # the host hung up before reading past its limit
    assert box.exec("echo back").stdout == "back\n"


def test_read_file_of_a_huge_sparse_file_is_refused_without_reading_it(box):
    box.exec("truncate -s 2G /tmp/huge")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(TooLarge) as caught:
        box.read_file("/tmp/huge")
    assert_one_clear_line(caught.value)
    assert "max_bytes" in str(caught.value) and "download()" in str(caught.value)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 256 * 1024  # KiB: 2 GiB not held
    box.exec("truncate -s 10 /tmp/huge")
    assert box.read_file("/tmp/huge", max_bytes=10) == bytes(10)
    box.exec("rm /tmp/huge")


def test_download_keeps_files_and_folders_and_skips_links(box, tmp_path):
    box.exec(
        "mkdir -p /tmp/tree/sub && echo a > /tmp/tree/sub/a && chmod 4755 /tmp/tree/sub/a && ln -s /etc /tmp/tree/etc"
    )
    with pytest.warns(UserWarning, match="skipped 1 link"):
        skipped = box.download("/tmp/tree", tmp_path)
    assert skipped == ["tree/etc"]
    assert (tmp_path / "tree/sub/a").read_text() == "a\n"
    assert (tmp_path / "tree/sub/a").stat().st_mode & 0o7777 == 0o755
    assert not (tmp_path / "tree/etc").exists() and not (tmp_path / "tree/etc").is_symlink()
    with pytest.raises(TooLarge, match="max_bytes"):
        box.download("/tmp/tree", tmp_path / "small", max_bytes=100)
    assert not (tmp_path / "small").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["tree"]


# -- the socket path -----------------------------------------------------------------------


def test_socket_path_replaced_by_a_link_is_never_followed(tmp_path):
    """agent.sock replaced by a link to another socket of this host: nothing connects through it."""
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(tmp_path / "other.sock"))
    other.listen()
    other.setblocking(False)
    run = tmp_path / "run"
    run.mkdir()
    (run / "agent.sock").symlink_to(tmp_path / "other.sock")
    endpoint = AgentEndpoint(uds=str(run / "agent.sock"), token="t")
    with pytest.raises(AgentError, match="not a socket"):
        AgentChannel(endpoint, timeout=2).request(AgentCalls().list_files("/"))
    with pytest.raises(AgentError, match="not a socket"):
        asyncio.run(AsyncAgentChannel(endpoint, timeout=2).request(AgentCalls().list_files("/")))
    with pytest.raises(AgentError, match="not a socket"):
        AgentFrames(endpoint, timeout=2)
    with pytest.raises(AgentError, match="not a socket"):
        asyncio.run(asyncio.wait_for(open_agent_relay(endpoint), 2))
    with pytest.raises(BlockingIOError):
        other.accept()  # the listener got nothing
    other.close()


# -- answers from a hostile agent (a loopback double) ---------------------------------------


class HostileAgent:
    """Emulates a hostile agent's answers: it reads one request per connection and answers with
    `answer` (bytes, or a callable given the connection that writes what it likes), counting
    the bytes it got to send before the host hung up. It does not emulate the agent's routes,
    its token check, keep-alive or commands: it answers every request the same."""

    def __init__(self, folder: Path, answer):
        self.answer, self.sent = answer, 0
        self.served = threading.Event()
        self.path = str(folder / f"agent-{len(list(folder.glob('*.sock')))}.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen()
        self.endpoint = AgentEndpoint(uds=self.path, token="t")
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                try:
                    if callable(self.answer):
                        self.answer(conn, self)
                    else:
                        conn.sendall(self.answer)
                        self.sent += len(self.answer)
                except OSError:
                    pass
            self.served.set()

    def flood(self, head: bytes, limit: int = 256 * 1024 * 1024):
        """An answer that sends `head`, then zeros until the host hangs up (or `limit` bytes)."""

        def answer(conn: socket.socket, agent: HostileAgent) -> None:
            conn.sendall(head)
            zeros = bytes(1 << 16)
            while agent.sent < limit:
                agent.sent += conn.send(zeros)

        return answer

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def hostile(tmp_path):
    agents: list[HostileAgent] = []

    def make(answer) -> HostileAgent:
        agents.append(HostileAgent(tmp_path, answer))
        return agents[-1]

    yield make
    for agent in agents:
        agent.close()


def exec_answer(facts: dict | bytes, output: bytes = b"") -> bytes:
    line = facts if isinstance(facts, bytes) else json.dumps(facts).encode()
    return http_answer(line + b"\n" + output, "application/vnd.orchard.exec")


GOOD = {
    "exit_code": 0,
    "stdout_length": 3,
    "stderr_length": 0,
    "stdout_bytes": 3,
    "stderr_bytes": 0,
    "truncated": False,
    "timed_out": False,
    "duration": 0.1,
    "error": None,
}


@pytest.mark.parametrize(
    "answer",
    [
        exec_answer(b"not json", b"hi\n"),
        exec_answer(b"[1, 2]", b"hi\n"),
        exec_answer({k: v for k, v in GOOD.items() if k != "exit_code"}, b"hi\n"),
        exec_answer({**GOOD, "stdout_length": -5}, b"hi\n"),
        exec_answer({**GOOD, "stdout_length": 1000}, b"hi\n"),
        exec_answer({**GOOD, "stdout_length": "3"}, b"hi\n"),
        exec_answer({**GOOD, "timed_out": "no"}, b"hi\n"),
        http_answer(b"no newline at all", "application/vnd.orchard.exec"),
    ],
    ids=["not-json", "not-object", "missing-key", "negative", "too-long", "string", "wrong-type", "no-line"],
)
def test_malformed_exec_answer_is_an_agent_error(hostile, answer):
    agent = hostile(answer)
    with pytest.raises(AgentError) as caught:
        send(AgentChannel(agent.endpoint), AgentCalls().exec("echo hi"))
    assert_one_clear_line(caught.value)


def test_well_formed_exec_answer_still_parses(hostile):
    agent = hostile(exec_answer(GOOD, b"hi\n"))
    assert send(AgentChannel(agent.endpoint), AgentCalls().exec("echo hi")).stdout == "hi\n"


def test_small_answers_are_bounded_before_their_body_is_read(hostile):
    agent = hostile(None)
    agent.answer = agent.flood(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
    with pytest.raises(TooLarge, match="GET /files/list"):
        send(AgentChannel(agent.endpoint), AgentCalls().list_files("/"))
    assert agent.served.wait(30)  # it stops once the host hung up
    assert agent.sent < 16 * 1024 * 1024


def test_malformed_small_answer_is_an_agent_error(hostile):
    agent = hostile(http_answer(b'{"nothing": "here"}', "application/json"))
    with pytest.raises(AgentError, match="malformed answer to GET /files/list"):
        send(AgentChannel(agent.endpoint), AgentCalls().list_files("/"))


def test_header_floods_are_cut(hostile):
    agent = hostile(None)
    agent.answer = agent.flood(b"HTTP/1.1 200 OK\r\nX-Flood: ")
    with pytest.raises(AgentError, match="header line"):
        send(AgentChannel(agent.endpoint), AgentCalls().list_files("/"))
    assert agent.served.wait(30)
    assert agent.sent < 16 * 1024 * 1024
    many = b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 1000 + b"Content-Length: 13\r\n\r\n" + b'{"files": []}'
    with pytest.raises(AgentError, match="header lines"):
        send(AgentChannel(hostile(many).endpoint), AgentCalls().list_files("/"))


def test_async_channel_bounds_an_exec_flood(hostile):
    agent = hostile(None)
    agent.answer = agent.flood(b"HTTP/1.1 200 OK\r\nContent-Length: 1610612736\r\n\r\n")

    async def run() -> None:
        channel = AsyncAgentChannel(agent.endpoint)
        with pytest.raises(TooLarge, match="POST /exec"):
            await channel.request(AgentCalls().exec("echo hi"))

    asyncio.run(run())
    assert agent.served.wait(30)
    assert agent.sent <= EXEC_LIMIT


def test_async_download_refuses_the_long_path_trick(hostile, tmp_path):
    canary = tmp_path.parent / f"canary-{tmp_path.name}"
    canary.mkdir()
    local = tmp_path / "out" / "here"
    agent = hostile(http_answer(escaping_tar(local, canary, "long_path")))
    box = AsyncSandbox("hostile", "", AsyncAgentChannel(agent.endpoint), AgentCalls(), lambda _id: asyncio.sleep(0))
    with pytest.raises(AgentError, match="goes through the link"):
        asyncio.run(box.download("/workspace", local))
    assert list(canary.iterdir()) == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("members", "error"),
    [
        ([("top", tarfile.DIRTYPE, None), ("top/fifo", tarfile.FIFOTYPE, None)], "only files and folders"),
        ([("top", tarfile.DIRTYPE, None), ("top/dev", tarfile.CHRTYPE, None)], "only files and folders"),
        ([("top", tarfile.DIRTYPE, None), ("other/x", tarfile.REGTYPE, b"x")], "not under its top member"),
        ([("top", tarfile.DIRTYPE, None), ("top/a\x00b", tarfile.REGTYPE, b"x")], "NUL"),
        ([("top", tarfile.DIRTYPE, None), ("top//x", tarfile.REGTYPE, b"x")], "empty"),
        (
            [("top", tarfile.DIRTYPE, None), ("top/x", tarfile.REGTYPE, b"x"), ("top/x", tarfile.REGTYPE, b"y")],
            "File exists",
        ),
        ([("top", tarfile.DIRTYPE, None), ("top/" + "n" * 5000, tarfile.REGTYPE, b"x")], "longer than"),
    ],
    ids=["fifo", "device", "two-tops", "nul", "empty-part", "twice", "long-name"],
)
def test_hostile_archive_members_refuse_the_whole_archive(tmp_path, members, error):
    infos = []
    for name, kind, data in members:
        info = tarfile.TarInfo("placeholder")
        info.name, info.type = name, kind  # set after: tarfile would not build some of these names
        infos.append((info, data))
    from orchard.env.archive import Download

    local = tmp_path / "out" / "here"
    with pytest.raises(OrchardError, match=error) as caught, Download(local) as download:
        download.file.write(_tar_raw(infos))
        download.finish(max_bytes=GiB)
    assert_one_clear_line(caught.value)
    assert list(tmp_path.iterdir()) == []


def _tar_raw(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            info.size = len(data or b"")
            info.pax_headers = {"path": info.name}  # as it is, NUL and all
            tar.addfile(info, io.BytesIO(data) if data else None)
    return buffer.getvalue()


def test_archive_member_count_and_header_size_are_bounded(tmp_path):
    from orchard.env.archive import Download

    many = [(_info("top", tarfile.DIRTYPE), None)] + [(_info(f"top/{i}"), b"") for i in range(20)]
    with pytest.raises(TooLarge, match="more than 10 members"), Download(tmp_path / "a") as download:
        download.file.write(_tar(many))
        download.finish(max_bytes=GiB, max_members=10)
    huge_name = _info("top/" + "x" * (2 * 1024 * 1024))
    with pytest.raises(AgentError, match="headers"), Download(tmp_path / "b") as download:
        download.file.write(_tar([(huge_name, b"x")]))
        download.finish(max_bytes=GiB)
    claimed = _info("top")
    claimed.size = 2 * GiB  # a header claiming more than the archive holds, and more than allowed
    with pytest.raises(TooLarge, match="more than 1000 bytes"), Download(tmp_path / "c") as download:
        download.file.write(claimed.tobuf(tarfile.GNU_FORMAT))
        download.finish(max_bytes=1000)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_pty_frames_from_the_agent_are_bounded_and_checked(hostile):
    upgraded = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: orchard-pty\r\nConnection: Upgrade\r\n\r\n"
    agent = hostile(upgraded + b"x" * (2 * 1024 * 1024) + b"\n")
    frames = AgentFrames(agent.endpoint)
    with pytest.raises(AgentError, match="over"):
        frames.recv()
    frames.close()
    frames = AgentFrames(hostile(upgraded + b"[1]\n").endpoint)
    with pytest.raises(AgentError, match="JSON object"):
        frames.recv()
    frames.close()


def test_async_pty_frames_from_the_agent_are_bounded_and_checked(hostile):
    upgraded = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: orchard-pty\r\nConnection: Upgrade\r\n\r\n"

    async def first_frame(answer: bytes) -> None:
        frames = await AsyncAgentFrames.open(hostile(answer).endpoint)
        try:
            await frames.recv()
        finally:
            await frames.close()

    with pytest.raises(AgentError, match="over"):
        asyncio.run(first_frame(upgraded + b"x" * (2 * 1024 * 1024) + b"\n"))
    with pytest.raises(AgentError, match="JSON object"):
        asyncio.run(first_frame(upgraded + b"[1]\n"))
    with pytest.raises(AgentError, match="refused the terminal: no"):
        asyncio.run(first_frame(http_answer(json.dumps({"error": "no"}).encode(), "application/json")))


def test_max_bytes_must_be_a_size():
    with pytest.raises(InvalidRequest, match="max_bytes"):
        AgentCalls().read_file("x", max_bytes=-1)


# -- archives crafted below tarfile's level (the extraction is host code: no sandbox needed) ---


def _member(
    name: str, size: int = 0, pax: dict[str, str] | None = None, data: bytes = b"", kind=tarfile.REGTYPE
) -> bytes:
    """One member as raw bytes: its header claims `size` and `pax`, whatever `data` really holds."""
    info = tarfile.TarInfo(name)
    info.type, info.size, info.pax_headers = kind, size, pax or {}
    return info.tobuf(tarfile.PAX_FORMAT) + data + bytes(-len(data) % 512)


def _negative_size_header(name: str) -> bytes:
    """A ustar header whose size is -512 in GNU base-256: tarfile goes back and re-reads it forever."""
    block = bytearray(tarfile.TarInfo(name).tobuf(tarfile.USTAR_FORMAT))
    block[124:136] = b"\xff" + (-512 % (1 << 88)).to_bytes(11, "big")
    block[148:156] = b"        "
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def _finish(local: Path, raw: bytes, max_bytes: int = 1024 * 1024) -> list[str]:
    from orchard.env.archive import Download

    with Download(local) as download:
        download.file.write(raw)
        return download.finish(max_bytes=max_bytes)


TOP = _member("top", kind=tarfile.DIRTYPE)
END = bytes(1024)


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        # GNU.sparse.size=-2**40 drove the running total negative; the next member then wrote
        # 64 MiB of zeros under a 1 MiB max_bytes (tarfile fills sparse holes).
        (
            TOP
            + _member("top/neg", 0, {"GNU.sparse.size": str(-(1 << 40)), "GNU.sparse.map": "0,0"})
            + _member("top/big", 512, {"GNU.sparse.size": str(64 << 20), "GNU.sparse.map": "0,1"}, b"x")
            + END,
            "sparse",
        ),
        (TOP + _member("top/s", 512, {"GNU.sparse.size": "100", "GNU.sparse.map": "0,1"}, b"x") + END, "sparse"),
        (TOP + _member("top/s", 0, {"GNU.sparse.size": "garbage"}) + END, "sparse"),  # tarfile: raw ValueError
        (TOP + _negative_size_header("top/neg") + _member("top/x", 1, data=b"x") + END, "size is not a number"),
        (TOP + _member("top/neg", 0, {"size": "-512"}) + END, "size is not a number"),
        # Global pax headers pile up in tarfile and are copied into every later member.
        (_member("pax", 6, kind=tarfile.XGLTYPE, data=b"6 a=\n\n") + TOP + END, "global pax header"),
        # tarfile's pax regexes are quadratic in a header without records (CVE-2024-6232).
        (TOP + _member("pax", 16384, kind=tarfile.XHDTYPE, data=b"1" * 16384) + _member("top/x") + END, "pax record"),
        # Many small records or headers cost tarfile a Python loop each, and a dict copy per record.
        (TOP + _member("pax", 500, kind=tarfile.XHDTYPE, data=b"5 a=\n" * 100) + _member("top/x") + END, "records"),
        (
            TOP + _member("pax", 5, kind=tarfile.XHDTYPE, data=b"5 a=\n") * 4 + _member("top/x") + END,
            "3 headers",
        ),
    ],
    ids=[
        "sparse-negative",
        "sparse",
        "sparse-garbage",
        "negative-base256",
        "negative-pax",
        "global-pax",
        "pax-digits",
        "pax-records",
        "pax-headers",
    ],
)
def test_crafted_sizes_and_headers_refuse_the_archive(tmp_path, raw, error):
    with pytest.raises(OrchardError, match=error) as caught:
        _finish(tmp_path / "out" / "here", raw)
    assert_one_clear_line(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_archive_cut_short_is_refused_not_taken_as_complete(tmp_path):
    whole = TOP + _member("top/a", 1, data=b"a") + _member("top/b", 1, data=b"b") + END
    for cut in (len(TOP) + 1536 + 100, len(TOP) + 1024 + 200, len(whole) - 1024):  # in data, in a header, no end
        with pytest.raises(AgentError, match="truncated") as caught:
            _finish(tmp_path / "out" / "here", whole[:cut])
        assert_one_clear_line(caught.value)
        assert list(tmp_path.iterdir()) == []
    assert _finish(tmp_path / "out" / "here", whole) == []
    assert sorted(p.name for p in (tmp_path / "out" / "here").iterdir()) == ["a", "b"]


def test_download_of_a_folder_onto_a_file_is_a_clear_error(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "here").write_text("keep")
    with pytest.raises(InvalidRequest, match="is a file and the download is a folder") as caught:
        _finish(tmp_path / "out" / "here", TOP + _member("top/a", 1, data=b"a") + END)
    assert_one_clear_line(caught.value)
    assert (tmp_path / "out" / "here").read_text() == "keep"
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["here"]


def test_refused_download_removes_the_parent_folders_it_created(tmp_path):
    (tmp_path / "kept").mkdir()
    from orchard.env.archive import Download

    with pytest.raises(AgentError), Download(tmp_path / "kept" / "new" / "sub" / "here") as download:
        download.file.write(b"garbage" * 100)
        download.finish(max_bytes=GiB)
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and list((tmp_path / "kept").iterdir()) == []


def test_archives_the_agent_writes_extract_exactly(tmp_path):
    from orchard.env.agent.files import write_tar

    source = tmp_path / "src"
    deep = source / ("d" * 150) / ("e" * 150)
    deep.mkdir(parents=True)
    (deep / ("f" * 200)).write_bytes(b"deep")
    (source / "big").write_bytes(bytes(range(256)) * 5000)
    (source / "run.sh").write_bytes(b"#!/bin/sh\n")
    (source / "run.sh").chmod(0o750)
    (source / "caf\xe9".encode("latin-1").decode("utf-8", "surrogateescape")).write_bytes(b"latin-1 name")
    (source / "old").write_bytes(b"")
    os.utime(source / "old", (-86400, -86400))
    (source / "link").symlink_to("l" * 300)
    archive = io.BytesIO()
    write_tar(str(source), archive)
    local = tmp_path / "copy"
    with pytest.warns(UserWarning, match="skipped 1 link"):
        assert _finish(local, archive.getvalue(), max_bytes=GiB) == ["src/link"]
    expected = {p.relative_to(source): p for p in source.rglob("*") if not p.is_symlink()}
    assert {p.relative_to(local) for p in local.rglob("*")} == set(expected)
    for relative, original in expected.items():
        copy = local / relative
        assert copy.is_dir() == original.is_dir()
        if original.is_file():
            assert copy.read_bytes() == original.read_bytes()
            assert copy.stat().st_mode & 0o777 == original.stat().st_mode & 0o777
    assert (local / "old").stat().st_mtime == -86400
