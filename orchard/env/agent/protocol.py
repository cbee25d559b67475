"""The exec agent's wire protocol, defined once: routes, field sets, content types, upgrade names,
the token's variables and the limits, with `ApiError` and the parsing of request fields.

The host (`orchard.env.calls`, `pty`, `client`, `manager`, the backends) imports these names from
here rather than spelling them again, so this module imports only cheap standard modules.

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
    ``shlex.join`` first, except that a list the shell would only find on ``PATH`` and exec
    (no keyword, builtin or assignment first; not with ``login_shell``) is exec'd directly, with
    the environment the shell would give it (``Shell.direct``). A command over 64 KiB, which argv cannot hold, is handed to the shell
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
"""

from __future__ import annotations

import base64
import json
import math
import os
import shlex

VERSION = "1"
TOKEN_ENV = "ORCHARD_AGENT_TOKEN"
TOKEN_SHA256_ENV = "ORCHARD_AGENT_TOKEN_SHA256"
AGENT_ENV_PREFIX = "ORCHARD_AGENT_"
"""Variables of the agent's own, never passed to a command (the token among them)."""
DEFAULT_WORKDIR = "/workspace"

HEALTH_ROUTE = "/health"
EXEC_ROUTE = "/exec"
SHELL_ROUTE = "/shell"
FILES_ROUTE = "/files"
FILES_LIST_ROUTE = "/files/list"
ARCHIVE_ROUTE = "/archive"
APPLY_PATCH_ROUTE = "/apply_patch"
PTY_ROUTE = "/pty"
HTTP_ROUTE = "/http"
LISTEN_ROUTE = "/listen"
ACCEPT_ROUTE = "/accept"
CONNECT_ROUTE = "/connect"

DEFAULT_MAX_OUTPUT = 8 * 1024 * 1024
DEFAULT_PATCH_TIMEOUT = 30.0
MAX_JSON_BODY = 256 * 1024 * 1024
MAX_UPLOAD_BODY = 1024 * 1024 * 1024
MAX_COMMAND_BYTES = 16 * 1024 * 1024
MAX_HEAD_LINE = 65536
MAX_HEADERS = 100
TIMEOUT_EXIT_CODE = 124
EXEC_FIELDS = frozenset({"command", "cwd", "env", "timeout", "login_shell", "max_output", "stdin"})
SHELL_FIELDS = frozenset({"command", "session", "timeout", "max_output"})
MAX_SESSIONS = 64
EXEC_CONTENT_TYPE = "application/vnd.orchard.exec"
PATCH_FIELDS = frozenset({"patch", "cwd", "timeout"})
HTTP_FIELDS = frozenset({"port", "method", "path", "headers", "body", "timeout", "max_bytes"})
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
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
TUNNEL_UPGRADE = "orchard-tunnel"
LISTEN_FIELDS = frozenset({"port"})
ACCEPT_FIELDS = frozenset({"port", "timeout"})
TUNNEL_BACKLOG = 64
"""Connections to a listened port that may wait for the host's ``/accept`` (the kernel's accept queue)."""
MAX_LISTENERS = 64
TUNNEL_DEFAULT_WAIT = 30.0
TUNNEL_MAX_WAIT = 600.0
PTY_UPGRADE = "orchard-pty"
PTY_INIT_FIELDS = frozenset({"type", "cmd", "env", "cwd", "rows", "cols", "login_shell"})
PTY_INIT_TIMEOUT_S = 10.0
PTY_MAX_FRAME = 1024 * 1024
PTY_SIGNAL_NAMES = ("TERM", "KILL", "INT", "HUP", "QUIT")
"""The signals a ``signal`` frame may name (any case; another name means TERM)."""


class ApiError(Exception):
    """An error answered to the client as ``{"error": message}`` with an HTTP status."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


# -- request fields ------------------------------------------------------------------------


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


def http_port(data: dict[str, object]) -> int:
    port = data.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ApiError(400, "port must be an integer from 1 to 65535")
    return port


def tunnel_wait(data: dict[str, object]) -> float:
    wait = field_timeout(data)
    if wait is None:
        return TUNNEL_DEFAULT_WAIT
    if wait > TUNNEL_MAX_WAIT:
        raise ApiError(400, f"timeout must be at most {TUNNEL_MAX_WAIT:g} seconds")
    return wait
