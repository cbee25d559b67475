"""``POST /pty``: one `Terminal`, a process on a pseudo-terminal bridged to the JSON frames of the
upgraded connection."""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import selectors
import shlex
import signal
import socket
import subprocess
import threading
import time

from .processes import EXIT_GRACE_S, exit_watch
from .protocol import (
    PTY_INIT_FIELDS,
    PTY_INIT_TIMEOUT_S,
    PTY_MAX_FRAME,
    PTY_SIGNAL_NAMES,
    ApiError,
    field_bool,
    field_env,
    field_str,
)

TYPE_CHECKING = False  # the typing module is not imported at run time (see the module closure)
if TYPE_CHECKING:
    from .config import AgentConfig

PTY_CHUNK = 48 * 1024  # its base64 fits the 64 KiB frames of the API
PTY_HANGUP_GRACE_S = 2.0
PTY_SIGNALS = {name: signal.Signals[f"SIG{name}"] for name in PTY_SIGNAL_NAMES}


class Terminal:
    """One ``/pty`` connection: a process on a pseudo-terminal, bridged to JSON frames."""

    def __init__(
        self, agent: AgentConfig, sock: socket.socket, rfile: io.BufferedIOBase, wfile: io.BufferedIOBase
    ) -> None:
        self.agent, self.sock, self.rfile, self.wfile = agent, sock, rfile, wfile
        self.lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None

    def send(self, frame: dict[str, object]) -> None:
        line = json.dumps(frame, separators=(",", ":")).encode() + b"\n"
        with self.lock, contextlib.suppress(OSError):
            self.wfile.write(line)

    def fail(self, message: str) -> None:
        self.send({"type": "error", "message": message})

    def run(self) -> None:
        self.sock.settimeout(PTY_INIT_TIMEOUT_S)
        try:
            init = self.read_frame()
        except TimeoutError:
            self.fail(f"no init frame within {PTY_INIT_TIMEOUT_S:g} s")
            return
        except ApiError as exc:
            self.fail(exc.message)
            return
        self.sock.settimeout(None)
        if init is None:
            return
        try:
            argv, cwd, env, rows, cols = self.parse_init(init)
        except ApiError as exc:
            self.fail(exc.message)
            return
        master = self.start(argv, cwd, env, rows, cols)
        if master is None:
            return
        assert self.proc is not None
        self.send({"type": "ready", "pid": self.proc.pid})
        output = threading.Thread(target=self.pump_output, args=(master,), name="pty-output", daemon=True)
        output.start()
        try:
            self.read_input(master)
        finally:
            if self.proc.poll() is None:  # the client hung up: end what it started
                self.hang_up()
            output.join()
            os.close(master)

    def read_frame(self) -> dict[str, object] | None:
        line = self.rfile.readline(PTY_MAX_FRAME + 1)
        if not line:
            return None
        if len(line) > PTY_MAX_FRAME:
            raise ApiError(400, f"a frame is larger than {PTY_MAX_FRAME} bytes")
        try:
            frame = json.loads(line)
        except ValueError:
            raise ApiError(400, "a frame is not JSON") from None
        if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
            raise ApiError(400, "a frame must be a JSON object with a string 'type'")
        return frame

    def parse_init(self, frame: dict[str, object]) -> tuple[list[str], str, dict[str, str], int, int]:
        if frame["type"] != "init":
            raise ApiError(400, f"the first frame must be 'init', not {frame['type']!r}")
        unknown = sorted(set(frame) - PTY_INIT_FIELDS)
        if unknown:
            raise ApiError(400, f"unknown init fields: {', '.join(unknown)}")
        cmd = frame.get("cmd")
        if cmd is not None and (not isinstance(cmd, list) or not all(isinstance(a, str) for a in cmd)):
            raise ApiError(400, "cmd must be a list of strings or null")
        login, shell = field_bool(frame, "login_shell"), self.agent.shell.path
        if cmd and not login:
            argv = list(cmd)
        elif shell is None:
            raise ApiError(400, "no shell found (looked for /bin/bash, /usr/bin/bash, /bin/sh)")
        elif cmd:
            argv = self.agent.shell.argv(shlex.join(cmd), login=True)
        else:
            argv = [shell, "-l"] if login else [shell]
        rows, cols = self.size(frame)
        env = {"TERM": "xterm-256color", **self.agent.base_env, **field_env(frame)}
        cwd = field_str(frame, "cwd")
        if cwd is None:
            return argv, self.agent.default_cwd(), env, rows, cols
        path = self.agent.resolve(cwd)
        if not os.path.isdir(path):
            raise ApiError(400, f"cwd is not a directory: {path}")
        return argv, path, env, rows, cols

    @staticmethod
    def size(frame: dict[str, object]) -> tuple[int, int]:
        rows, cols = frame.get("rows", 24), frame.get("cols", 80)
        for name, value in (("rows", rows), ("cols", cols)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 65536:
                raise ApiError(400, f"{name} must be an integer from 1 to 65535")
        return int(rows), int(cols)  # type: ignore[call-overload]

    def start(self, argv: list[str], cwd: str, env: dict[str, str], rows: int, cols: int) -> int | None:
        """Start argv on a new pseudo-terminal as its controlling terminal; the master fd."""
        import fcntl
        import termios

        master, slave = os.openpty()
        set_window_size(master, rows, cols)

        def take_terminal() -> None:  # in the child, after setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        try:
            self.proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                start_new_session=True,
                preexec_fn=take_terminal,
            )
        except OSError as exc:
            os.close(master)
            self.fail(f"could not start {argv[0]}: {exc.strerror or exc}")
            return None
        finally:
            os.close(slave)
        return master

    def pump_output(self, master: int) -> None:
        """Terminal output to stdout frames; once the process exits, the exit frame, then hang up."""
        assert self.proc is not None
        done = exit_watch(self.proc)
        with selectors.DefaultSelector() as selector:
            selector.register(master, selectors.EVENT_READ)
            selector.register(done, selectors.EVENT_READ)
            deadline = None
            while deadline is None or time.monotonic() < deadline:
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                events = selector.select(timeout)
                if not events:
                    break
                if any(key.fd == done for key, _ in events):
                    selector.unregister(done)
                    deadline = time.monotonic() + EXIT_GRACE_S  # output still in flight
                    continue
                try:
                    chunk = os.read(master, PTY_CHUNK)
                except OSError:  # EIO: every holder of the terminal has closed it
                    chunk = b""
                if not chunk:
                    break
                self.send({"type": "stdout", "data": base64.b64encode(chunk).decode()})
        os.close(done)
        self.send({"type": "exit", "code": self.proc.wait()})
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # ends read_input

    def read_input(self, master: int) -> None:
        """Client frames, until the connection ends. A frame that makes no sense is dropped
        without a word, as published: clients (the published SDK among them) end the session at
        the first ``error`` frame, which a typo in a signal name must not do."""
        assert self.proc is not None
        while True:
            try:
                frame = self.read_frame()
            except ApiError:  # not JSON, not an object, or too large
                continue
            except OSError:
                return
            if frame is None:
                return
            kind = frame["type"]
            if kind == "stdin":
                data = frame.get("data")
                with contextlib.suppress(ValueError, OSError):
                    os.write(master, base64.b64decode(data if isinstance(data, str) else "", validate=True))
            elif kind == "signal":
                self.signal(PTY_SIGNALS.get(str(frame.get("sig", "")).upper(), signal.SIGTERM))
            elif kind == "resize":
                with contextlib.suppress(ApiError, OSError):
                    set_window_size(master, *self.size(frame))
            elif kind == "close":
                self.signal(signal.SIGTERM)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def hang_up(self) -> None:
        assert self.proc is not None
        self.signal(signal.SIGHUP)
        self.signal(signal.SIGCONT)
        try:
            self.proc.wait(PTY_HANGUP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)


def set_window_size(fd: int, rows: int, cols: int) -> None:
    import fcntl
    import struct
    import termios

    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
