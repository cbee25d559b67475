"""Running one command: its environment, `run_process` (output captured without polling, stdin fed,
a time-out that kills the whole process tree), out-of-memory notes, the ``/exec`` answer and
``git apply``."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping

from .protocol import AGENT_ENV_PREFIX, DEFAULT_MAX_OUTPUT, TIMEOUT_EXIT_CODE

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_HOME = "/root"
EXIT_GRACE_S = 0.1  # how long output is still read once the command has exited
KILL_WAIT_S = 5.0  # how long a killed process group may take to die before we give up
READ_CHUNK = 1024 * 1024
WRITE_CHUNK = 64 * 1024
AGENT_ENV_VARS = frozenset({"PYTHONHOME", "PYTHONPATH", "LD_LIBRARY_PATH", "PYTHONUTF8", "PYTHONDONTWRITEBYTECODE"})
JOB_CONTROL_WARNINGS = (b"cannot set terminal process group", b"no job control in this shell")
"""What an interactive bash without a terminal writes to stderr first, a line each."""
MAX_WARNING_LINE = 512
SUBREAPER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bin", "orchard-subreaper")
REAPED = [SUBREAPER] if os.access(SUBREAPER, os.X_OK) else []
"""Put in front of every command's argv: it becomes a child subreaper, then execs the command."""
MAX_FREEZE_ROUNDS = 1000  # /proc scans while stopping a process tree (each stops all it found)


def child_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The agent's environment without its own runtime variables, with PATH and HOME set."""
    env = {
        key: value
        for key, value in environ.items()
        if key not in AGENT_ENV_VARS and not key.startswith(AGENT_ENV_PREFIX)  # the token too
    }
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("HOME", DEFAULT_HOME)
    return env


# -- running processes ---------------------------------------------------------------------


class Capture:
    """Collects one output stream, keeping its first and last ``limit / 2`` bytes."""

    __slots__ = ("head", "head_limit", "tail", "tail_limit", "total")

    def __init__(self, limit: int) -> None:
        self.head_limit = limit - limit // 2
        self.tail_limit = limit // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_limit:
            self.tail += chunk
            if len(self.tail) > 2 * self.tail_limit:
                del self.tail[: -self.tail_limit]

    @property
    def truncated(self) -> bool:
        return self.total > self.head_limit + self.tail_limit

    def value(self) -> bytes:
        if not self.truncated:
            return bytes(self.head + self.tail)
        tail = self.tail[-self.tail_limit :] if self.tail_limit else b""
        dropped = self.total - len(self.head) - len(tail)
        return b"".join((self.head, f"\n[orchard: {dropped} bytes truncated]\n".encode(), tail))

    def end(self) -> None:
        """The stream ended: nothing more will be fed."""


class JobControlQuiet(Capture):
    """The stderr of a login bash (interactive, with no terminal): the job-control warnings it
    writes before anything else are dropped, as published ("cannot set terminal process group",
    "no job control in this shell"). Only the stream's first lines are looked at, while each is
    one of those warnings, so nothing the command or its profile writes is touched."""

    __slots__ = ("pending", "warnings")

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.pending: bytearray | None = bytearray()
        self.warnings = list(JOB_CONTROL_WARNINGS)

    def feed(self, chunk: bytes) -> None:
        if self.pending is None:
            super().feed(chunk)
            return
        self.pending += chunk
        while self.warnings:
            end = self.pending.find(b"\n", 0, MAX_WARNING_LINE)
            if end < 0:
                if len(self.pending) < MAX_WARNING_LINE:
                    return  # the rest of the line is still to come
                break
            warning = next((w for w in self.warnings if w in self.pending[:end]), None)
            if warning is None:
                break
            self.warnings.remove(warning)
            del self.pending[: end + 1]
        self.end()

    def end(self) -> None:
        if self.pending is not None:
            pending, self.pending = bytes(self.pending), None
            super().feed(pending)


class ProcessResult:
    """The outcome of one process run."""

    __slots__ = ("duration", "error", "exit_code", "stderr", "stdout", "timed_out")

    def __init__(
        self,
        stdout: Capture,
        stderr: Capture,
        exit_code: int | None = None,
        timed_out: bool = False,
        duration: float = 0.0,
        error: str | None = None,
    ) -> None:
        self.stdout = stdout
        self.stderr = stderr
        self.exit_code = exit_code
        self.timed_out = timed_out
        self.duration = duration
        self.error = error

    def stderr_value(self, timeout: float | None) -> bytes:
        """Captured stderr, with the time-out marker line when the command timed out."""
        value = self.stderr.value()
        if self.timed_out:
            value += f"\n[orchard: command timed out after {timeout:g} s]\n".encode()
        return value


OOM_COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


def oom_kills() -> int | None:
    """How many processes the out-of-memory killer has killed in this sandbox's cgroup so far."""
    for path in OOM_COUNTERS:
        try:
            with open(path, "rb") as f:
                for line in f:
                    if line.startswith(b"oom_kill "):
                        return int(line.split()[1])
        except (OSError, ValueError):
            continue
    return None


def note_oom(result: ProcessResult, before: int | None) -> None:
    """Say so when the command (or part of it) was killed for memory, not by some other SIGKILL."""
    after = oom_kills()
    killed = result.exit_code == 128 + signal.SIGKILL
    if killed and before is not None and after is not None and after > before and result.error is None:
        result.error = "killed by the out-of-memory killer: the sandbox's memory limit was reached"


def run_process(
    argv: list[str],
    *,
    cwd: str,
    env: dict[str, str],
    stdin: bytes | None = None,
    timeout: float | None = None,
    max_output: int = DEFAULT_MAX_OUTPUT,
    pass_fds: tuple[int, ...] = (),
    quiet_job_control: bool = False,
) -> ProcessResult:
    """Run argv in its own session, capturing output without polling; kill its tree on timeout.
    ``pass_fds`` stay open in it, under their numbers (the subreaper execs with them).
    ``quiet_job_control``: argv is an interactive bash, whose job-control warnings are dropped."""
    start = time.monotonic()
    stderr = JobControlQuiet(max_output) if quiet_job_control else Capture(max_output)
    result = ProcessResult(Capture(max_output), stderr)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe() if stdin is not None else (subprocess.DEVNULL, -1)
    try:
        proc = subprocess.Popen(
            [*REAPED, *argv],
            cwd=cwd,
            env=env,
            stdin=in_r,
            stdout=out_w,
            stderr=err_w,
            start_new_session=True,
            pass_fds=pass_fds,
        )
    except BaseException as exc:
        for fd in (out_r, err_r, in_w):
            _close(fd)
        if not isinstance(exc, OSError):
            raise
        result.error = f"could not start {argv[0]}: {exc.strerror or exc}"
        return result
    finally:
        for fd in (out_w, err_w, in_r):
            _close(fd)
    streams = {out_r: result.stdout, err_r: result.stderr}
    exited, result.timed_out = _pump(proc, streams, in_w, stdin or b"", timeout)
    result.stderr.end()
    if exited:
        code = proc.wait()
        result.exit_code = 128 - code if code < 0 else code
    if result.timed_out:
        result.exit_code = TIMEOUT_EXIT_CODE
    result.duration = time.monotonic() - start
    return result


def _pump(
    proc: subprocess.Popen[bytes],
    streams: dict[int, Capture],
    stdin_fd: int,
    stdin: bytes,
    timeout: float | None,
) -> tuple[bool, bool]:
    """Move data between the child's pipes and the captures; return ``(exited, timed_out)``.

    The loop ends when both pipes reached EOF and the child exited; once it exited, pipes still
    held open (by background processes) are read for at most ``EXIT_GRACE_S`` more, then handed
    to a thread that discards their output.
    """
    selector = selectors.DefaultSelector()
    exit_fd = exit_watch(proc)
    selector.register(exit_fd, selectors.EVENT_READ)
    for fd in streams:
        selector.register(fd, selectors.EVENT_READ)
    pending: memoryview | None = memoryview(stdin)
    if stdin_fd >= 0:
        os.set_blocking(stdin_fd, False)
        selector.register(stdin_fd, selectors.EVENT_WRITE)
    open_streams = dict(streams)
    deadline = None if timeout is None else time.monotonic() + timeout
    exited = timed_out = False
    try:
        while open_streams or not exited:
            if deadline is not None and time.monotonic() >= deadline:
                if exited or timed_out:
                    break
                timed_out = True
                kill_tree(proc.pid)
                deadline = time.monotonic() + KILL_WAIT_S
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            for key, _ in selector.select(wait):
                fd = key.fd
                if fd == exit_fd:
                    selector.unregister(fd)
                    exited = True
                    deadline = time.monotonic() + EXIT_GRACE_S
                elif fd == stdin_fd and pending is not None:
                    pending = _feed_stdin(selector, fd, pending)
                else:
                    chunk = os.read(fd, READ_CHUNK)
                    if chunk:
                        open_streams[fd].feed(chunk)
                    else:
                        selector.unregister(fd)
                        del open_streams[fd]
                        os.close(fd)
    finally:
        selector.close()
        os.close(exit_fd)
        if stdin_fd >= 0 and pending is not None:
            _close(stdin_fd)
        if open_streams:
            _discard_in_background(list(open_streams))
    return exited, timed_out


def _feed_stdin(selector: selectors.BaseSelector, fd: int, pending: memoryview) -> memoryview | None:
    """Write the next chunk of stdin; close the pipe when done or when the child closed it."""
    try:
        written = os.write(fd, pending[:WRITE_CHUNK])
    except BlockingIOError:
        return pending
    except OSError:  # BrokenPipeError: the child does not read its stdin
        written = len(pending)
    pending = pending[written:]
    if pending:
        return pending
    selector.unregister(fd)
    os.close(fd)
    return None


def exit_watch(proc: subprocess.Popen[bytes]) -> int:
    """A file descriptor that becomes readable when the process exits (it is not reaped)."""
    try:
        return os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd (old kernel, gVisor): a thread waits instead
        read_fd, write_fd = os.pipe()

        def wait() -> None:
            proc.wait()
            os.close(write_fd)

        threading.Thread(target=wait, name=f"wait-{proc.pid}", daemon=True).start()
        return read_fd


def kill_tree(root: int) -> None:
    """Kill ``root``, everything below it in the process tree, and its process group.

    Stopped first, each round stopping every process found, until a scan finds no new one: a
    stopped process cannot fork, so nothing escapes between the scan and the kill. Then SIGKILL,
    and it returns once each of them is dead (a zombie or gone; at most ``KILL_WAIT_S``), so a
    command reported timed out has nothing of it still running.
    """
    stopped: set[int] = set()
    for _ in range(MAX_FREEZE_ROUNDS):
        found = _descendants(root) - stopped
        if not found:
            break
        for pid in found:
            _signal(pid, signal.SIGSTOP)
        stopped |= found
    for pid in stopped:
        _signal(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(root, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_S
    while (stopped := {pid for pid in stopped if _running(pid)}) and time.monotonic() < deadline:
        time.sleep(0.001)


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not yet a zombie (a SIGKILL is delivered asynchronously)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _descendants(root: int) -> set[int]:
    """``root`` and every process below it, from the parent pids in /proc."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    parent = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):  # gone meanwhile
                continue
            children.setdefault(parent, []).append(int(name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)


def _discard_in_background(fds: list[int]) -> None:
    """Read and drop what background processes still write, so they never get SIGPIPE."""

    def drain() -> None:
        with selectors.DefaultSelector() as selector:
            for fd in fds:
                selector.register(fd, selectors.EVENT_READ)
            remaining = len(fds)
            while remaining:
                for key, _ in selector.select():
                    if not os.read(key.fd, READ_CHUNK):
                        selector.unregister(key.fd)
                        os.close(key.fd)
                        remaining -= 1

    threading.Thread(target=drain, name="discard-output", daemon=True).start()


def _close(fd: int) -> None:
    if fd >= 0:
        os.close(fd)


# -- answers -------------------------------------------------------------------------------


def exec_answer(result: ProcessResult, timeout: float | None = None, **extra: object) -> bytes:
    """The answer to a command: one JSON line of facts, then the raw stdout and stderr bytes.

    Raw bytes, not base64 in JSON: output is often large, and neither side should pay to encode
    or parse it. The JSON line gives each stream's length in the body.
    """
    stdout, stderr = result.stdout.value(), result.stderr_value(timeout)
    facts = {
        "exit_code": result.exit_code,
        "stdout_length": len(stdout),
        "stderr_length": len(stderr),
        "stdout_bytes": result.stdout.total,
        "stderr_bytes": result.stderr.total,
        "truncated": result.stdout.truncated or result.stderr.truncated,
        "timed_out": result.timed_out,
        "duration": round(result.duration, 6),
        "error": result.error,
        **extra,
    }
    return b"".join((json.dumps(facts).encode(), b"\n", stdout, stderr))


def apply_patch(patch: str, cwd: str, timeout: float, env: dict[str, str]) -> dict[str, object]:
    """Apply a unified diff with ``git apply`` (``patch -p1`` without git) in cwd."""
    search_path = env.get("PATH", DEFAULT_PATH)
    git, patch_tool = shutil.which("git", path=search_path), shutil.which("patch", path=search_path)
    if git is None and patch_tool is None:
        return {
            "success": False, "stdout": "", "stderr": "", "exit_code": None,
            "error": "neither git nor patch is installed in the sandbox",
        }  # fmt: skip
    fd, temp = tempfile.mkstemp(prefix="orchard-patch-", suffix=".diff")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(patch if patch.endswith("\n") else patch + "\n")
        argv = [git, "apply", "--verbose", temp] if git else [str(patch_tool), "-p1", "-i", temp]
        result = run_process(argv, cwd=cwd, env=env, timeout=timeout)
    finally:
        os.unlink(temp)
    error = result.error
    if result.timed_out:
        error = f"{os.path.basename(argv[0])} timed out after {timeout:g} s"
    return {
        "success": result.exit_code == 0 and error is None,
        "stdout": result.stdout.value().decode("utf-8", "replace"),
        "stderr": result.stderr.value().decode("utf-8", "replace"),
        "exit_code": result.exit_code,
        "error": error,
    }
