"""The wire calls of a sandbox, built once and sent by a sync or an async HTTP client.

A sandbox is reached either straight at its exec agent (`AgentCalls`) or through an
`orchard up` service (`ServiceCalls`). Both describe each operation as a `Call`: the request to
send and how to read its answer. The sync and async SDKs only send calls, so the protocol lives
here once.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import shlex
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from orchard.env.agent.protocol import (
    ACCEPT_ROUTE,
    APPLY_PATCH_ROUTE,
    ARCHIVE_ROUTE,
    DEFAULT_MAX_OUTPUT,
    EXEC_ROUTE,
    FILES_LIST_ROUTE,
    FILES_ROUTE,
    HTTP_AGENT_HEADERS,
    HTTP_DEFAULT_MAX_BYTES,
    HTTP_MAX_ANSWER_HEADERS,
    HTTP_MAX_BYTES,
    HTTP_MAX_HEAD_BYTES,
    HTTP_MAX_PATH,
    HTTP_MAX_TIMEOUT,
    HTTP_METHODS,
    HTTP_ROUTE,
    HTTP_TOKEN_CHARS,
    LISTEN_ROUTE,
    SHELL_ROUTE,
    TUNNEL_UPGRADE,
)
from orchard.env.backends.base import SandboxSpec, check_sandbox_id
from orchard.errors import (
    AgentError,
    AuthError,
    Conflict,
    InvalidRequest,
    NotFound,
    OrchardError,
    Overloaded,
    SandboxError,
    SandboxNotReady,
    TooLarge,
)

JOB_POLL_SECONDS = 60.0
"""How long one wait call on a service job may block before the SDK asks again."""


@dataclass(frozen=True)
class ExecResult:
    """What a command did. `exit_code` is None only when it could not run (see `error`)."""

    exit_code: int | None
    stdout: str
    stderr: str
    duration: float = 0.0
    timed_out: bool = False
    truncated: bool = False
    """Output beyond the cap was dropped from the middle (a marker shows where)."""
    error: str | None = None
    raw_stdout: bytes = field(default=b"", repr=False)
    raw_stderr: bytes = field(default=b"", repr=False)
    stdout_bytes: int = 0
    """Bytes the command wrote to stdout, counting any dropped by the cap."""
    stderr_bytes: int = 0

    @property
    def ok(self) -> bool:
        """True when the command ran and exited 0."""
        return self.exit_code == 0

    @property
    def output(self) -> str:
        """stdout then stderr, as an agent would read a terminal."""
        return self.stdout + self.stderr


@dataclass(frozen=True)
class PatchResult:
    """Outcome of `git apply` in the sandbox."""

    success: bool
    stdout: str
    stderr: str
    exit_code: int | None
    error: str | None = None


@dataclass(frozen=True)
class FileInfo:
    """One entry of a folder listing, in the published API's shape.

    `size` is `st_size`, a folder's too; `modified` is the sandbox's local time as
    `"%Y-%m-%dT%H:%M:%S"` (no zone, whole seconds), or None where a service leaves it out.
    """

    name: str
    type: str
    size: int
    modified: str | None = None


HTTP_ANSWER_OVERHEAD = 1024 * 1024
"""Bytes of an HTTP call's answer besides the base64 body: its headers as JSON (escaped, up to 6
bytes a character) and the other fields."""


@dataclass(frozen=True)
class HttpAnswer:
    """What a service inside a sandbox answered to `Sandbox.http`, checked on the host.

    `headers` maps lower-case names to values (the last of a repeated header wins; `raw_headers`
    has every line as sent, in order). `body` is at most the call's `max_bytes`; `truncated` says
    the service sent more.
    """

    status: int
    headers: dict[str, str]
    body: bytes
    truncated: bool = False
    duration: float = 0.0
    """Seconds the agent took, from connecting to the service to its answer's last byte read."""
    raw_headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @property
    def text(self) -> str:
        """The body as UTF-8 (undecodable bytes replaced)."""
        return _text(self.body)

    def json(self) -> Any:
        """The body parsed as JSON (ValueError when it is not, nested too deeply to parse included:
        the service is in the sandbox)."""
        try:
            return json.loads(self.body)
        except RecursionError:
            raise ValueError("the body is JSON nested too deeply to parse") from None


class Response(Protocol):
    """What a channel answers: an httpx.Response or a transport.Answer."""

    status_code: int

    @property
    def content(self) -> bytes: ...

    @property
    def text(self) -> str: ...

    @property
    def reason_phrase(self) -> str: ...

    def json(self) -> Any: ...


class Channel(Protocol):
    """Something that sends one call and answers (see `orchard.env.transport`)."""

    def request(self, call: Call) -> Response: ...

    def close(self) -> None: ...


class AsyncChannel(Protocol):
    def request(self, call: Call) -> Awaitable[Response]: ...

    async def aclose(self) -> None: ...


ANSWER_LIMIT = 4 * 1024 * 1024
"""Bytes the host reads of a small answer from an agent (JSON: health, listings, patch results)."""


@dataclass(frozen=True)
class Call:
    """One HTTP request and the function that turns its answer into a result.

    `parse` may return another `Call` to send next (a job not finished yet is polled that way).

    An agent is hostile (it runs in the sandbox), so the agent channels (`AgentChannel`,
    `AsyncAgentChannel`) bound what they read of its answer (the httpx channels honour `limit` and
    `sink` too when a call sets either, reading the body chunk by chunk):

    * `limit`: the most bytes of body the host accepts (None: `ANSWER_LIMIT`). An answer whose
      Content-Length is over it is refused before a byte of its body is read: the channel closes
      that connection and raises `TooLarge`, whose one-line message names the call, the size, the
      limit and `advice` (how to get the data anyway).
    * `sink`: a binary file the body of a successful answer (status < 400) is written into, in
      chunks, instead of being held in memory; that answer's `content` is then empty. An error
      answer is still read into `content` (under the same limit) for `raise_for_status`.

    * `agent_bound`: the limit is one an honest agent never passes (it cut the data to fit, as
      `http` does at `max_bytes`), so an answer over it is the agent's fault: `AgentError`, not
      `TooLarge`.

    Status and header lines are bounded too (`transport.MAX_HEADER_LINE`, `transport.MAX_HEADERS`).
    Every call of `AgentCalls` sets the limit that fits its route: `exec(max_output=...)` the JSON
    line plus both streams at their cap (`exec_limit`), `read_file(max_bytes=READ_LIMIT)`,
    `get_archive(sink, max_bytes=ARCHIVE_LIMIT)` (streamed into `sink`), the rest `ANSWER_LIMIT`.
    A malformed answer (missing keys, wrong types, lengths that do not add up) is an `AgentError`.
    """

    method: str
    path: str
    parse: Callable[[Response], Any]
    params: dict[str, Any] | None = None
    json: Any = None
    content: bytes | None = None
    timeout: float | None = None
    limit: int | None = None
    sink: IO[bytes] | None = None
    advice: str = ""
    agent_bound: bool = False


def raise_for_status(response: Response) -> None:
    """Turn an error answer of the agent or the service into Orchard's exceptions."""
    status = response.status_code
    if status < 400:
        return
    try:
        body = response.json()
        detail = body.get("detail")  # a 422's is FastAPI's list of problems; `message` has them in a line
        message = (detail if isinstance(detail, str) else body.get("message")) or body.get("error") or response.text
    except (ValueError, RecursionError, AttributeError):  # not JSON, nested too deeply, or not an object
        message = response.text or response.reason_phrase
    if not isinstance(message, str):
        message = str(message)
    if status in (401, 403):
        raise AuthError(message)
    if status == 404:
        raise NotFound(message)
    if status == 408:
        raise SandboxNotReady(message)
    if status == 503:
        raise Overloaded(message)
    if status == 409:
        raise Conflict(message)
    if status in (400, 405, 413, 422):
        raise InvalidRequest(message)
    if status == 507:
        raise SandboxError(message)
    # an agent's error relayed by the service already names its status: say it once
    raise AgentError(message if message.startswith("HTTP ") else f"HTTP {status}: {message}")


def check_command(command: str | Sequence[str]) -> str | list[str]:
    """A command is a string (run by a shell) or a list of strings (quoted, then run)."""
    if isinstance(command, str):
        return command
    if isinstance(command, Sequence) and command and all(isinstance(a, str) for a in command):
        return list(command)
    raise InvalidRequest("command must be a string or a non-empty list of strings")


_EXEC_FACTS: dict[str, Callable[[Any], bool]] = {
    "exit_code": lambda v: v is None or _is_int(v),
    "stdout_length": lambda v: _is_int(v) and v >= 0,
    "stderr_length": lambda v: _is_int(v) and v >= 0,
    "stdout_bytes": lambda v: _is_int(v) and v >= 0,
    "stderr_bytes": lambda v: _is_int(v) and v >= 0,
    "truncated": lambda v: isinstance(v, bool),
    "timed_out": lambda v: isinstance(v, bool),
    "duration": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "error": lambda v: v is None or isinstance(v, str),
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def split_exec_answer(body: bytes) -> tuple[dict[str, Any], bytes, bytes]:
    """The agent's answer to a command: its JSON line of facts, then raw stdout and stderr.

    The agent is hostile: a line that is not the documented facts, or lengths that do not add up
    to the body, raise `AgentError`.
    """
    line_end = body.find(b"\n", 0, EXEC_LINE_LIMIT)
    try:
        facts = json.loads(body[:line_end]) if line_end >= 0 else None
    except (ValueError, RecursionError):  # RecursionError: nested too deeply to parse
        facts = None
    if not isinstance(facts, dict):
        raise AgentError(f"the agent's answer to a command does not start with a JSON line of facts: {body[:80]!r}")
    wrong = [name for name, valid in _EXEC_FACTS.items() if name not in facts or not valid(facts[name])]
    if wrong:
        raise AgentError(f"the agent's answer to a command has missing or invalid {', '.join(wrong)}")
    stdout_end = line_end + 1 + facts["stdout_length"]
    if stdout_end + facts["stderr_length"] != len(body):
        raise AgentError(
            f"the agent's answer to a command claims {facts['stdout_length']} + {facts['stderr_length']}"
            f" bytes of output but holds {len(body) - line_end - 1}"
        )
    return facts, body[line_end + 1 : stdout_end], body[stdout_end:]


def http_content(
    json_value: Any, body: bytes | str | None, headers: dict[str, str] | None
) -> tuple[bytes | None, dict[str, str]]:
    """The body and headers of an HTTP call given `json=` or `body=` (not both): a JSON value is
    encoded, with `Content-Type: application/json` unless the headers name a type."""
    headers = dict(headers or {})
    if json_value is not None and body is not None:
        raise InvalidRequest("give json or body, not both")
    if json_value is not None:
        try:
            body = json.dumps(json_value).encode()
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(f"json is not JSON-serialisable: {exc}") from None
        if not any(name.lower() == "content-type" for name in headers):
            headers["Content-Type"] = "application/json"
    if isinstance(body, str):
        body = body.encode()
    if body is not None and not isinstance(body, bytes | bytearray | memoryview):
        raise InvalidRequest(f"body must be bytes or str, not {type(body).__name__}")
    return (None if body is None else bytes(body)), headers


def http_request(
    port: int,
    path: str,
    method: str,
    body: bytes | None,
    headers: dict[str, str] | None,
    timeout: float,
    max_bytes: int,
) -> dict[str, Any]:
    """The body of an HTTP call (the agent's `POST /http`, the service's `/sandboxes/{id}/http`),
    checked as the agent checks it, so a bad request fails here with `InvalidRequest`."""
    if not _is_int(port) or not 0 < port < 65536:
        raise InvalidRequest(f"port must be an integer from 1 to 65535, not {port!r}")
    if not isinstance(method, str) or method.upper() not in HTTP_METHODS:
        raise InvalidRequest(f"method must be one of {', '.join(HTTP_METHODS)}, not {method!r}")
    if not isinstance(path, str) or not path.startswith("/"):
        raise InvalidRequest(f"path must start with / (the service is always 127.0.0.1:port), not {path!r:.80}")
    if path.startswith("//"):
        raise InvalidRequest(
            f"path must not start with // (an authority: the service is always 127.0.0.1:port), not {path!r:.80}"
        )
    if len(path) > HTTP_MAX_PATH or not all("!" <= c <= "~" for c in path):
        raise InvalidRequest(
            f"path must be at most {HTTP_MAX_PATH} characters of printable ASCII, without spaces (percent-encode)"
        )
    if headers is not None and not isinstance(headers, dict):
        raise InvalidRequest("headers must be a dict of names to string values")
    for name, value in (headers or {}).items():
        if not isinstance(name, str) or not _is_token(name):
            raise InvalidRequest(f"header name {name!r:.80} is not an HTTP token")
        if name.lower() in HTTP_AGENT_HEADERS:
            raise InvalidRequest(f"{name} is set by the agent; leave it out of headers")
        if not isinstance(value, str) or any(c in value for c in "\r\n\0"):
            raise InvalidRequest(f"header {name} must be a string without CR, LF or NUL")
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= HTTP_MAX_TIMEOUT:
        raise InvalidRequest(f"timeout must be a number of seconds above 0, at most {HTTP_MAX_TIMEOUT:g}")
    if check_max_bytes(max_bytes) > HTTP_MAX_BYTES:
        raise InvalidRequest(f"max_bytes must be at most {HTTP_MAX_BYTES} ({HTTP_MAX_BYTES >> 20} MiB)")
    request: dict[str, Any] = {"port": port, "method": method.upper(), "path": path, "timeout": timeout}
    if headers:
        request["headers"] = dict(headers)
    if body is not None:
        request["body"] = base64.b64encode(body).decode()
    request["max_bytes"] = max_bytes
    return request


def http_answer(max_bytes: int) -> Callable[[Response], HttpAnswer]:
    """The reader of an HTTP call's answer: everything checked, nothing it claims trusted."""

    def read(response: Response) -> HttpAnswer:
        try:
            data = response.json()
        except (ValueError, RecursionError):  # RecursionError: nested too deeply to parse
            raise AgentError(f"the answer to an HTTP call is not JSON: {response.content[:80]!r}") from None
        if not isinstance(data, dict):
            raise AgentError("the answer to an HTTP call is not a JSON object")
        status, truncated, duration = data.get("status"), data.get("truncated"), data.get("duration")
        if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
            raise AgentError(f"the answer to an HTTP call has status {status!r:.40}, not an HTTP status (100 to 599)")
        if not isinstance(truncated, bool):
            raise AgentError(f"the answer to an HTTP call has truncated {truncated!r:.40}, not true or false")
        if not isinstance(duration, int | float) or isinstance(duration, bool) or not 0 <= duration < math.inf:
            raise AgentError(f"the answer to an HTTP call has duration {duration!r:.40}, not a number of seconds")
        pairs = _answer_headers(data.get("headers"))
        return HttpAnswer(
            status=status,
            headers={name.lower(): value for name, value in pairs},
            body=_answer_body(data.get("body"), max_bytes),
            truncated=truncated,
            duration=float(duration),
            raw_headers=pairs,
        )

    return read


def _answer_headers(headers: Any) -> tuple[tuple[str, str], ...]:
    """An answer's headers: a list of [name, value] pairs of strings, within the bounds."""
    if not isinstance(headers, list):
        raise AgentError("the answer to an HTTP call has headers that are not a list of [name, value] pairs")
    if len(headers) > HTTP_MAX_ANSWER_HEADERS:
        raise AgentError(f"the answer to an HTTP call has {len(headers)} headers, over {HTTP_MAX_ANSWER_HEADERS}")
    pairs, size = [], 0
    for pair in headers:
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(part, str) for part in pair)):
            raise AgentError(f"the answer to an HTTP call has a header that is not a [name, value] pair: {pair!r:.80}")
        name, value = pair
        if not _is_token(name) or any(c in value for c in "\r\n\0"):
            raise AgentError(f"the answer to an HTTP call has a malformed header: {name!r:.80}")
        size += len(name) + len(value) + 4
        if size > HTTP_MAX_HEAD_BYTES:
            raise AgentError(f"the answer to an HTTP call has over {HTTP_MAX_HEAD_BYTES} bytes of headers")
        pairs.append((name, value))
    return tuple(pairs)


def _answer_body(body: Any, max_bytes: int) -> bytes:
    """An answer's body: base64 of at most `max_bytes` (checked before it is decoded)."""
    if not isinstance(body, str):
        raise AgentError("the answer to an HTTP call has a body that is not a base64 string")
    if len(body) > _base64_size(max_bytes):
        raise AgentError(f"the answer to an HTTP call has a body over max_bytes={max_bytes}")
    try:
        data = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise AgentError("the answer to an HTTP call has a body that is not valid base64") from None
    if len(data) > max_bytes:
        raise AgentError(f"the answer to an HTTP call has a body of {len(data)} bytes, over max_bytes={max_bytes}")
    return data


def http_answer_json(answer: HttpAnswer) -> dict[str, Any]:
    """An answer in the wire shape both the agent and the service send."""
    return {
        "status": answer.status,
        "headers": [list(pair) for pair in answer.raw_headers],
        "body": base64.b64encode(answer.body).decode(),
        "truncated": answer.truncated,
        "duration": answer.duration,
    }


def _is_token(name: str) -> bool:
    return bool(name) and all(c in HTTP_TOKEN_CHARS for c in name)


TUNNEL_CALL_SECONDS = 10.0
"""How long `/listen` and `DELETE /listen` may take (the agent answers them at once)."""
TUNNEL_MAX_HEAD = 16 * 1024
"""Bytes of the agent's answer head to `/accept` (it sends about 90)."""
TUNNEL_MAX_HEADERS = 32


def check_port(port: Any, what: str = "port") -> int:
    if not _is_int(port) or not 0 < port < 65536:
        raise InvalidRequest(f"{what} must be an integer from 1 to 65535, not {port!r:.40}")
    return port


def tunnel_request(port: int, wait: float, auth: str, route: str = ACCEPT_ROUTE) -> bytes:
    """`POST /accept` (upgrade to `orchard-tunnel`): the next connection made to `port` in the
    sandbox, once one comes within `wait` seconds; `POST /connect`: a connection of the agent to
    `port`, made within `wait` seconds. The body names the port only: no address."""
    body = json.dumps({"port": check_port(port), "timeout": wait}).encode()
    head = (
        f"POST {route} HTTP/1.1\r\nHost: agent\r\nAuthorization: {auth}\r\nConnection: Upgrade\r\n"
        f"Upgrade: {TUNNEL_UPGRADE}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


def tunnel_answer(head: bytes, route: str = ACCEPT_ROUTE) -> tuple[int, int]:
    """The status of the agent's answer to `/accept` or `/connect` (its head, up to the blank
    line) and its body's length: 101 (the tunnel is open; it must name `Upgrade: orchard-tunnel`),
    204 (no connection came in time; no body), or an error with a JSON body. AgentError for
    anything else."""
    lines = head.split(b"\r\n")
    if len(head) > TUNNEL_MAX_HEAD or len(lines) > TUNNEL_MAX_HEADERS + 3:
        raise AgentError(
            f"the agent's answer to {route} has a head over {TUNNEL_MAX_HEAD} bytes or {TUNNEL_MAX_HEADERS} lines"
        )
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not (parts[1].isdigit() and len(parts[1]) == 3):
        raise AgentError(f"the agent's answer to {route} is not HTTP: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    status = int(parts[1])
    if status == 101 and headers.get("upgrade", "").lower() != TUNNEL_UPGRADE:
        raise AgentError(
            f"the agent switched {route} to {headers.get('upgrade', 'nothing')!r:.40}, not {TUNNEL_UPGRADE}"
        )
    if status in (101, 204):
        return status, 0
    length = headers.get("content-length", "")
    return status, int(length) if length.isdigit() and len(length) < 10 else 0


def command_text(command: str | Sequence[str]) -> str:
    """A command as one shell string: a list is quoted, never joined with bare spaces."""
    checked = check_command(command)
    return checked if isinstance(checked, str) else shlex.join(checked)


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _http_timeout(timeout: float | None) -> float | None:
    return None if timeout is None else timeout + 30.0


EXEC_LINE_LIMIT = 64 * 1024
"""Bytes of an exec answer besides the output itself (its JSON line, truncation and time-out marks)."""
READ_LIMIT = 64 * 1024 * 1024
"""Default `max_bytes` of `read_file`: whole files are held in memory; larger ones go by `download`."""
ARCHIVE_LIMIT = 1024 * 1024 * 1024
"""Default `max_bytes` of `download`: the archive's size and the total size of its files."""


def exec_limit(max_output: int | None) -> int:
    """The most bytes an exec answer may hold: its JSON line and both streams at their cap."""
    return EXEC_LINE_LIMIT + 2 * (DEFAULT_MAX_OUTPUT if max_output is None else max_output)


class AgentCalls:
    """Calls straight to a sandbox's exec agent (its own small protocol, see agent/protocol.py).

    Each call bounds the answer it accepts (`Call.limit`): the agent is hostile.
    """

    def exec(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        login_shell: bool = False,
        stdin: bytes | None = None,
        session: str | None = None,
        max_output: int | None = None,
    ) -> Call:
        """A command; `max_output` caps each stream in the agent (None: its 8 MiB) and bounds the answer."""
        if session is not None:
            return self._shell(
                command, session, timeout, max_output, cwd=cwd, env=env, login_shell=login_shell, stdin=stdin
            )
        body = {
            "command": check_command(command),
            "cwd": cwd,
            "env": env,
            "timeout": timeout,
            "login_shell": login_shell,
            "stdin": base64.b64encode(stdin).decode() if stdin is not None else None,
        }
        return self._command(EXEC_ROUTE, body, timeout, max_output)

    def _shell(self, command, session: str, timeout: float | None, max_output: int | None, **unsupported: Any) -> Call:
        """A command in a persistent shell session (its cwd and variables carry over)."""
        given = [name for name, value in unsupported.items() if value]
        if given:
            raise InvalidRequest(
                f"{', '.join(given)} cannot be set per command in a shell session; use cd/export in it"
            )
        body = {"command": command_text(command), "session": session, "timeout": timeout}
        return self._command(SHELL_ROUTE, body, timeout, max_output)

    def _command(self, route: str, body: dict[str, Any], timeout: float | None, max_output: int | None) -> Call:
        """The call running a command (`/exec` or `/shell`), its answer bounded by `max_output`."""
        if max_output is not None:
            body["max_output"] = max_output
        timeout_s = _http_timeout(timeout)
        return Call("POST", route, self._exec_result, json=body, timeout=timeout_s, limit=exec_limit(max_output))

    def close_session(self, session: str) -> Call:
        return Call("DELETE", SHELL_ROUTE, lambda r: r.json()["closed"], params={"session": session})

    @staticmethod
    def _exec_result(response: Response) -> ExecResult:
        facts, stdout, stderr = split_exec_answer(response.content)
        return ExecResult(
            exit_code=facts["exit_code"],
            stdout=_text(stdout),
            stderr=_text(stderr),
            duration=facts["duration"],
            timed_out=facts["timed_out"],
            truncated=facts["truncated"],
            error=facts["error"],
            raw_stdout=stdout,
            raw_stderr=stderr,
            stdout_bytes=facts["stdout_bytes"],
            stderr_bytes=facts["stderr_bytes"],
        )

    def read_file(self, path: str, max_bytes: int = READ_LIMIT) -> Call:
        """A whole file, in memory; over `max_bytes` it is refused with `TooLarge`."""
        return Call(
            "GET",
            FILES_ROUTE,
            lambda r: r.content,
            params={"path": _path(path)},
            limit=check_max_bytes(max_bytes),
            advice="pass a larger max_bytes, or use download() to stream it to disk",
        )

    def write_file(self, path: str, data: bytes, mode: int | None = None) -> Call:
        params = {"path": _path(path)}
        if mode is not None:
            params["mode"] = f"{mode:o}"
        return Call("PUT", FILES_ROUTE, lambda r: r.json()["size"], params=params, content=data)

    def list_files(self, path: str) -> Call:
        return Call("GET", FILES_LIST_ROUTE, _listing, params={"path": _path(path)})

    def get_archive(self, path: str, sink: IO[bytes], max_bytes: int = ARCHIVE_LIMIT) -> Call:
        """A tar of a file or folder, streamed into `sink`; over `max_bytes` it is refused with `TooLarge`."""
        return Call(
            "GET",
            ARCHIVE_ROUTE,
            lambda r: None,
            params={"path": _path(path)},
            limit=check_max_bytes(max_bytes),
            sink=sink,
            advice="pass a larger max_bytes to download()",
        )

    def put_archive(self, path: str, tar: bytes) -> Call:
        return Call("PUT", ARCHIVE_ROUTE, lambda r: r.json(), params={"path": _path(path)}, content=tar)

    def apply_patch(self, patch: str, timeout: float = 30.0) -> Call:
        body = {"patch": patch, "timeout": timeout}
        return Call("POST", APPLY_PATCH_ROUTE, _patch_result, json=body, timeout=_http_timeout(timeout))

    def listen(self, port: int) -> Call:
        """Make the agent listen on `127.0.0.1:port` in the sandbox, for `/accept` (idempotent);
        `Conflict` when something of the sandbox holds the port."""

        def listening(response: Response) -> bool:
            data = response.json()
            if data.get("port") != port or data.get("listening") is not True:
                raise AgentError(f"the agent's answer to POST /listen is not about port {port}: {data!r:.80}")
            return bool(data.get("created"))

        return Call("POST", LISTEN_ROUTE, listening, json={"port": check_port(port)}, timeout=TUNNEL_CALL_SECONDS)

    def unlisten(self, port: int) -> Call:
        """Stop listening on `port`: new connections are refused, those waiting reset."""
        return Call(
            "DELETE",
            LISTEN_ROUTE,
            lambda r: r.json()["closed"] is True,
            params={"port": check_port(port)},
            timeout=TUNNEL_CALL_SECONDS,
        )

    def http(
        self,
        port: int,
        path: str,
        *,
        method: str = "POST",
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
        max_bytes: int = HTTP_DEFAULT_MAX_BYTES,
    ) -> Call:
        """One HTTP request to `127.0.0.1:port` inside the sandbox, sent by its agent (`POST /http`).

        The answer is bounded by `max_bytes` (base64, plus its headers) and checked
        (`http_answer`); one over the bound is the agent's fault (`agent_bound`).
        """
        return Call(
            "POST",
            HTTP_ROUTE,
            http_answer(max_bytes),
            json=http_request(port, path, method, body, headers, timeout, max_bytes),
            timeout=_http_timeout(timeout),
            limit=_base64_size(max_bytes) + HTTP_ANSWER_OVERHEAD,
            agent_bound=True,
        )


class ServiceCalls:
    """The same operations through an `orchard up` service (the Orchard Env REST API)."""

    def __init__(self, sandbox_id: str):
        self.sandbox_id = check_sandbox_id(sandbox_id)
        self.prefix = f"/sandboxes/{sandbox_id}"

    def exec(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        login_shell: bool = False,
        stdin: bytes | None = None,
        session: str | None = None,
    ) -> Call:
        if stdin is not None:
            raise InvalidRequest("stdin is not part of the service API; pipe a file instead")
        # `concurrent`: as embedded, commands of one sandbox run side by side, not through its FIFO
        body: dict[str, Any] = {"command": check_command(command), "login_shell": login_shell, "wait": True}
        body["concurrent"] = True
        if session is not None:
            body["session"] = session
        if timeout is not None:
            body["timeout_seconds"] = timeout
        if cwd is not None:
            body["cwd"] = cwd
        if env:
            body["env"] = env
        wait = (timeout if timeout is not None else 300.0) + 30.0
        return Call("POST", f"{self.prefix}/exec", self._job, json=body, timeout=wait + 30.0)

    def _job(self, response: Response) -> ExecResult | Call:
        job = response.json()
        if job["status"] in ("queued", "running"):
            return Call(
                "GET",
                f"/jobs/{job['job_id']}/wait",
                self._job,
                params={"timeout": JOB_POLL_SECONDS},
                timeout=JOB_POLL_SECONDS + 30.0,
            )
        if job.get("rejected"):  # the agent refused the request itself, as AgentCalls raises
            raise InvalidRequest(job["error"])
        stdout, stderr = job["stdout"].encode(), job["stderr"].encode()
        return ExecResult(
            exit_code=job["exit_code"],
            stdout=job["stdout"],
            stderr=job["stderr"],
            duration=(job["completed_at"] or 0) - (job["started_at"] or 0),
            timed_out=bool(job.get("timed_out")),
            truncated=bool(job.get("truncated")),
            error=job["error"],
            raw_stdout=stdout,
            raw_stderr=stderr,
            stdout_bytes=job.get("stdout_bytes", len(stdout)),
            stderr_bytes=job.get("stderr_bytes", len(stderr)),
        )

    def close_session(self, session: str) -> Call:
        return Call("DELETE", f"{self.prefix}/shell", lambda r: r.json()["closed"], params={"session": session})

    def read_file(self, path: str, max_bytes: int = READ_LIMIT) -> Call:
        def content(response: Response) -> bytes:
            data = base64.b64decode(response.json()["content"])
            if len(data) > max_bytes:
                raise TooLarge(f"{path} is {len(data)} bytes, over max_bytes={max_bytes}; {advice}")
            return data

        advice = "pass a larger max_bytes, or use download() to stream it to disk"
        return Call(
            "GET",
            f"{self.prefix}/files",
            content,
            params={"path": _path(path)},
            limit=_base64_size(check_max_bytes(max_bytes)) + EXEC_LINE_LIMIT,
            advice=advice,
        )

    def write_file(self, path: str, data: bytes, mode: int | None = None) -> Call:
        body: dict[str, Any] = {"path": _path(path), "content": base64.b64encode(data).decode()}
        if mode is not None:
            body["mode"] = mode
        return Call("POST", f"{self.prefix}/files", lambda r: r.json()["size"], json=body)

    def list_files(self, path: str) -> Call:
        return Call("GET", f"{self.prefix}/files/list", _listing, params={"path": _path(path)})

    def get_archive(self, path: str, sink: IO[bytes], max_bytes: int = ARCHIVE_LIMIT) -> Call:
        return Call(
            "GET",
            f"{self.prefix}/archive",
            lambda r: None,
            params={"path": _path(path)},
            limit=check_max_bytes(max_bytes),
            sink=sink,
            advice="pass a larger max_bytes to download()",
        )

    def put_archive(self, path: str, tar: bytes) -> Call:
        return Call(
            "PUT",
            f"{self.prefix}/archive",
            lambda r: r.json(),
            params={"path": _path(path)},
            content=tar,
        )

    def apply_patch(self, patch: str, timeout: float = 30.0) -> Call:
        body = {"patch": patch, "timeout_seconds": timeout}
        return Call(
            "POST",
            f"{self.prefix}/apply_patch",
            _patch_result,
            json=body,
            timeout=_http_timeout(timeout),
        )

    def http(
        self,
        port: int,
        path: str,
        *,
        method: str = "POST",
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
        max_bytes: int = HTTP_DEFAULT_MAX_BYTES,
    ) -> Call:
        """The same request through the service (`POST /sandboxes/{id}/http`), checked the same way."""
        return Call(
            "POST",
            f"{self.prefix}/http",
            http_answer(max_bytes),
            json=http_request(port, path, method, body, headers, timeout, max_bytes),
            timeout=timeout + 60.0,  # the agent's own bound, then the service's hop
            limit=_base64_size(max_bytes) + HTTP_ANSWER_OVERHEAD,
            agent_bound=True,
        )


class ServiceSandboxes:
    """Lifecycle calls of the service: create, wait, delete, list, warm."""

    @staticmethod
    def create(spec: SandboxSpec, sandbox_id: str | None = None) -> Call:
        def created(response: Response) -> str:
            sandbox = response.json()
            if sandbox["status"] == "failed":
                raise SandboxError(sandbox.get("status_message") or "the sandbox failed to start")
            return check_sandbox_id(sandbox["sandbox_id"])  # it goes into URL paths: never a path of its own

        body = _sandbox_body(spec)
        if sandbox_id:
            body["sandbox_id"] = sandbox_id
        return Call("POST", "/sandboxes", created, json=body)

    @staticmethod
    def wait(sandbox_id: str, timeout: float) -> Call:
        def ready(response: Response) -> dict:
            sandbox = response.json()
            if sandbox["status"] == "failed":
                raise SandboxError(sandbox.get("status_message") or f"sandbox {sandbox_id} failed to start")
            return sandbox

        params = {"timeout": timeout}
        return Call("GET", f"/sandboxes/{sandbox_id}/wait", ready, params=params, timeout=timeout + 30)

    @staticmethod
    def delete(sandbox_id: str) -> Call:
        return Call("DELETE", f"/sandboxes/{check_sandbox_id(sandbox_id)}", lambda r: None)

    @staticmethod
    def list() -> Call:
        return Call("GET", "/sandboxes", lambda r: r.json()["sandboxes"])

    @staticmethod
    def warm(spec: SandboxSpec, size: int, drain: bool = False) -> Call:
        body = {**_sandbox_body(spec), "size": size}
        if drain:
            body["drain"] = True
        return Call("POST", "/pools", lambda r: r.json(), json=body)


def _sandbox_body(spec: SandboxSpec) -> dict[str, Any]:
    """The fields of a create (or pool) body that carry a spec, as the Orchard Env API names them."""
    body: dict[str, Any] = {
        "image": spec.image,
        "block_network": spec.network != "open",
        "network": spec.network,
        "ttl": math.ceil(spec.ttl),
    }
    if spec.cpu:
        body["cpu"] = str(spec.cpu)
    if spec.memory_bytes:
        body["memory"] = str(spec.memory_bytes)
    if spec.disk_bytes:
        body["disk"] = str(spec.disk_bytes)
    if spec.tmpfs:
        body["tmpfs"] = {path: str(size) for path, size in spec.tmpfs.items()}
    if spec.env:
        body["env"] = spec.env
    if spec.run_id:
        body["run_id"] = spec.run_id
    if spec.init is not None:
        body["init"] = spec.init
        body["init_timeout"] = spec.init_timeout
    if spec.tools:
        body["tools"] = True
    return body


def _base64_size(size: int) -> int:
    return (size + 2) // 3 * 4


def check_max_bytes(max_bytes: int) -> int:
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
        raise InvalidRequest(f"max_bytes must be a non-negative number of bytes, not {max_bytes!r}")
    return max_bytes


def _path(path: str) -> str:
    if not isinstance(path, str) or not path.strip():
        raise InvalidRequest("path must be a non-empty string (relative paths are under /workspace)")
    return path


def _listing(response: Response) -> list[FileInfo]:
    return [FileInfo(**entry) for entry in response.json()["files"]]


def _patch_result(response: Response) -> PatchResult:
    body = response.json()
    return PatchResult(
        success=body["success"],
        stdout=body["stdout"],
        stderr=body["stderr"],
        exit_code=body["exit_code"],
        error=body.get("error"),
    )


def send(channel: Channel, call: Call) -> Any:
    """Send a call (and any follow-up call its answer asks for) through a sync channel."""
    while True:
        try:
            answer = channel.request(call)
        except TooLarge as exc:
            if call.agent_bound:
                raise AgentError(f"the sandbox broke its bound: {exc}") from None
            raise
        raise_for_status(answer)
        result = parse(call, answer)
        if not isinstance(result, Call):
            return result
        call = result


async def asend(channel: AsyncChannel, call: Call) -> Any:
    """Send a call (and its follow-ups) through an async channel."""
    while True:
        try:
            answer = await channel.request(call)
        except TooLarge as exc:
            if call.agent_bound:
                raise AgentError(f"the sandbox broke its bound: {exc}") from None
            raise
        raise_for_status(answer)
        result = parse(call, answer)
        if not isinstance(result, Call):
            return result
        call = result


def parse(call: Call, answer: Response) -> Any:
    """`call.parse(answer)`; an answer not of the documented shape (a hostile agent's) is an
    `AgentError`: JSON nested too deeply to parse (`RecursionError`) too."""
    try:
        return call.parse(answer)
    except OrchardError:
        raise
    except (LookupError, TypeError, ValueError, AttributeError, RecursionError) as exc:
        raise AgentError(f"malformed answer to {call.method} {call.path}: {type(exc).__name__} {exc}"[:300]) from None
