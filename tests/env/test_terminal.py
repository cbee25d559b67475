"""Interactive terminals: PTY frames straight to the agent, through the service's WebSocket, and
`orchard sandbox shell` driven from a real pseudo-terminal."""

from __future__ import annotations

import base64
import json
import os
import pty
import select
import subprocess
import sys
import time

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from orchard.env import Client
from orchard.env.pty import init_frame
from orchard.errors import InvalidRequest, NotFound


@pytest.fixture(scope="module")
def box(client, base_image):
    with client.create(base_image) as box:
        yield box


def _gone(box, pid: int) -> bool:
    for _ in range(50):
        if box.exec(f"test -d /proc/{pid}").exit_code != 0:
            return True
        time.sleep(0.1)
    return False


def test_a_shell_on_a_real_terminal(box):
    with box.terminal(rows=30, cols=100) as term:
        assert term.recv()["type"] == "ready"
        term.write("stty size; tty; echo $((6*7))\n")
        out = term.read_until(b"42\r\n")
        assert b"30 100\r\n/dev/pts/" in out
        term.resize(40, 120)
        term.write("stty size; cd /tmp; X=5\n")
        term.read_until(b"40 120\r\n")
        term.write("echo $PWD $X; exit 3\n")
        assert b"/tmp 5" in term.read_until(b"/tmp 5")
        assert term.wait() == 3


def test_signals_reach_the_process_group_and_report_as_negative(box):
    with box.terminal(["sh", "-c", "sleep 100 & sleep 100"]) as term:
        term.recv()
        term.signal("KILL")
        assert term.wait() == -9
    with box.terminal(["sleep", "100"]) as term:
        term.recv()
        term.write(b"\x03")  # ^C on the terminal: SIGINT to the foreground group
        assert term.wait() == -2


def test_hanging_up_ends_the_process(box):
    term = box.terminal(["sleep", "300"])
    pid = term.recv()["pid"]
    term._frames.close()  # no close frame: the connection just goes away
    assert _gone(box, pid)


def test_commands_and_cwd_and_login_shell(box):
    with box.terminal(["pwd"], cwd="/etc") as term:
        assert b"/etc" in term.read_until(b"/etc")
        assert term.wait() == 0
    box.exec("echo 'export GREETING=hello-login' >> ~/.profile")
    with box.terminal(["sh", "-c", "echo $GREETING"], login_shell=True) as term:
        assert b"hello-login" in term.read_until(b"hello-login")


GUARDED_BASHRC = """\
# If not running interactively, don't do anything (Debian, Ubuntu, SWE-bench images)
case $- in
    *i*) ;;
      *) return;;
esac
export FROM_BASHRC=yes
"""


def test_a_login_terminal_gets_past_the_bashrc_guard(box):
    """As published, a login terminal's command runs after ~/.bashrc, sourced interactively so
    that its "not interactive: return" guard lets the rest run; the command stays in the process
    group that signals reach (the shell, interactive, ignores TERM itself)."""
    box.write_file("/tmp/guarded/.bashrc", GUARDED_BASHRC)
    cmd = ["sh", "-c", "echo rc=$FROM_BASHRC.; sleep 20"]
    with box.terminal(cmd, env={"HOME": "/tmp/guarded"}, login_shell=True) as term:
        out = term.read_until(b".\r\n")
        assert b"rc=yes." in out and b"job control" not in out
        term.signal("TERM")
        assert term.wait() == 128 + 15


def test_bad_init_frames_get_error_frames(box):
    with box.terminal(["/no/such/program"]) as term:
        frame = term.recv()
        assert frame["type"] == "error" and "could not start /no/such/program" in frame["message"]
    with box.terminal(cwd="/no/such/dir") as term:
        assert term.recv() == {"type": "error", "message": "cwd is not a directory: /no/such/dir"}


def test_later_frames_that_make_no_sense_are_ignored(box):
    """As published: clients (the published SDK among them) stop at the first error frame, so a
    bad resize, an unknown type, bad base64 or a line that is no frame get none; an unknown
    signal name means TERM, and names are taken in any case."""
    with box.terminal(["cat"]) as term:
        term.recv()
        term._frames.send({"type": "resize", "rows": 0, "cols": 80})
        term._frames.send({"type": "resize", "rows": "many"})
        term._frames.send({"type": "dance"})
        term._frames.send({"type": "stdin", "data": "not base64!"})
        term._frames.sock.sendall(b'not json\n[1, 2]\n{"type": 5}\n' + b"x" * (2 << 20) + b"\n")
        term.write("still here\n")
        term.read_until(b"still here\r\n")  # an error frame would raise here
        term.signal("NOSUCH")
        assert term.wait() == -15
    with box.terminal(["sleep", "100"]) as term:
        term.recv()
        term.signal("quit")
        assert term.wait() == -3


def test_a_shell_in_an_image_without_python_or_bash(client, busybox_image):
    with client.create(busybox_image) as bb, bb.terminal() as term:
        term.recv()
        term.write("echo hi $((1+2)); exit 4\n")
        term.read_until(b"hi 3")
        assert term.wait() == 4


def test_terminals_through_the_service(service, base_image):
    url, key = service
    with Client(url=url, api_key=key) as remote:
        box = remote.create(base_image)
        with box.terminal(["bash", "-c", "read line; echo got:$line; exit 7"]) as term:
            term.recv()
            term.write("ping\n")
            assert b"got:ping" in term.read_until(b"got:ping")
            assert term.wait() == 7
        pid = (term := box.terminal(["sleep", "300"])).recv()["pid"]
        term._frames.close()  # the WebSocket goes away: the service drops the agent connection
        assert _gone(box, pid)

        ws_url = url.replace("http://", "ws://") + f"/sandboxes/{box.id}/exec/pty"
        with connect(f"{ws_url}?api_key={key}") as ws:  # the query-parameter form of the key
            ws.send(json.dumps(init_frame(["echo", "by-query"])))
            frames = [json.loads(m) for m in ws]
        assert frames[0]["type"] == "ready" and frames[-1] == {"type": "exit", "code": 0}
        assert b"by-query" in b"".join(base64.b64decode(f["data"]) for f in frames if f["type"] == "stdout")

        with pytest.raises(InvalidStatus) as refused:
            connect(f"{ws_url}?api_key=wrong")
        assert refused.value.response.status_code == 403
        with Client(url=url, api_key="wrong") as stranger, pytest.raises(InvalidRequest, match="API key"):
            stranger.attach(box.id).terminal()

        with pytest.raises(InvalidStatus) as refused:  # refused at the handshake, as published
            connect(f"{ws_url.replace(box.id, 'sb-nosuch')}?api_key={key}")
        assert refused.value.response.status_code == 404
        with Client(url=url, api_key=key) as client, pytest.raises(NotFound, match="no sandbox 'sb-nosuch'"):
            client.attach("sb-nosuch").terminal()


def test_orchard_sandbox_shell_from_a_real_terminal(service, base_image, tmp_path):
    url, key = service
    with Client(url=url, api_key=key) as remote:
        box = remote.create(base_image)
        env = {**os.environ, "ORCHARD_URL": url, "ORCHARD_API_KEY": key, "ORCHARD_HOME": str(tmp_path)}
        master, slave = pty.openpty()
        proc = subprocess.Popen(  # typed-ahead input must survive the switch to raw mode
            [sys.executable, "-m", "orchard", "sandbox", "shell", box.id],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            start_new_session=True,
        )
        os.close(slave)
        os.write(master, b"echo $((6*7)); exit 5\n")
        seen, deadline = b"", time.monotonic() + 60
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: the command exited and the terminal closed
                    break
                seen += chunk
            elif proc.poll() is not None:
                break
        os.close(master)
        proc.kill()
        assert proc.wait() == 5, seen
        assert b"42" in seen

        piped = subprocess.run(
            [sys.executable, "-m", "orchard", "sandbox", "shell", box.id],
            input=b"echo hi\n",
            capture_output=True,
            env=env,
            timeout=60,
        )
        assert (piped.returncode, piped.stdout) == (1, b"")
        assert (
            piped.stderr
            == b"error: stdin is not a terminal; use `orchard sandbox exec` to run commands from a script\n"
        )
