"""Orchard exec agent: a small HTTP/1.1 server that runs commands and moves files in a sandbox.

The agent is injected into arbitrary, unmodified images and started by a bundled CPython with
``-s -S``, so this file is self-contained and uses the standard library only; every module is
imported at the top (a bundling tool computes the module closure by importing this file).

Usage::

    ORCHARD_AGENT_TOKEN=... python server.py --unix /run/agent.sock [--workdir /workspace]
    ORCHARD_AGENT_TOKEN=... python server.py --tcp 0.0.0.0:7000 [--workdir /workspace]
    ORCHARD_AGENT_TOKEN_SHA256=<hex sha256 of the token> python server.py --tcp 0.0.0.0:7000

Protocol
--------
HTTP/1.1 with keep-alive; every response carries ``Content-Length``. Every request must carry
``Authorization: Bearer <token>`` (missing: 401, wrong: 403). Errors are JSON
``{"error": "<one sentence>"}``: unknown route 404, wrong method 405, malformed JSON or a field of
the wrong type 400 (the message names the field; unknown fields are refused too), body over the
limit 413 (JSON bodies 256 MiB, uploads 1 GiB; a command 16 MiB). Relative paths and a relative
``cwd`` are resolved against the workdir.

``GET /health``
    ``{"status": "ok", "pid": int, "version": "1"}``.

``POST /exec``
    Body ``{"command": str | [str], "cwd": str|null, "env": {str: str}|null,
    "timeout": number|null, "login_shell": bool, "max_output": int|null, "stdin": str|null}``.
    A string runs as ``bash -c CMD`` (``sh -c`` in images without bash); a list is quoted with
    ``shlex.join`` first. A command over 64 KiB, which argv cannot hold, is handed to the shell
    as an open file of memory (``memfd_create``: no path, nothing on disk) that it reads and
    runs with ``eval``: the same but for syntax errors, reported as ``eval: line N``; exit code
    126 when it cannot be read (without ``memfd_create``, a file in the agent's private folder,
    as for sessions). ``login_shell`` runs ``bash --login -i`` and sources ``~/.bashrc``
    first, as published (interactive, so past the usual "not interactive: return" guard), then
    runs the command as a plain ``bash -c`` would (no job control, aliases or job numbers);
    bash's job-control warnings are dropped from the start of stderr (``sh -l`` without bash).
    ``cwd`` defaults to the workdir (created if missing, ``/`` if it cannot be). The child's environment
    is the agent's minus its runtime variables (``PYTHONHOME``, ``PYTHONPATH``,
    ``LD_LIBRARY_PATH``, ``ORCHARD_AGENT_*``, ...), with a default ``PATH`` and ``HOME``, then
    ``env`` on top. ``stdin`` is base64 (otherwise stdin is ``/dev/null``). ``max_output`` caps
    each stream (default 8 MiB): the first and last halves are kept around a
    ``[orchard: N bytes truncated]`` marker. On ``timeout`` (seconds) everything the command
    started is killed (see below), ``exit_code`` is 124 and a marker line is appended to stderr.
    Once the command exits, output is read for at most 100 ms more, so background processes
    holding the pipes do not hang the call (their later output is read and discarded, so they
    never get ``SIGPIPE``).
    Answer (200, ``application/vnd.orchard.exec``): one JSON line ``{"exit_code": int|null,
    "stdout_length": int, "stderr_length": int, "stdout_bytes": int, "stderr_bytes": int,
    "truncated": bool, "timed_out": bool, "duration": float, "error": str|null}``, a newline,
    then the raw stdout bytes (``stdout_length`` of them) and the raw stderr bytes. ``*_bytes``
    count everything produced (before the cap); a signal death gives ``128 + signum``; a command
    that cannot start gives ``exit_code`` null and ``error``. Everything the command started:
    the command runs as a child subreaper (the bundle's ``bin/orchard-subreaper`` in front of
    it), so its descendants stay in its process tree even after ``setsid`` and a double fork;
    on timeout the whole tree is stopped (``SIGSTOP``, rescanned until no new process appears,
    so none forks away), then killed. Background processes of a command that *exits* in time
    keep running. (Without the bundle's program, as on hosts other than x86-64, an orphan that
    called ``setsid`` escapes the tree.)

``POST /shell``
    Body ``{"command": str, "session": str (default "default"), "timeout": number|null,
    "max_output": int|null}``: the command runs in a persistent shell of that name (started on
    first use), through ``eval`` so that a syntax error or an open quote fails only that command;
    cwd, variables and functions carry over (a command over 4 KiB is read with ``eval`` from a
    file in the agent's private folder, 0700, made when first needed: bash reads its pipe a byte
    at a time; status 126 when the file cannot be read, sent down the pipe when it cannot be
    written). Answered as ``/exec`` (plus ``"session"``
    in the JSON line). Output that background jobs write between commands is dropped. A timeout
    kills the session's whole process tree; a command that exits the shell or closes its output
    ends the session too; either way the next command starts a fresh shell and ``error`` says so.
    Commands of one session run one at a time. ``DELETE /shell?session=NAME`` ends a session:
    ``{"session", "closed": bool}``.

``GET /files?path=P``
    The raw bytes (``application/octet-stream``). Missing: 404; a directory: 400.

``PUT /files?path=P[&mode=644]``
    Raw body (at most 1 GiB) written atomically (temporary file, then rename); parent folders
    are created. ``mode`` is octal; the default keeps an overwritten file's mode, else 644.
    Answer ``{"path": abs, "size": int}``.

``GET /files/list?path=P``
    ``{"path": abs, "files": [{"name", "type": "file"|"directory", "size", "modified"}]}``
    sorted by name, as published: ``size`` is ``st_size`` (a folder's too), ``modified`` the
    sandbox's local time as ``"%Y-%m-%dT%H:%M:%S"`` (no zone, whole seconds); symlinks are
    followed, a broken one is listed as a file of size 0 (published answers 500). Missing: 404;
    a file: 400.

``GET /archive?path=P``
    An uncompressed tar (``application/x-tar``) of the file or folder P, named by its basename.
    Regular files, folders and symlinks only; owners are numeric.

``PUT /archive?path=DIR``
    A tar body (at most 1 GiB) extracted into DIR (created if missing) with tarfile's ``data``
    filter, after every member has been checked: absolute names, names or links escaping DIR
    and device files refuse the whole archive (400). Answer ``{"path": abs, "files": int}``,
    the number of members extracted (files, folders and links).

``POST /apply_patch``
    Body ``{"patch": str, "cwd": str|null, "timeout": number|null (default 30)}``. Runs
    ``git apply --verbose`` (``patch -p1`` without git) in cwd. Answer ``{"success": bool,
    "stdout": str, "stderr": str, "exit_code": int|null, "error": str|null}``.

``POST /http``
    Body ``{"port": int (1 to 65535), "method": "GET"|"POST"|"PUT"|"PATCH"|"DELETE"|"HEAD"|"OPTIONS"
    (default POST), "path": str, "headers": {str: str}|null, "body": base64|null, "timeout":
    number|null (default 30, at most 600), "max_bytes": int|null (default 1 MiB, at most 16 MiB)}``:
    one HTTP/1.1 request to a service of the sandbox at ``127.0.0.1:port``, the only address the
    agent ever connects to for it (the body names no host). ``path`` starts with ``/`` and is
    printable ASCII, at most 8192 characters (a query string included); header names are tokens,
    values Latin-1 without CR, LF or NUL; ``Host`` (always ``127.0.0.1:port``),
    ``Content-Length``, ``Transfer-Encoding`` and ``Connection`` (always ``close``: one
    connection per call) are the agent's to set. ``timeout`` bounds the whole exchange, connect
    to last byte. The answer's head is bounded (200 header lines, 64 KiB); its body is framed as
    HTTP/1.1 says (Content-Length, chunked, or until the service hangs up) and at most
    ``max_bytes`` of it is read (``truncated`` says more was there). Answer ``{"status": int,
    "headers": [[name, value], ...] (as sent, in order), "body": base64, "truncated": bool,
    "duration": float}``, whatever the status (a 404 or 500 of the service is an answer). Nothing
    listening: 502 ``nothing listens on 127.0.0.1:PORT in the sandbox``; no full answer in time:
    504; an answer that is not HTTP (or a head over the bounds, or cut short): 502 naming it.

``POST /listen``
    Body ``{"port": int (1 to 65535)}``: the agent listens on ``127.0.0.1:port`` in the sandbox
    for the host, which takes each connection made there with ``/accept`` (and carries it to an
    address of its own choosing: ``Sandbox.expose``). Idempotent: ``{"port", "listening": true,
    "created": bool}`` (false when it listened already). Something else of the sandbox holds the
    port: 409; at most 64 ports (429). Connections wait in the kernel's accept queue, at most 64
    (past that the kernel answers no more and the client's connect retries), until an
    ``/accept`` takes them; the agent never accepts one on the host's behalf.
    ``DELETE /listen?port=P`` stops listening: new connections are refused, queued ones reset,
    waiting ``/accept`` calls answered 404; ``{"port", "closed": bool}``.

``POST /accept`` with ``Connection: Upgrade`` and ``Upgrade: orchard-tunnel``
    Body ``{"port": int, "timeout": number|null (default 30, at most 600)}``: waits up to
    ``timeout`` seconds for a connection to the listened port. One came: ``101 Switching
    Protocols``, then the raw bytes of that connection both ways until both ends are done (an
    end that half-closes is passed on as ``shutdown(SHUT_WR)``; a broken side ends both). None
    came: ``204 No Content`` (no body, the connection stays open for the next ``/accept``).
    The host sends nothing after its request until it has read the answer; a host that hangs up
    while it waits takes no connection. The port is not listened on (or stops being while the
    call waits): 404. The agent connects nowhere for this: it only hands over what was made to
    the port, and the body names no address.

``POST /connect`` with ``Connection: Upgrade`` and ``Upgrade: orchard-tunnel``
    Body ``{"port": int, "timeout": number|null (default 30, at most 600)}``: the agent connects to
    ``127.0.0.1:port`` in the sandbox, the only address it ever connects to for it (the body
    names no host), within ``timeout`` seconds. Connected: ``101 Switching Protocols``, then the
    raw bytes of that connection both ways, as for ``/accept`` (``Sandbox.connect``: the host
    drives a browser's DevTools port this way). Nothing listening: 502; no connection in time: 504.

``POST /pty`` with ``Connection: Upgrade`` and ``Upgrade: orchard-pty``
    An interactive terminal. Answered ``101 Switching Protocols``; from then on both sides send
    one JSON frame per line, the frames of the service's WebSocket PTY route: the client's first
    frame (within 10 s) is ``{"type": "init", "cmd": [str]|null, "env": {}, "cwd": str|null,
    "rows": int, "cols": int, "login_shell": bool}`` (no ``cmd``: the shell, interactive;
    ``login_shell`` with a ``cmd`` runs it as ``/exec`` does, after ``~/.bashrc``); the agent
    answers ``{"type": "ready", "pid"}``, then ``{"type": "stdout", "data": base64}`` frames
    (stdout and stderr merged, at most 64 KiB each), then ``{"type": "exit", "code"}`` (minus
    the signal number when killed by one) and closes. Client frames after init:
    ``stdin {data: base64}``, ``signal {sig: TERM|KILL|INT|HUP|QUIT}`` (to the process group;
    any case; another name means TERM), ``resize {rows, cols}``, ``close`` (TERM). As published,
    a later frame that makes no sense (not JSON, an unknown type, bad base64, a size out of 1 to
    65535) is ignored: clients end the session at the first error frame. A client that hangs up
    ends the process too (HUP, then KILL 2 s later). A bad ``init``, or a process that cannot
    start: ``{"type": "error", "message"}``, then close.

Security notes
--------------
The token is read from ``ORCHARD_AGENT_TOKEN`` at start-up and removed from the environment, so
commands do not inherit it; tokens are compared in constant time. Where whoever may read the
sandbox's definition must not learn the token (a Pod's spec, readable by anyone who may read
Pods), ``ORCHARD_AGENT_TOKEN_SHA256`` holds the hex SHA-256 of the token instead (removed the same
way; exactly one of the two is set), and the agent compares the SHA-256 of the token presented,
in constant time: the digest names the token without granting it. On a Unix socket the socket
file is mode 0666: access is controlled by the token and by the mode of the host folder holding
it. The token keeps out whoever can reach the socket or port but is not the host; it is no
secret from the commands themselves: one running as the agent's user can still read it from
``/proc/<agent pid>/environ``, which grants nothing it could not already do in the sandbox.
The agent authenticates its caller, nothing more: an authenticated caller can run anything the
agent's user can, read and write any file it can reach. It does not isolate commands from each
other or from itself, and it offers no confidentiality on TCP (no TLS): the sandbox (container,
network policy) is the security boundary, and a TCP port must only be published on loopback or
a trusted network.
A port listened on for the host (``/listen``) is open to every process of the sandbox, as any
port of its loopback is, and what they send there reaches whatever the host carries it to; the
agent never connects anywhere for it, and nothing it answers names an address: the host decides
where the bytes go (``Sandbox.expose``).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import io
import json
import math
import os
import selectors
import shlex
import shutil
import signal
import socket
import socketserver
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.parse
from _operator import _compare_digest  # hmac's, without loading libcrypto
from collections.abc import Callable, Iterator, Mapping

try:  # the builtin SHA-256, without hashlib's libcrypto (Python 3.12 merged it into _sha2)
    from _sha2 import sha256 as _sha256
except ImportError:
    from _sha256 import sha256 as _sha256

TYPE_CHECKING = False  # the typing module is not imported at run time (see the module closure)
if TYPE_CHECKING:
    from typing import BinaryIO, NoReturn

VERSION = "1"
TOKEN_ENV = "ORCHARD_AGENT_TOKEN"
TOKEN_SHA256_ENV = "ORCHARD_AGENT_TOKEN_SHA256"
DEFAULT_WORKDIR = "/workspace"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_HOME = "/root"
DEFAULT_MAX_OUTPUT = 8 * 1024 * 1024
DEFAULT_PATCH_TIMEOUT = 30.0
MAX_JSON_BODY = 256 * 1024 * 1024
MAX_UPLOAD_BODY = 1024 * 1024 * 1024
MAX_DRAINED_BODY = 64 * 1024  # an unread body up to this size is skipped to keep the connection
MAX_COMMAND_BYTES = 16 * 1024 * 1024
INLINE_COMMAND_BYTES = 64 * 1024
"""Longer commands are read from a file of memory: Linux refuses one argv string over 128 KiB, all of argv over ~2 MiB."""
INLINE_SESSION_BYTES = 4 * 1024
"""Longer session commands are read from a private file: bash reads a pipe a byte at a time (~0.6 s a MiB)."""
TIMEOUT_EXIT_CODE = 124
EXIT_GRACE_S = 0.1  # how long output is still read once the command has exited
KILL_WAIT_S = 5.0  # how long a killed process group may take to die before we give up
READ_CHUNK = 1024 * 1024
WRITE_CHUNK = 64 * 1024
COPY_CHUNK = 1024 * 1024
AGENT_ENV_VARS = frozenset({"PYTHONHOME", "PYTHONPATH", "LD_LIBRARY_PATH", "PYTHONUTF8", "PYTHONDONTWRITEBYTECODE"})
AGENT_ENV_PREFIX = "ORCHARD_AGENT_"
BASH_PATHS = ("/bin/bash", "/usr/bin/bash")
SH_PATH = "/bin/sh"
LOGIN_BASH = (
    'if [ -f ~/.bashrc ]; then . ~/.bashrc 2>/dev/null; fi; set +m; shopt -u expand_aliases\n(eval "$__orchard_script")'
)
"""The end of a login bash's ``-c``, once ``$__orchard_script`` holds the script: ``~/.bashrc``,
then the script as ``-c`` would parse it, in a subshell, which bash makes non-interactive (so no
``[1] PID`` line on stderr for each ``&``). (A ``^C`` still ends the shell as an interactive one,
status 1, as published.)"""
JOB_CONTROL_WARNINGS = (b"cannot set terminal process group", b"no job control in this shell")
"""What an interactive bash without a terminal writes to stderr first, a line each."""
MAX_WARNING_LINE = 512
SUBREAPER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bin", "orchard-subreaper")
REAPED = [SUBREAPER] if os.access(SUBREAPER, os.X_OK) else []
"""Put in front of every command's argv: it becomes a child subreaper, then execs the command."""
MAX_FREEZE_ROUNDS = 1000  # /proc scans while stopping a process tree (each stops all it found)

ROUTES: dict[str, dict[str, str]] = {
    "/health": {"GET": "route_health"},
    "/exec": {"POST": "route_exec"},
    "/files": {"GET": "route_get_file", "PUT": "route_put_file"},
    "/files/list": {"GET": "route_list_files"},
    "/archive": {"GET": "route_get_archive", "PUT": "route_put_archive"},
    "/apply_patch": {"POST": "route_apply_patch"},
    "/shell": {"POST": "route_shell", "DELETE": "route_close_shell"},
    "/pty": {"POST": "route_pty"},
    "/http": {"POST": "route_http"},
    "/listen": {"POST": "route_listen", "DELETE": "route_unlisten"},
    "/accept": {"POST": "route_accept"},
    "/connect": {"POST": "route_connect"},
}
EXEC_FIELDS = frozenset({"command", "cwd", "env", "timeout", "login_shell", "max_output", "stdin"})
SHELL_FIELDS = frozenset({"command", "session", "timeout", "max_output"})
MAX_SESSIONS = 64
EXEC_CONTENT_TYPE = "application/vnd.orchard.exec"
MAX_HEAD_LINE = 65536
MAX_HEADERS = 100
REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    411: "Length Required",
    413: "Content Too Large",
    414: "URI Too Long",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    504: "Gateway Timeout",
    507: "Insufficient Storage",
}
PATCH_FIELDS = frozenset({"patch", "cwd", "timeout"})
HTTP_FIELDS = frozenset({"port", "method", "path", "headers", "body", "timeout", "max_bytes"})
HTTP_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})
HTTP_AGENT_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})
"""Request headers the agent sets itself: a caller's would change where or how the request goes."""
HTTP_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
HTTP_DEFAULT_TIMEOUT = 30.0
HTTP_MAX_TIMEOUT = 600.0
HTTP_DEFAULT_MAX_BYTES = 1024 * 1024
HTTP_MAX_BYTES = 16 * 1024 * 1024
HTTP_MAX_PATH = 8192
HTTP_MAX_REQUEST_HEADERS = 100
HTTP_MAX_HEAD_BYTES = 64 * 1024
"""Bytes of the request's headers, and of the service's answer head (status line and headers)."""
HTTP_MAX_ANSWER_HEADERS = 200
HTTP_MAX_INTERIM = 16  # 1xx answers (100 Continue, 103 Early Hints) skipped before the real one
HTTP_RECV = 256 * 1024
TUNNEL_UPGRADE = "orchard-tunnel"
LISTEN_FIELDS = frozenset({"port"})
ACCEPT_FIELDS = frozenset({"port", "timeout"})
TUNNEL_BACKLOG = 64
"""Connections to a listened port that may wait for the host's ``/accept`` (the kernel's accept queue)."""
MAX_LISTENERS = 64
TUNNEL_DEFAULT_WAIT = 30.0
TUNNEL_MAX_WAIT = 600.0
TUNNEL_POLL_S = 1.0  # a waiting /accept looks at its listener's state at least this often
TUNNEL_CHUNK = 256 * 1024
PTY_UPGRADE = "orchard-pty"
PTY_INIT_FIELDS = frozenset({"type", "cmd", "env", "cwd", "rows", "cols", "login_shell"})
PTY_INIT_TIMEOUT_S = 10.0
PTY_CHUNK = 48 * 1024  # its base64 fits the 64 KiB frames of the API
PTY_MAX_FRAME = 1024 * 1024
PTY_HANGUP_GRACE_S = 2.0
PTY_SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL, "INT": signal.SIGINT, "HUP": signal.SIGHUP}
PTY_SIGNALS["QUIT"] = signal.SIGQUIT


class ApiError(Exception):
    """An error answered to the client as ``{"error": message}`` with an HTTP status."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


# -- configuration -------------------------------------------------------------------------


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


class AgentConfig:
    """What every request handler needs: token, workdir, shell and the base child environment.

    The token is given itself (``token``) or as its hex SHA-256 (``token_sha256``), exactly one;
    only its digest is kept (``token_digest``), and a request's token is checked by its digest.
    """

    def __init__(
        self,
        token: str = "",
        workdir: str = DEFAULT_WORKDIR,
        shell: Shell | None = None,
        environ: Mapping[str, str] | None = None,
        *,
        token_sha256: str = "",
    ) -> None:
        if bool(token) == bool(token_sha256):
            raise ValueError("give the agent token or its SHA-256, exactly one, not empty")
        self.token_digest = _sha256(token.encode()).digest() if token else parse_sha256(token_sha256)
        self.workdir = os.path.abspath(workdir)
        self.shell = shell or Shell.detect()
        self.base_env = child_environment(os.environ if environ is None else environ)
        self.sessions: dict[str, ShellSession] = {}
        self.sessions_lock = threading.Lock()
        self._private: str | None = None
        self._private_lock = threading.Lock()
        self.listeners: dict[int, Listener] = {}
        self.listeners_lock = threading.Lock()

    def session(self, name: str) -> ShellSession:
        """The persistent shell called ``name``, started on first use."""
        with self.sessions_lock:
            session = self.sessions.get(name)
            if session is None or not session.alive():
                if session is None and len(self.sessions) >= MAX_SESSIONS:
                    raise ApiError(429, f"at most {MAX_SESSIONS} shell sessions; close one (DELETE /shell)")
                session = self.sessions[name] = ShellSession(self)
            return session

    def close_session(self, name: str, only: ShellSession | None = None) -> bool:
        """Kill the shell called ``name`` (if ``only``, just when it is still that one)."""
        with self.sessions_lock:
            session = self.sessions.get(name)
            if session is None or (only is not None and session is not only):
                return False
            del self.sessions[name]
        session.kill()
        return True

    def listen(self, port: int) -> bool:
        """Listen on ``127.0.0.1:port`` for the host (see ``Listener``); False if it already does.

        409 when something else of the sandbox holds the port, 429 past ``MAX_LISTENERS``.
        """
        with self.listeners_lock:
            if port in self.listeners:
                return False
            if len(self.listeners) >= MAX_LISTENERS:
                raise ApiError(429, f"at most {MAX_LISTENERS} listened ports; close one (DELETE /listen)")
            try:
                self.listeners[port] = Listener(port)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                raise ApiError(409, f"127.0.0.1:{port} is taken in the sandbox") from None
            return True

    def listener(self, port: int) -> Listener:
        with self.listeners_lock:
            listener = self.listeners.get(port)
        if listener is None:
            raise ApiError(404, f"the agent does not listen on 127.0.0.1:{port} (POST /listen first)")
        return listener

    def unlisten(self, port: int) -> bool:
        """Stop listening on ``port`` (see ``Listener.close``); False if it did not."""
        with self.listeners_lock:
            listener = self.listeners.pop(port, None)
        if listener is None:
            return False
        listener.close()
        return True

    def private_folder(self) -> str:
        """A folder only the agent's user may use (``mkdtemp``: 0700, under ``TMPDIR`` or /tmp),
        for scripts too long to hand a shell otherwise. Made when first needed, and made again
        when what is at its path is no longer it (``lstat``: a real folder, this user's, 0700),
        so a folder another user renamed into its place is never written to. OSError when none
        can be made (a read-only or full /tmp)."""
        with self._private_lock:
            if self._private is not None:
                with contextlib.suppress(OSError):
                    info = os.lstat(self._private)
                    if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and info.st_mode & 0o777 == 0o700:
                        return self._private
            self._private = tempfile.mkdtemp(prefix="orchard-agent-")
            return self._private

    def resolve(self, path: str) -> str:
        """An absolute, normalised path; relative paths are relative to the workdir."""
        return os.path.normpath(os.path.join(self.workdir, path))

    def default_cwd(self) -> str:
        """The workdir, created if missing; ``/`` if it cannot be created."""
        try:
            os.makedirs(self.workdir, exist_ok=True)
        except OSError:
            return "/"
        return self.workdir if os.path.isdir(self.workdir) else "/"


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
    exit_fd = _exit_watch(proc)
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


def _exit_watch(proc: subprocess.Popen[bytes]) -> int:
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


# -- request validation --------------------------------------------------------------------


def parse_json_object(raw: bytes, allowed: frozenset[str]) -> dict[str, object]:
    try:
        data = json.loads(raw)
    except ValueError as exc:  # includes UnicodeDecodeError
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be a JSON object")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ApiError(400, f"unknown field: {unknown[0]} (allowed: {', '.join(sorted(allowed))})")
    return data


def field_command(data: dict[str, object]) -> str:
    """The ``command`` field as one shell script (a list is quoted with shlex.join)."""
    command = data.get("command")
    if isinstance(command, list) and command and all(isinstance(a, str) for a in command):
        script = shlex.join(command)
    elif isinstance(command, str):
        script = command
    else:
        raise ApiError(400, "command must be a string or a non-empty list of strings")
    return check_script(script)


def check_script(script: str) -> str:
    """A command's text, refused when it holds NUL characters or is over ``MAX_COMMAND_BYTES``."""
    if "\0" in script:
        raise ApiError(400, "command must not contain NUL characters")
    size = len(os.fsencode(script))
    if size > MAX_COMMAND_BYTES:
        raise ApiError(
            413,
            f"command is {size} bytes, over the limit of {MAX_COMMAND_BYTES} "
            f"({MAX_COMMAND_BYTES // 2**20} MiB); write it to a file and run that",
        )
    return script


def field_str(data: dict[str, object], name: str) -> str | None:
    value = data.get(name)
    if value is not None and not isinstance(value, str):
        raise ApiError(400, f"{name} must be a string or null")
    if value is not None and "\0" in value:
        raise ApiError(400, f"{name} must not contain NUL characters")
    return value


def field_bool(data: dict[str, object], name: str) -> bool:
    value = data.get(name)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false")
    return bool(value)


def field_timeout(data: dict[str, object], name: str = "timeout") -> float | None:
    value = data.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, f"{name} must be a positive number of seconds or null")
    if not (value > 0 and math.isfinite(value)):
        raise ApiError(400, f"{name} must be a positive number of seconds or null")
    return float(value)


def field_max_output(data: dict[str, object]) -> int:
    value = data.get("max_output")
    if value is None:
        return DEFAULT_MAX_OUTPUT
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ApiError(400, "max_output must be a non-negative integer (bytes) or null")
    return value


def field_env(data: dict[str, object]) -> dict[str, str]:
    env = data.get("env")
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise ApiError(400, "env must be an object mapping names to string values")
    for key, value in env.items():
        if not key or "=" in key or "\0" in key:
            raise ApiError(400, f"env key {key!r} is not a valid variable name")
        if not isinstance(value, str) or "\0" in value:
            raise ApiError(400, f"env[{key!r}] must be a string without NUL characters")
    return env


def field_stdin(data: dict[str, object]) -> bytes | None:
    value = field_str(data, "stdin")
    if value is None:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise ApiError(400, "stdin must be base64-encoded") from None


def parse_mode(raw: str | None) -> int | None:
    """An octal file mode like ``644`` or ``0o644``."""
    if raw is None:
        return None
    try:
        mode = int(raw.removeprefix("0o"), 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o7777:
        raise ApiError(400, f"mode must be an octal file mode like 644, not {raw!r}")
    return mode


# -- files and archives --------------------------------------------------------------------


LISTING_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
"""A listing's ``modified``: the sandbox's local time, whole seconds, no zone (the published API's format)."""


def list_entry(entry: os.DirEntry[str]) -> dict[str, object] | None:
    """One listing row (None for an entry removed while we list); symlinks are followed, a
    broken one is a file of size 0 with the link's own time."""
    try:
        st, broken = entry.stat(), False
    except OSError:
        try:
            st, broken = entry.stat(follow_symlinks=False), True
        except OSError:  # removed while we were listing
            return None
    return {
        "name": entry.name,
        "type": "directory" if not broken and stat.S_ISDIR(st.st_mode) else "file",
        "size": 0 if broken else st.st_size,  # a folder's own size too (often 4096), as published
        "modified": time.strftime(LISTING_TIME_FORMAT, time.localtime(st.st_mtime)),
    }


def tar_members(path: str, arcname: str) -> Iterator[tuple[tarfile.TarInfo, str]]:
    """Tar headers of path and, for a folder, everything below it (no owner-name lookups)."""
    info = _tar_info(path, arcname)
    if info is None:
        return
    yield info, path
    if not info.isdir():
        return
    for name in sorted(os.listdir(path)):
        yield from tar_members(os.path.join(path, name), f"{arcname}/{name}")


def _tar_info(path: str, arcname: str) -> tarfile.TarInfo | None:
    st = os.lstat(path)
    info = tarfile.TarInfo(arcname)
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid, info.gid, info.mtime = st.st_uid, st.st_gid, int(st.st_mtime)
    if stat.S_ISREG(st.st_mode):
        info.size = st.st_size
    elif stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
    else:
        return None  # sockets, fifos and devices are skipped
    return info


def write_tar(path: str, out: BinaryIO) -> None:
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, source in tar_members(path, os.path.basename(path) or "root"):
            if info.isreg():
                with open(source, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)


def extract_tar(source: BinaryIO, dest: str) -> int:
    """Extract a tar into dest if every member is safe; return the number of members."""
    try:
        with tarfile.open(fileobj=source, mode="r:*") as tar:
            members = check_tar_members(tar, dest)
            tar.extractall(dest, members=members, filter="data")
    except tarfile.TarError as exc:  # FilterError is raised as ApiError before extraction
        raise ApiError(400, f"the body is not a valid tar archive: {exc}") from None
    return len(members)


def check_tar_members(tar: tarfile.TarFile, dest: str) -> list[tarfile.TarInfo]:
    """Every member, after refusing absolute names and what the ``data`` filter refuses."""
    members = tar.getmembers()
    for member in members:
        if member.name.startswith("/"):
            raise ApiError(400, f"archive member {member.name!r} has an absolute path")
        try:
            tarfile.data_filter(member, dest)
        except tarfile.FilterError as exc:
            raise ApiError(400, f"archive member refused: {exc}") from None
    return members


# -- HTTP to a service of the sandbox (POST /http) ------------------------------------------


class HttpRequest:
    """A validated ``POST /http`` body: one request to ``127.0.0.1:port``."""

    __slots__ = ("body", "headers", "max_bytes", "method", "path", "port", "timeout")

    def __init__(self, data: dict[str, object]) -> None:
        self.port = http_port(data)
        self.method = http_method(data)
        self.path = http_path(data)
        self.headers = http_headers(data)
        self.body = http_body(data)
        self.timeout = http_timeout(data)
        self.max_bytes = http_max_bytes(data)

    @property
    def where(self) -> str:
        return f"127.0.0.1:{self.port}"

    def message(self) -> bytes:
        """The request's bytes: its own head, then the agent's Host, framing and ``Connection: close``."""
        lines = [f"{self.method} {self.path} HTTP/1.1", f"Host: {self.where}"]
        lines.extend(f"{name}: {value}" for name, value in self.headers)
        if self.body is not None or self.method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(self.body or b'')}")
        lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (self.body or b"")


def http_port(data: dict[str, object]) -> int:
    port = data.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ApiError(400, "port must be an integer from 1 to 65535")
    return port


def http_method(data: dict[str, object]) -> str:
    method = data.get("method")
    if method is None:
        return "POST"
    if not isinstance(method, str) or method not in HTTP_METHODS:
        raise ApiError(400, f"method must be one of {', '.join(sorted(HTTP_METHODS))}")
    return str(method)


def http_path(data: dict[str, object]) -> str:
    """The request target: an absolute path (query included), printable ASCII, never a URL."""
    path = data.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise ApiError(400, "path must be a string starting with / (the service is always 127.0.0.1:port)")
    if len(path) > HTTP_MAX_PATH:
        raise ApiError(400, f"path is {len(path)} characters, over the limit of {HTTP_MAX_PATH}")
    if not all("!" <= c <= "~" for c in path):
        raise ApiError(400, "path must be printable ASCII without spaces, CR, LF or NUL (percent-encode the rest)")
    return path


def is_token(name: str) -> bool:
    """An HTTP field name (RFC 9110 token)."""
    return bool(name) and all(c in HTTP_TOKEN_CHARS for c in name)


def http_headers(data: dict[str, object]) -> list[tuple[str, str]]:
    headers = data.get("headers")
    if headers is None:
        return []
    if not isinstance(headers, dict):
        raise ApiError(400, "headers must be an object mapping names to string values")
    if len(headers) > HTTP_MAX_REQUEST_HEADERS:
        raise ApiError(400, f"at most {HTTP_MAX_REQUEST_HEADERS} headers")
    size = 0
    for name, value in headers.items():
        if not is_token(name):
            raise ApiError(400, f"header name {name[:80]!r} is not an HTTP token")
        if name.lower() in HTTP_AGENT_HEADERS:
            raise ApiError(400, f"the agent sets {name} itself; leave it out of headers")
        if not isinstance(value, str) or any(c in value for c in "\r\n\0"):
            raise ApiError(400, f"headers[{name!r}] must be a string without CR, LF or NUL")
        try:
            value.encode("latin-1")
        except UnicodeEncodeError:
            raise ApiError(400, f"headers[{name!r}] must be Latin-1 text (percent-encode the rest)") from None
        size += len(name) + len(value) + 4
    if size > HTTP_MAX_HEAD_BYTES:
        raise ApiError(400, f"headers are {size} bytes, over the limit of {HTTP_MAX_HEAD_BYTES}")
    return [(name, value.strip()) for name, value in headers.items()]


def http_body(data: dict[str, object]) -> bytes | None:
    value = field_str(data, "body")
    if value is None:
        return None
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise ApiError(400, "body must be base64-encoded") from None


def http_timeout(data: dict[str, object]) -> float:
    timeout = field_timeout(data)
    if timeout is None:
        return HTTP_DEFAULT_TIMEOUT
    if timeout > HTTP_MAX_TIMEOUT:
        raise ApiError(400, f"timeout must be at most {HTTP_MAX_TIMEOUT:g} seconds")
    return timeout


def http_max_bytes(data: dict[str, object]) -> int:
    value = data.get("max_bytes")
    if value is None:
        return HTTP_DEFAULT_MAX_BYTES
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= HTTP_MAX_BYTES:
        raise ApiError(400, f"max_bytes must be an integer from 0 to {HTTP_MAX_BYTES} ({HTTP_MAX_BYTES >> 20} MiB)")
    return value


class Upstream:
    """The connection to the sandbox's service: reads bounded by one deadline for the whole call.

    Every ``recv`` waits at most until the deadline (a service that sends a byte at a time cannot
    stretch the call); a missed deadline is a 504, a malformed answer a 502 naming it.
    """

    __slots__ = ("buffer", "deadline", "eof", "request", "sock")

    def __init__(self, request: HttpRequest, sock: socket.socket, deadline: float) -> None:
        self.request, self.sock, self.deadline = request, sock, deadline
        self.buffer = bytearray()
        self.eof = False

    def timed_out(self) -> ApiError:
        return ApiError(504, f"the service on {self.request.where} did not answer in {self.request.timeout:g} s")

    def bad(self, what: str) -> ApiError:
        return ApiError(502, f"the service on {self.request.where} in the sandbox {what}")

    def recv(self, size: int = HTTP_RECV) -> bytes:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise self.timed_out()
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(size)
        except TimeoutError:
            raise self.timed_out() from None
        except OSError as exc:  # reset by the service
            raise self.bad(f"broke the connection: {exc.strerror or exc}") from None
        self.eof = not chunk
        return chunk

    def line(self, limit: int) -> bytes:
        """One line (with its end), at most ``limit`` bytes; what is left at EOF; 502 past the limit."""
        start = 0
        while (end := self.buffer.find(b"\n", start)) < 0:
            if len(self.buffer) > limit:
                raise self.bad(f"answered a head line over {limit} bytes")
            start = len(self.buffer)
            chunk = self.recv()
            if not chunk:
                end = len(self.buffer) - 1
                break
            self.buffer += chunk
        if end + 1 > limit:
            raise self.bad(f"answered a head line over {limit} bytes")
        line = bytes(self.buffer[: end + 1])
        del self.buffer[: end + 1]
        return line

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes (fewer only at EOF)."""
        out = bytearray(self.buffer[:size])
        del self.buffer[:size]
        while len(out) < size and (chunk := self.recv(min(size - len(out), HTTP_RECV))):
            out += chunk
        return bytes(out)

    def exactly(self, size: int, what: str) -> bytes:
        data = self.read(size)
        if len(data) < size:
            raise self.bad(f"hung up in the middle of {what} ({len(data)} of {size} bytes)")
        return data


def call_service(request: HttpRequest) -> dict[str, object]:
    """Send ``request`` to ``127.0.0.1:port`` (never another address) and read its answer, bounded."""
    started = time.monotonic()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    upstream = Upstream(request, sock, started + request.timeout)
    try:
        sock.settimeout(request.timeout)
        try:
            sock.connect(("127.0.0.1", request.port))
        except ConnectionRefusedError:
            raise ApiError(502, f"nothing listens on {request.where} in the sandbox") from None
        except TimeoutError:
            raise upstream.timed_out() from None
        except OSError as exc:
            raise ApiError(502, f"cannot connect to {request.where} in the sandbox: {exc.strerror or exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.settimeout(max(upstream.deadline - time.monotonic(), 0.001))
            sock.sendall(request.message())
        except TimeoutError:
            raise upstream.timed_out() from None
        except OSError:
            pass  # it may have answered without reading the body (a 413, say): read what it said
        status, headers = read_head(upstream)
        body, truncated = read_body(upstream, status, headers)
    finally:
        sock.close()
    return {
        "status": status,
        "headers": [[name, value] for name, value in headers],
        "body": base64.b64encode(body).decode(),
        "truncated": truncated,
        "duration": round(time.monotonic() - started, 6),
    }


def read_head(upstream: Upstream) -> tuple[int, list[tuple[str, str]]]:
    """The status and headers of the service's answer, after any 1xx ones; 502 when not HTTP."""
    for _ in range(HTTP_MAX_INTERIM):
        status, headers = _read_one_head(upstream)
        if not 100 <= status < 200 or status == 101:
            return status, headers
    raise upstream.bad(f"sent over {HTTP_MAX_INTERIM} interim (1xx) answers")


def _read_one_head(upstream: Upstream) -> tuple[int, list[tuple[str, str]]]:
    budget = HTTP_MAX_HEAD_BYTES
    line = upstream.line(budget)
    if not line:
        raise upstream.bad("closed the connection without answering")
    parts = line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise upstream.bad(f"answered something that is not HTTP/1.x: {line[:80]!r}")
    status = int(parts[1])
    if status < 100:
        raise upstream.bad(f"answered status {status}, not an HTTP status")
    budget -= len(line)
    headers: list[tuple[str, str]] = []
    while True:
        line = upstream.line(budget)
        budget -= len(line)
        if line in (b"\r\n", b"\n"):
            return status, headers
        if not line.endswith(b"\n"):
            raise upstream.bad("hung up in the middle of its headers")
        text = line.decode("latin-1").rstrip("\r\n")
        if text[:1] in (" ", "\t") and headers:  # an obsolete folded line continues the last header
            headers[-1] = (headers[-1][0], f"{headers[-1][1]} {text.strip()}")
            continue
        name, colon, value = text.partition(":")
        if not colon or not is_token(name) or "\0" in value or "\r" in value:
            raise upstream.bad(f"answered a malformed header line: {line[:80]!r}")
        if len(headers) >= HTTP_MAX_ANSWER_HEADERS:
            raise upstream.bad(f"answered over {HTTP_MAX_ANSWER_HEADERS} header lines")
        headers.append((name, value.strip()))


def read_body(upstream: Upstream, status: int, headers: list[tuple[str, str]]) -> tuple[bytes, bool]:
    """At most ``max_bytes`` of the body, framed as RFC 9112 says, and whether there was more."""
    limit = upstream.request.max_bytes
    if upstream.request.method == "HEAD" or status < 200 or status in (204, 304):
        return b"", False
    named = {name.lower(): value for name, value in headers}
    if "transfer-encoding" in named:
        if named["transfer-encoding"].lower().replace(" ", "").endswith("chunked"):
            return read_chunked(upstream, limit)
    elif "content-length" in named:
        lengths = {value.strip() for name, value in headers if name.lower() == "content-length"}
        length = lengths.pop() if len(lengths) == 1 else ""
        if not length.isdigit():
            raise upstream.bad(f"answered an invalid Content-Length: {named['content-length'][:40]!r}")
        size = int(length)
        return upstream.exactly(min(size, limit), "its body"), size > limit
    body = upstream.read(limit + 1)  # no framing: the body ends when the service hangs up
    return body[:limit], len(body) > limit


def read_chunked(upstream: Upstream, limit: int) -> tuple[bytes, bool]:
    body = bytearray()
    while True:
        line = upstream.line(1024)
        size_text = line.split(b";", 1)[0].strip()
        if not line.endswith(b"\n") or not size_text or len(size_text) > 16:
            raise upstream.bad(f"sent a malformed chunk size line: {line[:40]!r}")
        try:
            size = int(size_text, 16)
        except ValueError:
            raise upstream.bad(f"sent a malformed chunk size line: {line[:40]!r}") from None
        if size == 0:
            break
        room = limit - len(body)
        if size > room:
            body += upstream.exactly(room, "a chunk")
            return bytes(body), True
        body += upstream.exactly(size, "a chunk")
        if upstream.line(2) not in (b"\r\n", b"\n"):
            raise upstream.bad("sent a chunk without its line end")
    budget = HTTP_MAX_HEAD_BYTES
    while (trailer := upstream.line(budget)) not in (b"\r\n", b"\n", b""):  # trailers are dropped
        budget -= len(trailer)
    return bytes(body), False


# -- connections from the sandbox carried to the host (POST /listen, POST /accept) ----------


class Listener:
    """A port of the sandbox's loopback that the host listens on through the agent (``POST /listen``).

    Connections made to it wait in the kernel's accept queue (at most ``TUNNEL_BACKLOG``; past
    that the kernel answers no more, and the client's connect retries) until an ``/accept`` of
    the host takes one. Nothing is accepted on the host's behalf when it is not asking, so no
    connection of the sandbox waits in the agent. ``close`` (``DELETE /listen``) shuts the
    socket down first, which refuses new connections, resets those queued and wakes every
    waiting ``/accept``; the descriptor is closed once the last of them has left it, so none
    waits on a number the system has given to another file.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT; never a 2nd listener
            self.sock.bind(("127.0.0.1", port))
            self.sock.listen(TUNNEL_BACKLOG)
            self.sock.setblocking(False)
        except BaseException:
            self.sock.close()
            raise
        self.lock = threading.Lock()
        self.closed = False
        self.users = 0

    def accept(self, caller: socket.socket, deadline: float) -> socket.socket | None:
        """The next connection made to the port, or None when none came by ``deadline``.

        ``caller`` is the host's connection: when it becomes readable (the host hung up; it
        sends nothing while it waits) the wait ends with ConnectionResetError, and no
        connection is taken for a host that is gone. 404 once the listener is closed.
        """
        with self.lock:
            if self.closed:
                raise self.not_listening()
            self.users += 1
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self.sock, selectors.EVENT_READ)
                selector.register(caller, selectors.EVENT_READ)
                while not self.closed:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return None
                    events = selector.select(min(remaining, TUNNEL_POLL_S))
                    if any(key.fileobj is caller for key, _ in events):
                        raise ConnectionResetError("the host hung up while waiting for a connection")
                    if self.closed or not events:
                        continue
                    try:
                        conn, _ = self.sock.accept()
                    except BlockingIOError:  # another /accept took it first
                        continue
                    except OSError:
                        if self.closed:
                            break
                        raise
                    conn.setblocking(True)
                    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    return conn
                raise self.not_listening()
        finally:
            self.release()

    def not_listening(self) -> ApiError:
        return ApiError(404, f"the agent does not listen on 127.0.0.1:{self.port} (POST /listen first)")

    def release(self) -> None:
        with self.lock:
            self.users -= 1
            last = self.closed and not self.users
        if last:
            self.sock.close()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            idle = not self.users
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # refuses new connections, wakes the waiters
        if idle:
            self.sock.close()


def tunnel_wait(data: dict[str, object]) -> float:
    wait = field_timeout(data)
    if wait is None:
        return TUNNEL_DEFAULT_WAIT
    if wait > TUNNEL_MAX_WAIT:
        raise ApiError(400, f"timeout must be at most {TUNNEL_MAX_WAIT:g} seconds")
    return wait


def splice(host: socket.socket, host_reader: io.BufferedIOBase, sandbox: socket.socket) -> None:
    """Bytes both ways between the host's connection and one of the sandbox, until both ends are done.

    The end of one direction (EOF) is passed on as ``shutdown(SHUT_WR)``, so a client that
    half-closes still gets its answer; a broken connection ends both directions. The host's
    side is read through its buffered reader, which may already hold the first bytes.
    """
    back = threading.Thread(target=carry, args=(sandbox.recv, host, sandbox), name="tunnel-back", daemon=True)
    back.start()
    try:
        carry(host_reader.read1, sandbox, host)
    finally:
        back.join()
        sandbox.close()


def carry(read: Callable[[int], bytes], dest: socket.socket, source: socket.socket) -> None:
    """One direction of ``splice``: what ``read`` gives, to ``dest``; at EOF, ``dest`` is shut for writing."""
    try:
        while chunk := read(TUNNEL_CHUNK):
            dest.sendall(chunk)
        dest.shutdown(socket.SHUT_WR)
    except OSError:  # one side broke: end the other direction too
        for sock in (dest, source):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


# -- HTTP ----------------------------------------------------------------------------------


class Headers(dict):
    """Request headers by lower-cased name (a repeated header keeps its last value)."""

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return dict.get(self, name.lower(), default)


class AgentHandler(socketserver.StreamRequestHandler):
    """One keep-alive connection; requests are dispatched through ``ROUTES`` to ``route_*`` methods.

    A deliberately small HTTP/1.1 server side: a request line, headers, a body framed by
    Content-Length. (``http.server`` parses headers with the ``email`` package: tens of
    milliseconds of every sandbox's start-up and tens of microseconds of every request.)
    """

    server: AgentServer
    command = path = ""
    headers: Headers
    close_connection = True

    _unread: int | None = 0
    _responded = False
    _query: dict[str, list[str]]

    def handle(self) -> None:
        self.close_connection = False
        while not self.close_connection:
            self.handle_one_request()

    def handle_one_request(self) -> None:
        line = self.rfile.readline(MAX_HEAD_LINE + 1)
        if not line:
            self.close_connection = True
            return
        self.command, self.headers, self._responded, self._unread = "", Headers(), False, 0
        parts = line.decode("latin-1").split()
        if len(line) > MAX_HEAD_LINE:
            self.send_error(414, "the request line is too long")
            return
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            self.send_error(400, f"not an HTTP/1.x request line: {line[:80]!r}")
            return
        self.command, self.path, version = parts
        for _ in range(MAX_HEADERS + 1):
            header = self.rfile.readline(MAX_HEAD_LINE + 1)
            if header in (b"\r\n", b"\n", b""):
                break
            name, colon, value = header.decode("latin-1").partition(":")
            if not colon or len(header) > MAX_HEAD_LINE:
                self.send_error(400, f"malformed header line: {header[:80]!r}")
                return
            self.headers[name.strip().lower()] = value.strip()
        else:
            self.send_error(431, f"more than {MAX_HEADERS} headers")
            return
        connection = (self.headers.get("Connection") or "").lower()
        self.close_connection = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
        if (self.headers.get("Expect") or "").lower() == "100-continue":
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.dispatch()

    def send_error(self, code: int, message: str) -> None:
        """A request that cannot be parsed: answer and hang up."""
        self.close_connection = True
        self.send_json(code, {"error": message})

    # dispatch ---------------------------------------------------------------------------

    def dispatch(self) -> None:
        self._responded = False
        self._unread = self._declared_length()
        try:
            url = urllib.parse.urlsplit(self.path)
            self._query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
            self.check_auth()
            getattr(self, self._route(url.path))()
        except ApiError as exc:
            self.send_api_error(exc)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except PermissionError as exc:
            self.send_api_error(ApiError(403, f"permission denied: {exc.filename or exc}"))
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                self.send_api_error(ApiError(500, f"internal error: {type(exc).__name__}: {exc}"))
            else:
                where = f" (writing {exc.filename})" if exc.filename else ""
                self.send_api_error(ApiError(507, f"no space left in the sandbox{where}"))
        except Exception as exc:
            self.send_api_error(ApiError(500, f"internal error: {type(exc).__name__}: {exc}"))

    def _route(self, path: str) -> str:
        methods = ROUTES.get(path)
        if methods is None:
            raise ApiError(404, f"no such route: {path}")
        name = methods.get(self.command)
        if name is None:
            allowed = ", ".join(methods)
            raise ApiError(405, f"{self.command} is not allowed on {path}; use {allowed}", {"Allow": allowed})
        return name

    def check_auth(self) -> None:
        header = self.headers.get("Authorization")
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(
                401,
                "missing bearer token: send 'Authorization: Bearer <token>'",
                {"WWW-Authenticate": "Bearer"},
            )
        if not _compare_digest(_sha256(token.strip().encode()).digest(), self.server.agent.token_digest):
            raise ApiError(403, "the bearer token is wrong")

    # request helpers --------------------------------------------------------------------

    def _declared_length(self) -> int | None:
        """The body length announced by the client; None if unknown (chunked or invalid)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return None
        raw = self.headers.get("Content-Length")
        if raw is None:
            return 0
        try:
            length = int(raw)
        except ValueError:
            return None
        return length if length >= 0 else None

    def body_length(self, limit: int, required: bool = False) -> int:
        if self._unread is None:
            raise ApiError(411, "send the body with a valid Content-Length (chunked is unsupported)")
        if required and self.headers.get("Content-Length") is None:
            raise ApiError(411, "the Content-Length header is required")
        if self._unread > limit:
            raise ApiError(413, f"request body is {self._unread} bytes; the limit is {limit}")
        return self._unread

    def read_body(self, limit: int) -> bytes:
        length = self.body_length(limit)
        body = self.rfile.read(length) if length else b""
        self._unread = 0
        if len(body) < length:
            self.close_connection = True
            raise ApiError(400, f"request body ended after {len(body)} of {length} bytes")
        return body

    def copy_body(self, out: BinaryIO, limit: int) -> int:
        """Stream the body (Content-Length required) into the binary file ``out``."""
        length = remaining = self.body_length(limit, required=True)
        self._unread = None  # until fully read, the connection cannot be reused
        while remaining:
            chunk = self.rfile.read(min(remaining, COPY_CHUNK))
            if not chunk:
                self.close_connection = True
                raise ApiError(400, f"request body ended after {length - remaining} of {length} bytes")
            out.write(chunk)
            remaining -= len(chunk)
        self._unread = 0
        return length

    def read_json(self, allowed: frozenset[str]) -> dict[str, object]:
        return parse_json_object(self.read_body(MAX_JSON_BODY), allowed)

    def param(self, name: str) -> str | None:
        values = self._query.get(name)
        return values[-1] if values else None

    def path_param(self) -> str:
        raw = self.param("path")
        if not raw:
            raise ApiError(400, "the path query parameter is required and must not be empty")
        if "\0" in raw:
            raise ApiError(400, "path must not contain NUL characters")
        return self.server.agent.resolve(raw)

    def resolve_cwd(self, cwd: str | None) -> str:
        if cwd is None:
            return self.server.agent.default_cwd()
        path = self.server.agent.resolve(cwd)
        if not os.path.exists(path):
            raise ApiError(400, f"cwd does not exist: {path}")
        if not os.path.isdir(path):
            raise ApiError(400, f"cwd is not a directory: {path}")
        return path

    # response helpers -------------------------------------------------------------------

    def _head(self, status: int, content_type: str, length: int, headers: dict[str, str]) -> bytes:
        lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}", f"Content-Type: {content_type}"]
        lines.append(f"Content-Length: {length}")
        lines.extend(f"{name}: {value}" for name, value in headers.items())
        if self.close_connection:
            lines.append("Connection: close")
        self._responded = True
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def send_bytes(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        head = self._head(status, content_type, len(body), headers or {})
        self.wfile.write(head if self.command == "HEAD" else head + body)

    def send_exec(self, result: ProcessResult, timeout: float | None = None, **extra: object) -> None:
        self.send_bytes(200, exec_answer(result, timeout, **extra), EXEC_CONTENT_TYPE)

    def send_json(self, status: int, obj: object, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(obj, separators=(",", ":")).encode()
        self.send_bytes(status, body, "application/json", headers)

    def send_file(self, f: BinaryIO, size: int, content_type: str) -> None:
        self.wfile.write(self._head(200, content_type, size, {}))
        if size and self.connection.sendfile(f, 0, size) < size:
            self.close_connection = True  # the file shrank: the response is cut short

    def send_api_error(self, exc: ApiError) -> None:
        if self._responded:  # failed mid-response: the only honest signal left is to hang up
            self.close_connection = True
            return
        self._skip_unread_body()
        self.send_json(exc.status, {"error": exc.message}, exc.headers)

    def _skip_unread_body(self) -> None:
        """Consume a small unread body so the connection stays usable; else close it."""
        if self._unread is None or self._unread > MAX_DRAINED_BODY:
            self.close_connection = True
        elif self._unread:
            if len(self.rfile.read(self._unread)) < self._unread:
                self.close_connection = True
            self._unread = 0

    # routes -----------------------------------------------------------------------------

    def route_health(self) -> None:
        self.send_json(200, {"status": "ok", "pid": os.getpid(), "version": VERSION})

    def route_exec(self) -> None:
        data = self.read_json(EXEC_FIELDS)
        script = field_command(data)
        cwd, env = field_str(data, "cwd"), field_env(data)
        timeout, login = field_timeout(data), field_bool(data, "login_shell")
        max_output, stdin = field_max_output(data), field_stdin(data)
        agent = self.server.agent
        with long_command(script, agent) as (command, fds):
            try:
                argv = agent.shell.argv(command, login, fds[0] if fds else None)
            except FileNotFoundError as exc:
                self.send_exec(ProcessResult(Capture(0), Capture(0), error=str(exc)))
                return
            ooms = oom_kills()
            result = run_process(
                argv,
                cwd=self.resolve_cwd(cwd),
                env={**agent.base_env, **env},
                stdin=stdin,
                timeout=timeout,
                max_output=max_output,
                pass_fds=fds,
                quiet_job_control=login and agent.shell.is_bash,
            )
        note_oom(result, ooms)
        self.send_exec(result, timeout)

    def route_shell(self) -> None:
        data = self.read_json(SHELL_FIELDS)
        command = data.get("command")
        if not isinstance(command, str) or not command.strip():
            raise ApiError(400, "command must be a non-empty string in a shell session")
        check_script(command)
        name = field_str(data, "session") or "default"
        timeout, max_output = field_timeout(data), field_max_output(data)
        try:
            session = self.server.agent.session(name)
        except FileNotFoundError as exc:
            self.send_exec(ProcessResult(Capture(0), Capture(0), error=str(exc)))
            return
        ooms = oom_kills()
        result = session.run(command, timeout, max_output)
        note_oom(result, ooms)
        if result.timed_out or not session.alive():
            self.server.agent.close_session(name, only=session)
        self.send_exec(result, timeout, session=name)

    def route_pty(self) -> None:
        if (self.headers.get("Upgrade") or "").lower() != PTY_UPGRADE:
            raise ApiError(400, f"a terminal needs the headers 'Connection: Upgrade' and 'Upgrade: {PTY_UPGRADE}'")
        self.read_body(0)
        self.close_connection = True
        self._responded = True
        self.wfile.write(
            f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: {PTY_UPGRADE}\r\nConnection: Upgrade\r\n\r\n".encode()
        )
        Terminal(self.server.agent, self.connection, self.rfile, self.wfile).run()

    def route_close_shell(self) -> None:
        name = self.param("session") or "default"
        self.send_json(200, {"session": name, "closed": self.server.agent.close_session(name)})

    def route_get_file(self) -> None:
        path = self.path_param()
        st = stat_or_404(path)
        if stat.S_ISDIR(st.st_mode):
            raise ApiError(400, f"is a directory: {path}")
        if not stat.S_ISREG(st.st_mode):
            raise ApiError(400, f"not a regular file: {path}")
        with open_or_error(path) as f:
            self.send_file(f, os.fstat(f.fileno()).st_size, "application/octet-stream")

    def route_put_file(self) -> None:
        path = self.path_param()
        mode = parse_mode(self.param("mode"))
        self.body_length(MAX_UPLOAD_BODY, required=True)
        if os.path.isdir(path):
            raise ApiError(400, f"is a directory: {path}")
        parent = os.path.dirname(path)
        make_dirs(parent)
        if mode is None:
            mode = stat.S_IMODE(os.stat(path).st_mode) if os.path.isfile(path) else 0o644
        fd, temp = tempfile.mkstemp(dir=parent, prefix=".orchard-upload-")
        try:
            with os.fdopen(fd, "wb") as f:
                size = self.copy_body(f, MAX_UPLOAD_BODY)
            os.chmod(temp, mode)
            os.replace(temp, path)
        except BaseException:
            os.unlink(temp)
            raise
        self.send_json(200, {"path": path, "size": size})

    def route_list_files(self) -> None:
        path = self.path_param()
        st = stat_or_404(path)
        if not stat.S_ISDIR(st.st_mode):
            raise ApiError(400, f"not a directory: {path}")
        try:
            with os.scandir(path) as entries:
                rows = [row for row in map(list_entry, entries) if row is not None]
            files = sorted(rows, key=lambda f: str(f["name"]))
        except PermissionError:
            raise ApiError(403, f"permission denied: {path}") from None
        self.send_json(200, {"path": path, "files": files})

    def route_get_archive(self) -> None:
        path = self.path_param()
        if not os.path.lexists(path):
            raise ApiError(404, f"no such file or directory: {path}")
        with tempfile.TemporaryFile() as spool:
            try:
                write_tar(path, spool)
            except PermissionError as exc:
                raise ApiError(403, f"permission denied: {exc.filename}") from None
            size = spool.tell()
            spool.seek(0)
            self.send_file(spool, size, "application/x-tar")

    def route_put_archive(self) -> None:
        dest = self.path_param()
        self.body_length(MAX_UPLOAD_BODY, required=True)
        make_dirs(dest)
        with tempfile.TemporaryFile(dir=dest) as spool:
            self.copy_body(spool, MAX_UPLOAD_BODY)
            spool.seek(0)
            count = extract_tar(spool, dest)
        self.send_json(200, {"path": dest, "files": count})

    def route_apply_patch(self) -> None:
        data = self.read_json(PATCH_FIELDS)
        patch = field_str(data, "patch")
        if patch is None:
            raise ApiError(400, "patch must be a string")
        cwd = self.resolve_cwd(field_str(data, "cwd"))
        timeout = field_timeout(data) or DEFAULT_PATCH_TIMEOUT
        self.send_json(200, apply_patch(patch, cwd, timeout, self.server.agent.base_env))

    def route_http(self) -> None:
        self.send_json(200, call_service(HttpRequest(self.read_json(HTTP_FIELDS))))

    def route_listen(self) -> None:
        port = http_port(self.read_json(LISTEN_FIELDS))
        created = self.server.agent.listen(port)
        self.send_json(200, {"port": port, "listening": True, "created": created})

    def route_unlisten(self) -> None:
        raw = self.param("port") or ""
        port = http_port({"port": int(raw) if raw.isdigit() and len(raw) < 6 else None})
        self.send_json(200, {"port": port, "closed": self.server.agent.unlisten(port)})

    def route_accept(self) -> None:
        if (self.headers.get("Upgrade") or "").lower() != TUNNEL_UPGRADE:
            raise ApiError(400, f"a tunnel needs the headers 'Connection: Upgrade' and 'Upgrade: {TUNNEL_UPGRADE}'")
        data = self.read_json(ACCEPT_FIELDS)
        port, wait = http_port(data), tunnel_wait(data)
        conn = self.server.agent.listener(port).accept(self.connection, time.monotonic() + wait)
        self._responded = True
        if conn is None:  # no body, no Content-Length (RFC 9110): the connection stays open for the next
            self.wfile.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            return
        self.close_connection = True
        self.tunnel(conn)

    def route_connect(self) -> None:
        if (self.headers.get("Upgrade") or "").lower() != TUNNEL_UPGRADE:
            raise ApiError(400, f"a tunnel needs the headers 'Connection: Upgrade' and 'Upgrade: {TUNNEL_UPGRADE}'")
        data = self.read_json(ACCEPT_FIELDS)
        port, wait = http_port(data), tunnel_wait(data)
        conn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # a literal address: no name lookup
        try:
            conn.settimeout(wait)
            conn.connect(("127.0.0.1", port))
        except ConnectionRefusedError:
            conn.close()
            raise ApiError(502, f"nothing listens on 127.0.0.1:{port} in the sandbox") from None
        except TimeoutError:
            conn.close()
            raise ApiError(504, f"no connection to 127.0.0.1:{port} within {wait:g} s") from None
        except OSError as exc:
            conn.close()
            raise ApiError(502, f"cannot connect to 127.0.0.1:{port}: {exc.strerror or exc}") from None
        conn.settimeout(None)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._responded = self.close_connection = True
        self.tunnel(conn)

    def tunnel(self, conn: socket.socket) -> None:
        """Answer 101 and carry the raw bytes between the caller and `conn` until both are done."""
        try:
            self.wfile.write(
                f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: {TUNNEL_UPGRADE}\r\nConnection: Upgrade\r\n\r\n".encode()
            )
        except OSError:
            conn.close()
            raise
        splice(self.connection, self.rfile, conn)


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
        done = _exit_watch(self.proc)
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


def stat_or_404(path: str) -> os.stat_result:
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise ApiError(404, f"no such file or directory: {path}") from None
    except PermissionError:
        raise ApiError(403, f"permission denied: {path}") from None


def open_or_error(path: str) -> BinaryIO:
    try:
        return open(path, "rb")
    except PermissionError:
        raise ApiError(403, f"permission denied: {path}") from None
    except FileNotFoundError:
        raise ApiError(404, f"no such file or directory: {path}") from None


def make_dirs(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ApiError(400, f"not a directory: {path} (or one of its parents)") from None
    except PermissionError:
        raise ApiError(403, f"permission denied: {path}") from None


# -- servers -------------------------------------------------------------------------------


class AgentServer(socketserver.ThreadingMixIn, socketserver.BaseServer):
    """Shared behaviour of the Unix and TCP servers: a thread per connection, quiet errors."""

    daemon_threads = True
    request_queue_size = 4096  # the kernel caps it at net.core.somaxconn: a burst of connections is queued
    agent: AgentConfig

    def handle_error(self, request: object, client_address: object) -> None:
        exc = sys.exc_info()[1]
        if not isinstance(exc, ConnectionError | TimeoutError):
            print(f"orchard-agent: connection failed: {exc!r}", file=sys.stderr)


class UnixAgentServer(AgentServer, socketserver.UnixStreamServer):
    """Listens on a Unix socket."""


class TCPAgentServer(AgentServer, socketserver.TCPServer):
    """Listens on TCP, with Nagle's algorithm off on every connection."""

    allow_reuse_address = True

    def get_request(self) -> tuple[socket.socket, object]:
        conn, address = self.socket.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn, address


class TCP6AgentServer(TCPAgentServer):
    """Listens on TCP over IPv6."""

    address_family = socket.AF_INET6


def make_server(config: AgentConfig, *, unix: str | None = None, tcp: tuple[str, int] | None = None) -> AgentServer:
    """A bound, listening server (not yet serving). Exactly one of ``unix`` and ``tcp``."""
    if (unix is None) == (tcp is None):
        raise ValueError("give exactly one of unix= and tcp=")
    server: AgentServer
    if unix is not None:
        server = _bind_unix(unix)
    else:
        assert tcp is not None
        host = tcp[0].strip("[]")
        server_class = TCP6AgentServer if ":" in host else TCPAgentServer
        server = server_class((host, tcp[1]), AgentHandler)
    server.agent = config
    return server


def _bind_unix(path: str) -> UnixAgentServer:
    """Bind and listen on a temporary name, chmod 0666, then rename it onto ``path``.

    The rename replaces a stale socket from an earlier run, and clients waiting for ``path`` to
    appear always find a listening socket with its final mode. Where a socket on a host folder
    can be neither chmodded nor renamed (gVisor's host-UDS), it is bound in place with mode 0666.
    """
    temp = f"{path}.new"
    _remove_socket(temp)
    server = UnixAgentServer(temp, AgentHandler)
    try:
        os.chmod(temp, 0o666)
        os.replace(temp, path)
    except PermissionError:  # a host socket that can only be bound (nor unlinked, nor stat-ed)
        server.server_close()
        mask = os.umask(0o111)
        try:
            return UnixAgentServer(path, AgentHandler)
        finally:
            os.umask(mask)
    except OSError:
        server.server_close()
        _remove_socket(temp)
        raise
    server.server_address = path
    return server


def serve(config: AgentConfig, *, unix: str | None = None, tcp: tuple[str, int] | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then remove the Unix socket file. The stop is handled from
    before the socket appears: one that comes while it is bound waits until it can be removed."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    stops = {signal.SIGTERM, signal.SIGINT}
    for signum in stops:
        signal.signal(signum, stop)
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        server = make_server(config, unix=unix, tcp=tcp)
    except BaseException:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        raise
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        server.serve_forever(poll_interval=None)  # type: ignore[arg-type]
    finally:
        server.server_close()
        if unix is not None:
            _remove_socket(unix)


def _remove_socket(path: str) -> None:
    with contextlib.suppress(FileNotFoundError, PermissionError):
        os.unlink(path)


# -- command line --------------------------------------------------------------------------

USAGE = "usage: server.py (--unix PATH | --tcp HOST:PORT) [--workdir DIR]"


def parse_args(argv: list[str]) -> dict[str, str]:
    """``--unix``, ``--tcp`` and ``--workdir`` (``--name value`` or ``--name=value``)."""
    options: dict[str, str] = {}
    args = iter(argv)
    for arg in args:
        if arg in ("-h", "--help"):
            print(USAGE)
            raise SystemExit(0)
        name, has_value, value = arg.partition("=")
        if name not in ("--unix", "--tcp", "--workdir"):
            fail(f"unknown argument {arg!r}")
        if not has_value:
            value = next(args, "")
        if not value:
            fail(f"{name} needs a value")
        options[name[2:]] = value
    if ("unix" in options) == ("tcp" in options):
        fail("give exactly one of --unix and --tcp")
    return options


def parse_tcp(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        fail(f"--tcp must be HOST:PORT, not {address!r}")
    return host, int(port)


def fail(message: str) -> NoReturn:
    print(f"orchard-agent: {message}\n{USAGE}", file=sys.stderr)
    raise SystemExit(2)


def parse_sha256(text: str) -> bytes:
    """The 32 bytes of a hex SHA-256 digest (either case); ValueError naming the variable otherwise."""
    text = text.strip()
    if len(text) != 64 or not all(c in "0123456789abcdefABCDEF" for c in text):
        raise ValueError(f"{TOKEN_SHA256_ENV} must be 64 hex digits (the SHA-256 of the token)")
    return bytes.fromhex(text)


def main(argv: list[str] | None = None) -> int:
    """Start the agent: read (and remove) the token, bind, serve until SIGTERM or SIGINT."""
    options = parse_args(sys.argv[1:] if argv is None else argv)
    token = os.environ.pop(TOKEN_ENV, "")
    token_sha256 = os.environ.pop(TOKEN_SHA256_ENV, "")
    if not token and not token_sha256:
        fail(f"{TOKEN_ENV} (or {TOKEN_SHA256_ENV}) is not set: the agent refuses to start without a token")
    if token and token_sha256:
        fail(f"both {TOKEN_ENV} and {TOKEN_SHA256_ENV} are set: set one")
    try:
        config = AgentConfig(token, options.get("workdir", DEFAULT_WORKDIR), token_sha256=token_sha256)
    except ValueError as exc:
        fail(str(exc))
    tcp = parse_tcp(options["tcp"]) if "tcp" in options else None
    try:
        serve(config, unix=options.get("unix"), tcp=tcp)
    except OSError as exc:
        print(f"orchard-agent: cannot listen: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
