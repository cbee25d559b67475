"""`AgentHandler`: the HTTP/1.1 server side of one connection, and one ``route_*`` method a route
(each reads its request's fields, does the work through the other modules and answers)."""

from __future__ import annotations

import errno
import json
import os
import socket
import socketserver
import stat
import tempfile
import time
import urllib.parse

from .files import extract_tar, list_entry, make_dirs, open_or_error, stat_or_404, write_tar
from .processes import Capture, ProcessResult, apply_patch, exec_answer, note_oom, oom_kills, run_process
from .protocol import (
    ACCEPT_FIELDS,
    ACCEPT_ROUTE,
    APPLY_PATCH_ROUTE,
    ARCHIVE_ROUTE,
    CONNECT_ROUTE,
    DEFAULT_PATCH_TIMEOUT,
    EXEC_CONTENT_TYPE,
    EXEC_FIELDS,
    EXEC_ROUTE,
    FILES_LIST_ROUTE,
    FILES_ROUTE,
    HEALTH_ROUTE,
    HTTP_FIELDS,
    HTTP_ROUTE,
    LISTEN_FIELDS,
    LISTEN_ROUTE,
    MAX_HEAD_LINE,
    MAX_HEADERS,
    MAX_JSON_BODY,
    MAX_UPLOAD_BODY,
    PATCH_FIELDS,
    PTY_ROUTE,
    PTY_UPGRADE,
    SHELL_FIELDS,
    SHELL_ROUTE,
    TUNNEL_UPGRADE,
    VERSION,
    ApiError,
    check_script,
    field_bool,
    field_command,
    field_env,
    field_max_output,
    field_stdin,
    field_str,
    field_timeout,
    http_port,
    parse_json_object,
    parse_mode,
    tunnel_wait,
)
from .shells import long_command
from .terminals import Terminal
from .tunnels import splice
from .upstream import HttpRequest, call_service

TYPE_CHECKING = False  # the typing module is not imported at run time (see the module closure)
if TYPE_CHECKING:
    from typing import BinaryIO

    from .server import AgentServer

MAX_DRAINED_BODY = 64 * 1024  # an unread body up to this size is skipped to keep the connection
COPY_CHUNK = 1024 * 1024
ROUTES: dict[str, dict[str, str]] = {
    HEALTH_ROUTE: {"GET": "route_health"},
    EXEC_ROUTE: {"POST": "route_exec"},
    FILES_ROUTE: {"GET": "route_get_file", "PUT": "route_put_file"},
    FILES_LIST_ROUTE: {"GET": "route_list_files"},
    ARCHIVE_ROUTE: {"GET": "route_get_archive", "PUT": "route_put_archive"},
    APPLY_PATCH_ROUTE: {"POST": "route_apply_patch"},
    SHELL_ROUTE: {"POST": "route_shell", "DELETE": "route_close_shell"},
    PTY_ROUTE: {"POST": "route_pty"},
    HTTP_ROUTE: {"POST": "route_http"},
    LISTEN_ROUTE: {"POST": "route_listen", "DELETE": "route_unlisten"},
    ACCEPT_ROUTE: {"POST": "route_accept"},
    CONNECT_ROUTE: {"POST": "route_connect"},
}
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
        if not self.server.agent.authorized(token.strip()):
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
        folder, environment = self.resolve_cwd(cwd), {**agent.base_env, **env}
        listed = data["command"] if isinstance(data["command"], list) and not login else None
        direct = agent.shell.direct(listed, environment, folder) if listed else None
        with long_command(script, agent) as (command, fds):
            try:
                argv, environment = direct or (agent.shell.argv(command, login, fds[0] if fds else None), environment)
            except FileNotFoundError as exc:
                self.send_exec(ProcessResult(Capture(0), Capture(0), error=str(exc)))
                return
            ooms = oom_kills()
            result = run_process(
                argv,
                cwd=folder,
                env=environment,
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
