"""The shell commands run under (`Shell`), long commands handed to it as files (`long_command`,
`private_script`) and persistent shell sessions (`ShellSession`, ``POST /shell``)."""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator

from .processes import EXIT_GRACE_S, READ_CHUNK, REAPED, Capture, ProcessResult, kill_tree
from .protocol import TIMEOUT_EXIT_CODE

TYPE_CHECKING = False  # the typing module is not imported at run time (see the module closure)
if TYPE_CHECKING:
    from .config import AgentConfig

BASH_PATHS = ("/bin/bash", "/usr/bin/bash")
SH_PATH = "/bin/sh"
LOGIN_BASH = (
    'if [ -f ~/.bashrc ]; then . ~/.bashrc 2>/dev/null; fi; set +m; shopt -u expand_aliases\n(eval "$__orchard_script")'
)
"""The end of a login bash's ``-c``, once ``$__orchard_script`` holds the script: ``~/.bashrc``,
then the script as ``-c`` would parse it, in a subshell, which bash makes non-interactive (so no
``[1] PID`` line on stderr for each ``&``). (A ``^C`` still ends the shell as an interactive one,
status 1, as published.)"""
INLINE_COMMAND_BYTES = 64 * 1024
"""Longer commands are read from a file of memory: Linux refuses one argv string over 128 KiB, all of argv over ~2 MiB."""
SHELL_WORDS = frozenset(
    """! [[ ]] { } case coproc do done elif else esac fi for function if in select then time until while
    . : alias bg bind break builtin caller cd command compgen complete compopt continue declare dirs disown
    enable eval exec exit export fc fg getopts hash help history jobs kill let local logout mapfile popd
    pushd pwd read readarray readonly return set shift shopt source suspend times trap type typeset ulimit
    umask unalias unset wait""".split()  # noqa: SIM905
)
"""Bash's keywords, and its builtins that act otherwise than a program of that name or have none: a
command list starting with one runs in the shell. (`echo`, `printf`, `test`, `[`, `true` and
`false` act as the programs do, so a list starting with one of those may run without it.)"""
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")
"""A word the shell takes as a variable assignment, not a command (`FOO=1 cmd`)."""
RUNNABLE = (b"\x7fELF", b"#!")
"""How a file execve runs starts; any other the shell would run as a script of its own."""
INLINE_SESSION_BYTES = 4 * 1024
"""Longer session commands are read from a private file: bash reads a pipe a byte at a time (~0.6 s a MiB)."""


class Shell:
    """The shell commands run under, detected once at start-up."""

    __slots__ = ("is_bash", "path")

    def __init__(self, path: str | None, is_bash: bool) -> None:
        self.path = path
        self.is_bash = is_bash

    @classmethod
    def detect(cls) -> Shell:
        for path in BASH_PATHS:
            if os.access(path, os.X_OK):
                return cls(path, True)
        if os.access(SH_PATH, os.X_OK):
            return cls(SH_PATH, False)
        return cls(None, False)

    def argv(self, script: str, login: bool, fd: int | None = None) -> list[str]:
        """The argv running ``script``; raises ``FileNotFoundError`` without any shell. With
        ``fd``, ``script`` is ``from_fd(fd)``: it reads the real script from that open file.

        A login bash is also interactive (``-i``), as published, so that ``~/.bashrc`` runs past
        the ``case $- in *i*)`` guard that Debian, Ubuntu and SWE-bench images put at its top
        (their conda activation comes after it). Once it ran, the script runs as it would
        without ``-i``, functions and variables kept: no job control (commands stay in the
        shell's process group, which signals reach), no aliases, no job numbers printed (see
        `LOGIN_BASH`). Without a terminal such a bash first warns that it has no job control;
        `JobControlQuiet` drops those lines. ``sh`` is only made a login shell.
        """
        if self.path is None:
            raise FileNotFoundError("no shell found (looked for /bin/bash, /usr/bin/bash, /bin/sh)")
        if not login:
            return [self.path, "-c", script]
        if not self.is_bash:
            return [self.path, "-l", "-c", script]
        if fd is None:  # the script is $1
            return [self.path, "--login", "-i", "-c", f"__orchard_script=$1; set --\n{LOGIN_BASH}", self.path, script]
        return [self.path, "--login", "-i", "-c", f"{self.read_fd(fd)}\n{LOGIN_BASH}", self.path]

    def direct(self, argv: list[str], env: dict[str, str], cwd: str) -> tuple[list[str], dict[str, str]] | None:
        """``argv`` and ``env`` to run a command list with no shell, or None where the shell would do
        something for it, so that it runs there. A shell's ``-c`` of a list (``shlex.join``) with no
        keyword, builtin, assignment or exported function first finds the program on ``PATH`` and
        execs it in place: its process, limits, stdin and process tree are the same, and so is its
        environment once ``PWD`` (and for bash ``SHLVL`` and ``_``, as bash 5 sets them) is set
        here. A program that is not found, not executable or not ELF or ``#!`` (which the shell
        would run as its own script) is left to the shell, whose error or fallback it then gets.
        One difference stays: the program's ``argv[0]`` is its path, not the word given. An image
        with no shell at all runs command lists this way too."""
        name = argv[0]
        if (
            name in SHELL_WORDS
            or ASSIGNMENT.match(name)
            or f"BASH_FUNC_{name}%%" in env
            or sum(len(arg) for arg in argv) > INLINE_COMMAND_BYTES
        ):
            return None
        if "/" in name:
            path = os.path.join(cwd, name)
        else:
            search = env.get("PATH", "").split(os.pathsep)
            if not all(folder.startswith("/") for folder in search):
                return None  # a relative folder is found from the command's cwd, as the shell finds it
            path = next((os.path.join(f, name) for f in search if os.access(os.path.join(f, name), os.X_OK)), "")
        try:
            with open(path, "rb") as program:
                if not program.read(4).startswith(RUNNABLE) or not os.access(path, os.X_OK):
                    return None
        except OSError:  # not found, a folder, not readable: the shell says so
            return None
        extra = {"PWD": env["PWD"] if _same_folder(env.get("PWD", ""), cwd) else cwd}
        if self.is_bash:
            level = env.get("SHLVL", "")
            extra |= {"SHLVL": str(max(0, int(level))) if level.strip().lstrip("-").isdigit() else "0", "_": path}
        return [path, *argv[1:]], {**env, **extra}

    def read_fd(self, fd: int) -> str:
        """A command that reads the script in the open file ``fd`` into ``$__orchard_script``
        and closes the file (what the script starts does not inherit it); exit 126 when it
        cannot be read. (Bash's ``$(<&N)`` reads nothing; its ``/dev/fd/N`` is emulated where
        the system has none.)"""
        read = f"$(</dev/fd/{fd})" if self.is_bash else f"$(cat <&{fd})"
        return f"__orchard_script={read} || exit 126; exec {fd}<&-"

    def from_fd(self, fd: int) -> str:
        """A command that reads the script in the open file ``fd`` (``read_fd``), then runs it as
        ``-c`` would (``eval``)."""
        return f'{self.read_fd(fd)}; eval "$__orchard_script"'

    @staticmethod
    def from_file(path: str) -> str:
        """A command that runs the script in the file ``path`` with ``eval``; status 126 (and
        ``cat``'s complaint) when it cannot be read, rather than running nothing and succeeding."""
        return f"eval \"$(cat -- {shlex.quote(path)} || echo '(exit 126)')\""


def _same_folder(given: str, cwd: str) -> bool:
    """Whether `given` (a PWD) names the folder `cwd`, through links or not, as a shell keeps it."""
    try:
        return given.startswith("/") and os.path.samefile(given, cwd)
    except OSError:
        return False


@contextlib.contextmanager
def long_command(script: str, agent: AgentConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """``script`` itself, or past ``INLINE_COMMAND_BYTES`` a short command that reads it from a
    file of memory, with the file descriptor to pass it: (command, fds).

    The shell reads the script in one go and runs it with ``eval``, which parses and runs a
    script as ``-c`` does: ``$0``, line numbers, positional parameters, stdin and the
    environment are the same; only syntax errors are reported as ``eval: line N`` rather than
    ``-c: line N``. A memory file has no path, so no process can remove or replace it, takes no
    disk, and goes when its last descriptor closes. Where the system has none, the script is a
    file in the agent's private folder (``private_script``), removed when the command is done.
    """
    data = os.fsencode(script)
    if len(data) <= INLINE_COMMAND_BYTES:
        yield script, ()
        return
    try:
        fd = os.memfd_create("orchard-command", os.MFD_CLOEXEC)  # passed to the shell only
    except (AttributeError, OSError):  # a Python built without it, a kernel or seccomp refusing it
        with private_script(agent, data) as path:
            yield (script, ()) if path is None else (agent.shell.from_file(path), ())
        return
    try:
        with open(fd, "wb", closefd=False) as f:
            f.write(data)
        os.lseek(fd, 0, os.SEEK_SET)
        yield agent.shell.from_fd(fd), (fd,)
    finally:
        os.close(fd)


@contextlib.contextmanager
def private_script(agent: AgentConfig, data: bytes) -> Iterator[str | None]:
    """The path of a new file (0600, in the agent's private folder) holding ``data``, removed
    afterwards whatever a command did to it; None when it cannot be written (no space, a
    read-only /tmp)."""
    try:
        path = os.path.join(agent.private_folder(), f"command-{os.urandom(8).hex()}.sh")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        yield None
        return
    try:
        with open(fd, "wb") as f:
            f.write(data)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)
        yield None
        return
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):  # the command may have removed it, or put a folder there
            os.unlink(path)


class ShellSession:
    """A persistent shell: commands share its working directory, variables and functions.

    Each command is sent as ``{ eval 'CMD'\n} </dev/null`` (so a syntax error, an open quote or
    heredoc only fails that command; a long CMD is ``eval`` of a private file, see
    ``private_script``) followed by two ``printf`` lines that print a random marker, joined at run time so that no trace ever contains it, with the exit status, on stdout and
    stderr; the command's output is what comes before the markers. Output that background jobs
    write between commands is dropped before the next command. A timeout kills the shell's whole
    process tree, and so does a command that ends the shell or closes its output; either way the
    session starts afresh on the next command, and ``error`` says so.
    """

    def __init__(self, agent: AgentConfig) -> None:
        shell = agent.shell
        if shell.path is None:
            raise FileNotFoundError("no shell found (looked for /bin/bash, /usr/bin/bash, /bin/sh)")
        argv = [shell.path, "--noprofile", "--norc"] if shell.is_bash else [shell.path]
        self.agent = agent
        self.proc = subprocess.Popen(
            [*REAPED, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=agent.default_cwd(),
            env=agent.base_env,
            start_new_session=True,
        )
        self.lock = threading.Lock()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Kill the shell and everything it started (pipes stay open for a reader still on them)."""
        if self.proc.returncode is None:  # once reaped, its pid may be another process's
            kill_tree(self.proc.pid)
        self.proc.wait()

    def run(self, command: str, timeout: float | None, max_output: int) -> ProcessResult:
        """Run one command in this shell (commands of one session run one at a time)."""
        with self.lock:
            if not self.alive():
                result = ProcessResult(Capture(0), Capture(0))
                result.error = "the shell session ended; run the command again to start a new one"
                return result
            data = os.fsencode(command)
            if len(data) <= INLINE_SESSION_BYTES:
                return self._run(command, timeout, max_output)
            with private_script(self.agent, data) as path:  # None: down the pipe, only slower
                return self._run(command if path is None else Shell.from_file(path), timeout, max_output)

    def _run(self, command: str, timeout: float | None, max_output: int) -> ProcessResult:
        start = time.monotonic()
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        _drop_pending(self.proc.stdout.fileno(), self.proc.stderr.fileno())
        token = os.urandom(8).hex()
        quoted = command.replace("'", "'\\''")
        script = (
            f"{{ eval '{quoted}'\n}} </dev/null\n"
            f"printf '%s%s %d\\n' __orchard_ {token} \"$?\"\n"
            f"printf '%s%s\\n' __orchard_ {token} >&2\n"
        )
        marker = f"__orchard_{token}".encode()
        result = ProcessResult(Capture(max_output), Capture(max_output))
        try:
            self.proc.stdin.write(script.encode())
            self.proc.stdin.flush()
        except (OSError, ValueError):
            result.error = "the shell session ended; run the command again to start a new one"
            return result
        out = _UntilMarker(self.proc.stdout.fileno(), marker, result.stdout)
        err = _UntilMarker(self.proc.stderr.fileno(), marker, result.stderr)
        deadline = None if timeout is None else start + timeout
        with selectors.DefaultSelector() as selector:
            for stream in (out, err):
                selector.register(stream.fd, selectors.EVENT_READ, stream)
            while not (out.done and err.done):
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    result.timed_out = True
                    break
                for key, _ in selector.select(wait):
                    stream = key.data
                    if not stream.read():
                        selector.unregister(stream.fd)
        out.finish()
        err.finish()
        if result.timed_out:
            self.kill()
            result.exit_code = TIMEOUT_EXIT_CODE
            result.error = "the shell session was killed with the command; the next command starts a new one"
        elif out.status is not None:
            result.exit_code = out.status
        else:  # the shell ended (exit, exec, ...) or its output was closed
            try:
                code = self.proc.wait(timeout=EXIT_GRACE_S)
            except subprocess.TimeoutExpired:
                self.kill()
                code = self.proc.wait()
            result.exit_code = 128 - code if code < 0 else code
            result.error = "the command ended the shell session; the next command starts a new one"
        result.duration = time.monotonic() - start
        return result


def _drop_pending(*fds: int) -> None:
    """Discard what background jobs wrote since the last command, without waiting."""
    with selectors.DefaultSelector() as selector:
        for fd in fds:
            selector.register(fd, selectors.EVENT_READ)
        while True:
            ready = selector.select(0)
            if not ready:
                return
            for key, _ in ready:
                if not os.read(key.fd, READ_CHUNK):
                    selector.unregister(key.fd)
                    if not selector.get_map():
                        return


class _UntilMarker:
    """Reads one stream of a shell session into a capture until the marker line."""

    def __init__(self, fd: int, marker: bytes, capture: Capture) -> None:
        self.fd, self.marker, self.capture = fd, marker, capture
        self.pending = b""
        self.done = False
        self.status: int | None = None

    def finish(self) -> None:
        """Keep what was held back while looking for a marker that will not come."""
        if not self.done:
            self.capture.feed(self.pending)
            self.pending = b""

    def read(self) -> bool:
        """Read one chunk; False at EOF (the shell is gone)."""
        chunk = os.read(self.fd, READ_CHUNK)
        if not chunk:
            self.finish()
            self.done = True
            return False
        if self.done:
            return True  # after the marker: background output, dropped before the next command
        self.pending += chunk
        index = self.pending.find(self.marker)
        if index < 0:
            keep = len(self.marker) - 1
            self.capture.feed(self.pending[:-keep])
            self.pending = self.pending[-keep:]
            return True
        rest = self.pending[index + len(self.marker) :]
        if b"\n" not in rest:
            return True  # the status is still on its way
        self.capture.feed(self.pending[:index])
        status = rest.split(b"\n", 1)[0].strip()
        self.status = int(status) if status.isdigit() else None
        self.pending, self.done = b"", True
        return True
