"""The exec agent, run as a real process on this host and spoken to over a Unix socket or TCP."""

from __future__ import annotations

import base64
import hashlib
import http.client
import io
import json
import os
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchard.env.agent.config import AgentConfig
from orchard.env.agent.processes import run_process
from orchard.env.agent.server import make_server
from orchard.env.agent.shells import Shell, long_command
from orchard.env.calls import split_exec_answer

SERVER = Path(__file__).resolve().parents[2] / "orchard" / "env" / "agent" / "__main__.py"
"""The agent's entry, which sandboxes run by its path."""
TOKEN = "test-token-0123456789"
AGENT_ONLY_ENV = {
    "PYTHONHOME": sys.base_prefix,  # valid, so the agent still starts
    "PYTHONPATH": "/nonexistent/orchard-pythonpath",
    "LD_LIBRARY_PATH": "/nonexistent/orchard-lib",
    "PYTHONUTF8": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "ORCHARD_AGENT_EXTRA": "agent-only",
}


class Agent:
    """A running agent process and the folders it uses."""

    def __init__(self, root: Path, proc: subprocess.Popen[bytes], sock: Path) -> None:
        self.root = root
        self.proc = proc
        self.sock = sock
        self.workdir = root / "ws"
        self.tmpdir = root / "tmp"

    def client(self, token: str | None = TOKEN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        transport = httpx.HTTPTransport(uds=str(self.sock))
        return httpx.Client(transport=transport, base_url="http://agent", headers=headers)


def start_agent(root: Path, *listen: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start the agent the way sandboxes do (its entry by its path, ``-s -S``), with the test token."""
    full_env = {**os.environ, "ORCHARD_AGENT_TOKEN": TOKEN, **(env or {})}
    argv = [sys.executable, "-s", "-S", str(SERVER), *listen, "--workdir", str(root / "ws")]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    return subprocess.Popen(argv, env=full_env, **pipes)


def wait_until(ready, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 10
    while not ready():
        if proc.poll() is not None:
            raise AssertionError(f"agent exited ({proc.returncode}): {proc.stderr.read()!r}")  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            raise AssertionError(f"agent never {what}")
        time.sleep(0.01)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream:
            stream.close()


@pytest.fixture(scope="module")
def agent() -> Iterator[Agent]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="oa-"))
    (root / "tmp").mkdir()
    sock = root / "a.sock"
    proc = start_agent(root, "--unix", str(sock), env={**AGENT_ONLY_ENV, "TMPDIR": str(root / "tmp")})
    wait_until(sock.exists, proc, "created its socket")
    yield Agent(root, proc, sock)
    stop(proc)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def client(agent: Agent) -> Iterator[httpx.Client]:
    with agent.client() as c:
        yield c


@pytest.fixture
def ws(agent: Agent) -> Path:
    """A fresh folder inside the workdir, for one test."""
    agent.workdir.mkdir(exist_ok=True)
    return Path(tempfile.mkdtemp(dir=agent.workdir))


def run(client: httpx.Client, command: str | list[str], route: str = "/exec", **fields: object) -> dict:
    """POST /exec (or /shell); returns the facts with the raw stdout and stderr bytes added."""
    response = client.post(route, json={"command": command, **fields})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/vnd.orchard.exec"
    facts, stdout, stderr = split_exec_answer(response.content)
    return {**facts, "stdout": stdout, "stderr": stderr}


def is_alive(pid: int) -> bool:
    """Whether pid runs (a zombie waiting for its reaper counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_dead(pid: int, seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while is_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def tar_bytes(members: dict[str, bytes | None], **kinds: bytes) -> bytes:
    """A tar of files (bytes) and folders (None); ``kinds`` maps names to raw tar types."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            if name in kinds:
                info.type = kinds[name]
                tar.addfile(info)
            elif content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


class UnixHTTPConnection(http.client.HTTPConnection):
    """http.client over a Unix socket, to see exactly which connection requests use."""

    def __init__(self, path: Path) -> None:
        super().__init__("agent")
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(self.path))


def raw_exchange(sock_path: Path, request: bytes, close_write: bool = False) -> tuple[int, dict]:
    """Send raw bytes, return the status and JSON body of the one response."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(sock_path))
        s.sendall(request)
        if close_write:
            s.shutdown(socket.SHUT_WR)
        response = http.client.HTTPResponse(s)
        response.begin()
        return response.status, json.loads(response.read())


# -- exec ----------------------------------------------------------------------------------


def test_health(client: httpx.Client, agent: Agent) -> None:
    response = client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "pid": agent.proc.pid, "version": "1"}
    assert response.headers["content-length"] == str(len(response.content))


def test_exit_code_stdout_and_stderr(client: httpx.Client) -> None:
    answer = run(client, "echo out; echo err >&2; exit 7")
    assert answer["exit_code"] == 7
    assert (answer["stdout"], answer["stderr"]) == (b"out\n", b"err\n")
    assert (answer["stdout_bytes"], answer["stderr_bytes"]) == (4, 4)
    assert answer["timed_out"] is False and answer["truncated"] is False
    assert answer["error"] is None and 0 < answer["duration"] < 5


def test_signal_death_uses_shell_convention(client: httpx.Client) -> None:
    assert run(client, "kill -KILL $$")["exit_code"] == 128 + signal.SIGKILL


def test_env_and_relative_cwd(client: httpx.Client, agent: Agent, ws: Path) -> None:
    (ws / "sub").mkdir()
    relative = str((ws / "sub").relative_to(agent.workdir))
    answer = run(client, 'echo "$GREETING"; pwd', env={"GREETING": "hi there"}, cwd=relative)
    assert answer["stdout"] == f"hi there\n{ws / 'sub'}\n".encode()
    assert run(client, "pwd", cwd=str(ws))["stdout"] == f"{ws}\n".encode()


def test_default_cwd_is_the_workdir_created_on_demand(client: httpx.Client, agent: Agent) -> None:
    shutil.rmtree(agent.workdir, ignore_errors=True)
    answer = run(client, "pwd")
    assert answer["stdout"] == f"{agent.workdir}\n".encode()
    assert agent.workdir.is_dir()


def test_list_command_is_shell_quoted(client: httpx.Client) -> None:
    assert run(client, ["echo", "a b", "it's"])["stdout"] == b"a b it's\n"
    answer = run(client, ["printf", "%s|", '"q"', "$HOME", "x;y", "*"])
    assert answer["stdout"] == b'"q"|$HOME|x;y|*|'


PROBE = "import json, os, resource; print(json.dumps([os.getcwd(), dict(os.environ), resource.getrlimit(resource.RLIMIT_NOFILE), os.getsid(0) == os.getpid()]))"
"""What a program sees of how it was started: its folder, environment, limits, and whether it leads its session."""


def test_a_command_list_with_nothing_for_a_shell_runs_without_one_and_sees_the_same(
    client: httpx.Client, ws: Path
) -> None:
    """A list the shell would only find on PATH and exec runs directly: its `$0` is the program's
    path (the one difference), and its folder, environment, limits and session are what `bash -c`
    of the same list gives it (bash 5 sets PWD, SHLVL and `_`; here they are set for it)."""
    assert run(client, ["sh", "-c", 'echo "$0"'])["stdout"] == f"{shutil.which('sh')}\n".encode()  # no shell
    assert run(client, shlex.join(["sh", "-c", 'echo "$0"']))["stdout"] == b"sh\n"  # bash found and exec'd it
    fields = {"cwd": str(ws), "env": {"GREETING": "hi", "PWD": "/elsewhere", "SHLVL": "4"}}
    direct, shelled = (
        run(client, ["python3", "-c", PROBE], **fields),
        run(client, shlex.join(["python3", "-c", PROBE]), **fields),
    )
    assert json.loads(direct["stdout"]) == json.loads(shelled["stdout"])
    folder, environment, _, leads = json.loads(direct["stdout"])
    assert folder == environment["PWD"] == str(ws) and environment["SHLVL"] == "4" and leads
    assert run(client, ["cat"], stdin=base64.b64encode(b"fed\n").decode())["stdout"] == b"fed\n"


def test_a_command_list_the_shell_would_act_on_runs_in_the_shell(client: httpx.Client, ws: Path) -> None:
    """Assignments, builtins, exported functions, programs not found and scripts with no `#!` line
    are the shell's to run: each answers as `bash -c` of the list does."""
    assert b"FROM_LIST=1" in run(client, ["FROM_LIST=1", "env"])["stdout"]
    assert run(client, ["cd", "/"])["exit_code"] == 0
    function = run(client, ["greet"], env={"BASH_FUNC_greet%%": "() { echo hi from a function; }"})
    assert function["stdout"] == b"hi from a function\n"
    missing = run(client, ["no-such-program-here", "x"])
    assert missing["exit_code"] == 127 and b"command not found" in missing["stderr"]
    plain = ws / "plain"
    plain.write_text("echo from a script with no first line\n")
    plain.chmod(0o755)
    assert run(client, [str(plain)])["stdout"] == b"from a script with no first line\n"


def test_a_command_list_run_without_a_shell_is_killed_whole_at_its_timeout(client: httpx.Client) -> None:
    spawn = "import subprocess, time; p = subprocess.Popen(['sleep', '30'], start_new_session=True); print(p.pid, flush=True); time.sleep(30)"
    answer = run(client, ["python3", "-c", spawn], timeout=0.5)
    assert answer["exit_code"] == 124 and answer["timed_out"] is True and answer["duration"] < 3
    assert wait_dead(int(answer["stdout"])), "its child in a session of its own survived the timeout"


def test_login_shell_reads_profile_and_bashrc(client: httpx.Client, ws: Path) -> None:
    (ws / ".bashrc").write_text("export FROM_BASHRC=yes\n")
    command = "shopt -q login_shell && echo login; echo rc=$FROM_BASHRC"
    assert run(client, command, env={"HOME": str(ws)})["stdout"] == b"rc=\n"
    answer = run(client, command, env={"HOME": str(ws)}, login_shell=True)
    assert answer["stdout"] == b"login\nrc=yes\n"


GUARDED_BASHRC = """\
# If not running interactively, don't do anything (Debian, Ubuntu, SWE-bench images)
case $- in
    *i*) ;;
      *) return;;
esac
export FROM_BASHRC=yes
alias echo='echo aliased'
"""


def test_login_shell_gets_past_the_interactivity_guard_of_bashrc(client: httpx.Client, ws: Path) -> None:
    """As published, a login shell is interactive while ~/.bashrc runs, so its guard lets the
    rest (conda activation, in SWE-bench images) run; the command then runs with no aliases and
    no job control, and bash's complaint that it has no terminal for job control is dropped,
    while the command's own stderr, even the same words, is kept."""
    (ws / ".bashrc").write_text(GUARDED_BASHRC)
    command = "echo rc=$FROM_BASHRC; sleep 0 & wait; echo 'no job control in this shell' >&2; [[ $- != *m* ]]"
    answer = run(client, command, env={"HOME": str(ws)}, login_shell=True)
    assert (answer["exit_code"], answer["stdout"]) == (0, b"rc=yes\n")
    assert answer["stderr"] == b"no job control in this shell\n"
    answer = run(client, "echo rc=$FROM_BASHRC", env={"HOME": str(ws)})
    assert (answer["stdout"], answer["stderr"]) == (b"rc=\n", b"")


def test_missing_cwd_and_file_cwd_are_400(client: httpx.Client, ws: Path) -> None:
    response = client.post("/exec", json={"command": "true", "cwd": "/nonexistent/orchard"})
    assert response.status_code == 400
    assert response.json() == {"error": "cwd does not exist: /nonexistent/orchard"}
    (ws / "f").write_text("x")
    response = client.post("/exec", json={"command": "true", "cwd": str(ws / "f")})
    assert response.status_code == 400
    assert "not a directory" in response.json()["error"]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"command": 5}, "command"),
        ({"command": [1]}, "command"),
        ({"command": []}, "command"),
        ({"command": "true", "env": ["A=1"]}, "env"),
        ({"command": "true", "env": {"A": 1}}, "'A'"),
        ({"command": "true", "cwd": 3}, "cwd"),
        ({"command": "true", "timeout": "soon"}, "timeout"),
        ({"command": "true", "timeout": -1}, "timeout"),
        ({"command": "true", "login_shell": "yes"}, "login_shell"),
        ({"command": "true", "max_output": 1.5}, "max_output"),
        ({"command": "true", "stdin": "not base64!"}, "stdin"),
        ({"command": "true", "timeuot": 3}, "timeuot"),
    ],
)
def test_wrong_field_types_are_400_naming_the_field(client: httpx.Client, fields: dict, named: str) -> None:
    response = client.post("/exec", json=fields)
    assert response.status_code == 400
    assert named in response.json()["error"]


def test_malformed_json_is_400(client: httpx.Client) -> None:
    response = client.post("/exec", content=b"{not json")
    assert response.status_code == 400
    assert "JSON" in response.json()["error"]
    assert client.post("/exec", json=["true"]).status_code == 400


def test_agent_runtime_env_does_not_leak(client: httpx.Client) -> None:
    names = {line.split("=", 1)[0] for line in run(client, "env")["stdout"].decode().splitlines()}
    assert names.isdisjoint({*AGENT_ONLY_ENV, "ORCHARD_AGENT_TOKEN"})
    assert {"PATH", "HOME", "TMPDIR"} <= names


def test_timeout_kills_the_whole_group(client: httpx.Client) -> None:
    command = "(trap '' TERM; echo grandchild $BASHPID; exec sleep 30) & wait"
    answer = run(client, command, timeout=0.5)
    assert answer["exit_code"] == 124 and answer["timed_out"] is True
    assert answer["stdout"].startswith(b"grandchild ")  # partial output is kept
    pid = int(answer["stdout"].split()[1])
    assert answer["stderr"].endswith(b"\n[orchard: command timed out after 0.5 s]\n")
    assert answer["duration"] < 3
    assert wait_dead(pid), f"grandchild {pid} survived the timeout"


def test_background_process_holding_stdout_does_not_hang(client: httpx.Client, ws: Path) -> None:
    marker = ws / "still-alive"
    command = f"(sleep 0.3; echo late; touch {marker}; sleep 30) & echo $!"
    started = time.monotonic()
    answer = run(client, command, timeout=10)
    assert time.monotonic() - started < 2
    assert answer["exit_code"] == 0 and answer["timed_out"] is False
    pid = int(answer["stdout"])
    try:
        # Its later output is drained, so writing after the call neither blocks nor kills it.
        deadline = time.monotonic() + 3
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.exists()
    finally:
        os.kill(pid, signal.SIGKILL)


def test_fifty_megabytes_are_capped_with_a_marker(client: httpx.Client) -> None:
    started = time.monotonic()
    answer = run(client, "head -c 50000000 /dev/zero")
    assert time.monotonic() - started < 5
    assert answer["stdout_bytes"] == 50_000_000 and answer["truncated"] is True
    dropped = 50_000_000 - 8 * 1024 * 1024
    marker = f"\n[orchard: {dropped} bytes truncated]\n".encode()
    assert answer["stdout"] == b"\0" * (4 * 1024 * 1024) + marker + b"\0" * (4 * 1024 * 1024)


def test_truncation_keeps_head_and_tail(client: httpx.Client) -> None:
    command = "printf start; head -c 100000 /dev/zero; printf end; echo err >&2"
    answer = run(client, command, max_output=10)
    marker = f"\n[orchard: {100008 - 10} bytes truncated]\n".encode()
    assert answer["stdout"] == b"start" + marker + b"\0\0end"
    assert answer["stderr"] == b"err\n"  # the cap is per stream
    assert answer["stdout_bytes"] == 100008 and answer["truncated"] is True


def test_binary_stdin_and_output_round_trip(client: httpx.Client) -> None:
    data = bytes(range(256)) * 4
    stdin = base64.b64encode(data).decode()
    answer = run(client, "cat; cat /dev/null; printf '\\377\\000' >&2", stdin=stdin)
    assert answer["stdout"] == data and answer["stderr"] == b"\xff\x00"
    assert answer["stdout_bytes"] == len(data)
    answer = run(client, "cat", timeout=5)  # without stdin, stdin is /dev/null (not the agent's)
    assert (answer["exit_code"], answer["stdout"]) == (0, b"")


def test_large_stdin_ignored_by_the_command_does_not_hang(client: httpx.Client) -> None:
    stdin = base64.b64encode(b"x" * (4 * 1024 * 1024)).decode()
    assert run(client, "true", stdin=stdin, timeout=10)["exit_code"] == 0
    assert run(client, "wc -c", stdin=stdin, timeout=10)["stdout"].strip() == b"4194304"


def heredoc(size: int) -> tuple[str, bytes]:
    """A command of about ``size`` bytes writing text through a heredoc, and the sha256 line it prints."""
    line = 'it\'s $HOME "quoted" `tick` \\ x ' * 3 + "\n"
    text = line * (size // len(line))
    command = f"cat > big.txt <<'ORCHARD_EOF'\n{text}ORCHARD_EOF\nsha256sum big.txt\n"
    return command, f"{hashlib.sha256(text.encode()).hexdigest()}  big.txt\n".encode()


def files_in(folder: Path) -> list[Path]:
    return [path for path in folder.rglob("*") if not path.is_dir()]


@pytest.mark.parametrize(("size", "login"), [(140_000, False), (2 * 2**20, True)])
def test_commands_past_the_argv_limit_run(client: httpx.Client, agent: Agent, ws: Path, size: int, login: bool) -> None:
    """Linux refuses one argv string over 128 KiB and all of argv over about 2 MiB. The script is
    in no file (nothing in the command's reach could remove or replace it), and the shell closed
    what it read it from before running it."""
    command, sha = heredoc(size)
    command += 'echo "files: $(find "$TMPDIR" -name "*command*" 2>/dev/null | wc -l)"; '
    command += 'ls -l /proc/$$/fd | grep -c memfd; echo "$GREETING $(pwd)"; tr a-z A-Z'
    stdin = base64.b64encode(b"from stdin").decode()
    answer = run(client, command, cwd=str(ws), env={"GREETING": "hi", "HOME": str(ws)}, stdin=stdin, login_shell=login)
    assert (answer["exit_code"], answer["error"]) == (0, None), answer["stderr"]
    assert answer["stdout"] == sha + f"files: 0\n0\nhi {ws}\nFROM STDIN".encode()
    assert files_in(agent.tmpdir) == []


def test_a_long_command_that_times_out_is_killed_whole(client: httpx.Client, agent: Agent) -> None:
    command = f"#{'x' * 200_000}\n(trap '' TERM; echo grandchild $BASHPID; exec sleep 30) & wait"
    answer = run(client, command, timeout=0.5)
    assert (answer["exit_code"], answer["timed_out"]) == (124, True)
    assert wait_dead(int(answer["stdout"].split()[1]))
    assert files_in(agent.tmpdir) == []


OWN_FILE = 'f=$(ls "$TMPDIR"/orchard-agent-*/command-*); stat -c "%a $(stat -c %a "${f%/*}")" "$f"'
"""Shell: the session command's own file, its mode and its folder's, as `600 700`."""


def test_a_long_command_in_a_session_keeps_its_state(client: httpx.Client, agent: Agent, ws: Path) -> None:
    command, sha = heredoc(2 * 2**20)
    command = f"cd {ws}; {command}LONG=kept; {OWN_FILE}"
    answer = run(client, command, "/shell", session="long", timeout=30)
    assert (answer["exit_code"], answer["error"], answer["stdout"]) == (0, None, sha + b"600 700\n")
    assert run(client, "echo $LONG; pwd", "/shell", session="long")["stdout"] == f"kept\n{ws}\n".encode()
    assert files_in(agent.tmpdir) == []


def test_a_session_script_folder_that_is_no_longer_private_is_replaced(client: httpx.Client, agent: Agent) -> None:
    """The agent checks its folder before each use: one that is no longer 0700 (or not its own, or
    a link) is left alone, and a new one made."""
    long = f"#{'x' * 8000}\n"
    first = run(client, f'{long}f=$(ls "$TMPDIR"/orchard-agent-*/command-*); echo "${{f%/*}}"', "/shell")
    folder = Path(first["stdout"].decode().strip())
    folder.chmod(0o755)
    try:
        second = run(client, f'{long}ls -d "$TMPDIR"/orchard-agent-*/command-*; {OWN_FILE}', "/shell")
        path, modes = second["stdout"].decode().splitlines()
        assert Path(path).parent != folder and modes == "600 700"
    finally:
        folder.rmdir()


def test_a_session_command_that_puts_a_folder_in_place_of_its_file_is_answered(client: httpx.Client) -> None:
    """The file is removed afterwards whatever the command did to it: a folder there is no 500."""
    command = f'#{"x" * 8000}\nf=$(ls "$TMPDIR"/orchard-agent-*/command-*); rm -- "$f" && mkdir -- "$f" && echo made'
    answer = run(client, command, "/shell", session="folder")
    assert (answer["exit_code"], answer["stdout"]) == (0, b"made\n")
    assert run(client, "echo next", "/shell", session="folder")["stdout"] == b"next\n"


def test_a_command_over_the_cap_is_413_naming_the_limit(client: httpx.Client) -> None:
    command = "#" * (16 * 2**20 + 1)
    for route, body in (("/exec", {"command": command}), ("/shell", {"command": command, "session": "cap"})):
        response = client.post(route, json=body)
        assert response.status_code == 413
        assert response.json()["error"] == (
            "command is 16777217 bytes, over the limit of 16777216 (16 MiB); write it to a file and run that"
        )
    assert run(client, "echo still here")["stdout"] == b"still here\n"  # the connection is kept


def test_concurrent_execs(agent: Agent) -> None:
    results: dict[int, bytes] = {}

    def one(i: int) -> None:
        with agent.client() as c:
            results[i] = run(c, f"sleep 0.4; echo {i}")["stdout"]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert time.monotonic() - started < 2.5  # sequential would take 3.2 s
    assert results == {i: f"{i}\n".encode() for i in range(8)}


# -- files ---------------------------------------------------------------------------------


def test_file_binary_round_trip_with_nested_parents(client: httpx.Client, ws: Path) -> None:
    data = bytes(range(256)) * 1000
    path = ws / "a" / "b" / "c.bin"
    response = client.put("/files", params={"path": str(path)}, content=data)
    assert response.status_code == 200
    assert response.json() == {"path": str(path), "size": len(data)}
    assert path.read_bytes() == data
    assert [p.name for p in path.parent.iterdir()] == ["c.bin"]  # no temporary file left
    response = client.get("/files", params={"path": str(path)})
    assert response.status_code == 200 and response.content == data
    assert response.headers["content-type"] == "application/octet-stream"


def test_file_overwrite_and_mode(client: httpx.Client, ws: Path) -> None:
    path = ws / "script.sh"
    assert client.put("/files", params={"path": str(path), "mode": "755"}, content=b"1").is_success
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert client.put("/files", params={"path": str(path)}, content=b"22").json()["size"] == 2
    assert path.read_bytes() == b"22"
    assert stat.S_IMODE(path.stat().st_mode) == 0o755  # an overwrite keeps the mode
    response = client.put("/files", params={"path": str(path), "mode": "999"}, content=b"")
    assert response.status_code == 400 and "mode" in response.json()["error"]


def test_relative_paths_are_in_the_workdir(client: httpx.Client, agent: Agent, ws: Path) -> None:
    relative = f"{ws.name}/rel.txt"
    assert client.put("/files", params={"path": relative}, content=b"rel").is_success
    assert (ws / "rel.txt").read_bytes() == b"rel"
    assert client.get("/files", params={"path": relative}).content == b"rel"


def test_file_errors(client: httpx.Client, ws: Path) -> None:
    missing = client.get("/files", params={"path": str(ws / "missing")})
    assert missing.status_code == 404 and "missing" in missing.json()["error"]
    directory = client.get("/files", params={"path": str(ws)})
    assert directory.status_code == 400
    assert directory.json() == {"error": f"is a directory: {ws}"}
    assert client.put("/files", params={"path": str(ws)}, content=b"x").status_code == 400
    assert client.get("/files", params={"path": ""}).status_code == 400
    assert client.get("/files").status_code == 400


def test_interrupted_upload_leaves_nothing(agent: Agent, ws: Path) -> None:
    target = ws / "partial.bin"
    request = (
        f"PUT /files?path={target} HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Length: 1000\r\n\r\n"
    ).encode() + b"only a part"
    status, body = raw_exchange(agent.sock, request, close_write=True)
    assert status == 400 and "ended" in body["error"]
    assert list(ws.iterdir()) == []


def test_list_files_in_the_published_shape_with_a_broken_symlink(client: httpx.Client, ws: Path) -> None:
    """As published: a folder's ``size`` is its ``st_size``, ``modified`` the local time in whole
    seconds with no zone; unlike published (500), a broken link is listed, with its own time."""
    (ws / "b.txt").write_bytes(b"12345")
    (ws / "a_dir").mkdir()
    (ws / "c_link").symlink_to(ws / "b.txt")
    (ws / "d_broken").symlink_to(ws / "nowhere")
    os.utime(ws / "b.txt", (0, 1_700_000_000.75))
    os.utime(ws / "d_broken", (0, 1_600_000_000.25), follow_symlinks=False)
    response = client.get("/files/list", params={"path": str(ws)})
    assert response.status_code == 200
    listing = response.json()
    assert listing["path"] == str(ws)
    rows = [(f["name"], f["type"], f["size"]) for f in listing["files"]]
    assert rows == [
        ("a_dir", "directory", (ws / "a_dir").stat().st_size),
        ("b.txt", "file", 5),
        ("c_link", "file", 5),
        ("d_broken", "file", 0),
    ]
    assert rows[0][2] > 0  # not 0 for a folder
    local = {f["name"]: f["modified"] for f in listing["files"]}
    assert local["b.txt"] == local["c_link"] == time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(1_700_000_000))
    assert local["d_broken"] == time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(1_600_000_000))
    a_dir = time.localtime((ws / "a_dir").stat().st_mtime)
    assert local["a_dir"] == time.strftime("%Y-%m-%dT%H:%M:%S", a_dir)


def test_list_errors(client: httpx.Client, ws: Path) -> None:
    assert client.get("/files/list", params={"path": str(ws / "nope")}).status_code == 404
    (ws / "f").write_text("x")
    response = client.get("/files/list", params={"path": str(ws / "f")})
    assert response.status_code == 400 and "not a directory" in response.json()["error"]


# -- archives ------------------------------------------------------------------------------


def test_archive_round_trip(client: httpx.Client, ws: Path) -> None:
    source = ws / "project"
    (source / "src" / "deep").mkdir(parents=True)
    (source / "src" / "deep" / "x.bin").write_bytes(bytes(range(256)))
    (source / "README").write_text("readme")
    (source / "link").symlink_to("README")
    response = client.get("/archive", params={"path": str(source)})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
        names = set(tar.getnames())
    assert {"project", "project/README", "project/link", "project/src/deep/x.bin"} <= names

    dest = ws / "copy"
    response = client.put("/archive", params={"path": str(dest)}, content=response.content)
    assert response.status_code == 200
    assert response.json() == {"path": str(dest), "files": len(names)}
    assert (dest / "project" / "src" / "deep" / "x.bin").read_bytes() == bytes(range(256))
    assert os.readlink(dest / "project" / "link") == "README"


def test_archive_of_one_file_and_missing(client: httpx.Client, ws: Path) -> None:
    (ws / "one.txt").write_text("1")
    response = client.get("/archive", params={"path": str(ws / "one.txt")})
    with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
        assert tar.getnames() == ["one.txt"]
    assert client.get("/archive", params={"path": str(ws / "nope")}).status_code == 404


@pytest.mark.parametrize(
    "archive",
    [
        tar_bytes({"ok.txt": b"fine", "../escape.txt": b"evil"}),
        tar_bytes({"ok.txt": b"fine", "/abs.txt": b"evil"}),
        tar_bytes({"ok.txt": b"fine", "dev": b""}, dev=tarfile.CHRTYPE),
    ],
    ids=["dotdot", "absolute", "device"],
)
def test_unsafe_archives_are_refused_whole(client: httpx.Client, ws: Path, archive: bytes) -> None:
    dest = ws / "dest"
    response = client.put("/archive", params={"path": str(dest)}, content=archive)
    assert response.status_code == 400
    assert response.json()["error"]
    assert not (ws / "escape.txt").exists()
    assert list(dest.iterdir()) == []  # nothing was extracted, not even ok.txt


def test_put_archive_rejects_garbage(client: httpx.Client, ws: Path) -> None:
    response = client.put("/archive", params={"path": str(ws)}, content=b"not a tar" * 100)
    assert response.status_code == 400 and "tar" in response.json()["error"]


# -- apply_patch ---------------------------------------------------------------------------

PATCH = """\
--- a/hello.txt
+++ b/hello.txt
@@ -1,2 +1,2 @@
-hello
+goodbye
 world
"""


def test_apply_patch_success_then_failure(client: httpx.Client, agent: Agent, ws: Path) -> None:
    (ws / "hello.txt").write_text("hello\nworld\n")
    response = client.post("/apply_patch", json={"patch": PATCH, "cwd": str(ws)})
    assert response.status_code == 200
    answer = response.json()
    assert answer["success"] is True and answer["exit_code"] == 0 and answer["error"] is None
    assert (ws / "hello.txt").read_text() == "goodbye\nworld\n"

    answer = client.post("/apply_patch", json={"patch": PATCH, "cwd": str(ws)}).json()
    assert answer["success"] is False and answer["exit_code"] != 0
    assert "hello.txt" in answer["stderr"]
    assert (ws / "hello.txt").read_text() == "goodbye\nworld\n"
    assert files_in(agent.tmpdir) == []  # the patch file is removed


def test_apply_patch_validates(client: httpx.Client) -> None:
    assert client.post("/apply_patch", json={"patch": 3}).status_code == 400
    response = client.post("/apply_patch", json={"patch": PATCH, "cwd": "/nonexistent/x"})
    assert response.status_code == 400 and "cwd" in response.json()["error"]


# -- HTTP ----------------------------------------------------------------------------------


def test_token_missing_is_401_and_wrong_is_403(agent: Agent, ws: Path) -> None:
    with agent.client(token=None) as c:
        response = c.get("/health")
        assert response.status_code == 401 and "Bearer" in response.json()["error"]
        assert c.get("/nope").status_code == 401  # authentication comes before routing
    with agent.client(token="wrong") as c:
        response = c.post("/exec", json={"command": f"touch {ws}/ran"})
        assert response.status_code == 403 and response.json()["error"]
    assert not (ws / "ran").exists()


def test_unknown_route_404_and_wrong_method_405(client: httpx.Client) -> None:
    response = client.get("/nope")
    assert response.status_code == 404 and "/nope" in response.json()["error"]
    response = client.get("/exec")
    assert response.status_code == 405
    assert response.headers["allow"] == "POST" and "POST" in response.json()["error"]
    assert client.delete("/files", params={"path": "x"}).status_code == 405


def test_body_over_the_limit_is_413(agent: Agent) -> None:
    for line in ("PUT /files?path=big", "POST /exec"):
        request = (
            f"{line} HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 2000000000\r\n\r\n"
        ).encode()
        status, body = raw_exchange(agent.sock, request)
        assert status == 413 and "limit" in body["error"]


def test_keep_alive_serves_many_requests_on_one_connection(agent: Agent) -> None:
    connection = UnixHTTPConnection(agent.sock)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    sockets = []
    try:
        for i in range(5):
            connection.request("POST", "/exec", body=json.dumps({"command": f"echo {i}"}), headers=headers)
            sockets.append(connection.sock)
            response = connection.getresponse()
            assert response.status == 200 and not response.will_close
            assert split_exec_answer(response.read())[1] == f"{i}\n".encode()
            connection.request("GET", "/health", body="{}")  # an error in between keeps it open
            sockets.append(connection.sock)
            response = connection.getresponse()
            assert response.status == 401 and not response.will_close
            response.read()
        assert all(s is sockets[0] for s in sockets)
    finally:
        connection.close()


# -- process level -------------------------------------------------------------------------


def test_over_tcp() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="oa-"))
    proc = start_agent(root, "--tcp", f"127.0.0.1:{port}")
    try:
        url = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=url, headers=headers) as c:

            def answers() -> bool:
                try:
                    return c.get("/health").status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(answers, proc, "answered over TCP")
            answer = run(c, ["echo", "tcp ok"])
            assert answer["stdout"] == b"tcp ok\n"
            assert c.get("/health", headers={"Authorization": "Bearer x"}).status_code == 403
    finally:
        stop(proc)
        shutil.rmtree(root, ignore_errors=True)


def test_sigterm_exits_cleanly_and_removes_the_socket() -> None:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="oa-"))
    sock = root / "a.sock"
    sock.write_bytes(b"")  # a stale file where the socket goes
    proc = start_agent(root, "--unix", str(sock))
    try:
        wait_until(lambda: stat.S_ISSOCK(sock.lstat().st_mode), proc, "replaced the stale file")
        assert stat.S_IMODE(sock.stat().st_mode) == 0o666
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(5) == 0
        assert not sock.exists()
    finally:
        stop(proc)
        shutil.rmtree(root, ignore_errors=True)


def test_refuses_to_start_without_a_token() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ORCHARD_AGENT_TOKEN"}
    argv = [sys.executable, "-s", "-S", str(SERVER), "--unix", "/tmp/orchard-never.sock"]
    result = subprocess.run(argv, env=env, capture_output=True, timeout=10)
    assert result.returncode == 2
    assert b"ORCHARD_AGENT_TOKEN" in result.stderr
    assert not os.path.exists("/tmp/orchard-never.sock")


def test_import_is_side_effect_free_and_the_module_closure_small() -> None:
    script = (
        "import importlib, os, sys, threading\n"
        f"sys.path.append({str(SERVER.parent.parent)!r})\n"  # as the entry does: the package is `agent`
        f"names = sorted(f[:-3] for f in os.listdir({str(SERVER.parent)!r}) if f.endswith('.py'))\n"
        "modules = [importlib.import_module(f'agent.{n}'.removesuffix('.__init__')) for n in names]\n"
        "module = importlib.import_module('agent.server')\n"
        "assert callable(module.main) and callable(module.serve)\n"
        "assert threading.active_count() == 1\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-s", "-S", "-c", script], capture_output=True, text=True, timeout=10)
    assert result.returncode == 0, result.stderr
    modules = set(result.stdout.split())
    assert modules.isdisjoint({"asyncio", "multiprocessing", "typing", "argparse", "dataclasses"})


def test_no_shell_gives_an_error_not_a_crash() -> None:
    root = tempfile.mkdtemp(dir="/tmp", prefix="oa-")
    config = AgentConfig(TOKEN, root, shell=Shell(None, False))
    server = make_server(config, tcp=("127.0.0.1", 0))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            response = c.post("/exec", json={"command": "true"})
        assert response.status_code == 200
        facts = split_exec_answer(response.content)[0]
        assert facts["exit_code"] is None and "no shell" in facts["error"]
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("bash", [True, False])
def test_a_script_that_cannot_be_read_fails_rather_than_running_nothing(bash: bool) -> None:
    """`eval "$(<FILE)"` of a missing file runs nothing and exits 0: the agent's forms exit 126."""
    shell = Shell("/bin/bash" if bash else "/bin/sh", bash)
    for command in (shell.from_fd(97), shell.from_file("/nonexistent/orchard-script")):
        done = subprocess.run(shell.argv(command, False), capture_output=True, text=True)
        assert done.returncode == 126 and done.stderr, (command, done)


def test_without_memory_files_a_long_command_runs_from_a_private_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def no_memfd(name: str, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")  # as on old kernels, some seccomp profiles

    monkeypatch.setattr(os, "memfd_create", no_memfd)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    config = AgentConfig(TOKEN, str(tmp_path))
    command, sha = heredoc(140_000)
    with long_command(command + OWN_FILE, config) as (script, fds):
        assert fds == ()
        done = run_process(config.shell.argv(script, False), cwd=str(tmp_path), env=dict(os.environ))
    assert (done.exit_code, done.stdout.value()) == (0, sha + b"600 700\n"), done.stderr.value()
    assert files_in(tmp_path / "tmp") == []


def test_without_pidfd_a_thread_notices_the_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pidfd(pid: int) -> int:
        raise OSError(38, "Function not implemented")  # as on old kernels and some sandboxes

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    env = dict(os.environ)
    result = run_process(["/bin/sh", "-c", "sleep 5 & echo $!; exit 3"], cwd="/", env=env, timeout=4)
    pid = int(result.stdout.value())
    os.kill(pid, signal.SIGKILL)
    assert (result.exit_code, result.timed_out) == (3, False) and result.duration < 2
    result = run_process(["/bin/sh", "-c", "sleep 5"], cwd="/", env=env, timeout=0.2)
    assert (result.exit_code, result.timed_out) == (124, True) and result.duration < 2
