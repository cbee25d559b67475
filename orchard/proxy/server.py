"""The proxy's server: an ASGI app (Starlette, the layer under FastAPI: one catch-all route needs
nothing more) that forwards to the upstream, and `Proxy`, it running.

    with Proxy("http://127.0.0.1:8000/v1", port=0, store=store) as proxy:   # serves in a thread
        OpenAI(base_url=proxy.tagged("my-run", "box-1"), api_key=proxy.keys.key).chat.completions.create(...)

Every request must carry a key the proxy answers (`Keys`: its own, or one granted for an attempt,
which binds the call to that attempt's run and sandbox), checked before its body is read; 401
without one. Requests go out (through `upstream.Pool`) with their body and query unchanged and
their headers less the hop-by-hop ones and every client key (the upstream's, `api_key`, when
given, goes in their place); answers come back unchanged, less hop-by-hop headers. A streamed answer
(`text/event-stream`) is relayed as the upstream sends it, never gathered first. What the proxy
itself refuses (a bad tag, an unknown path: 400, 404; a request body over `max_request` bytes:
413) and an upstream that cannot be reached (502), answers more than `max_answer` bytes (502) or
stays silent past the timeout (504) get an OpenAI-style error,
`{"error": {"message": ONE_LINE, "type": ...}}`; what the upstream answers, errors included,
passes through as it sent it. A stream that breaks off, goes over `max_answer`, carries an error
event or ends without its `[DONE]` ends for the client with an error event (the OpenAI client
raises it) and is recorded as a failed call: never as a clean one. So memory stays bounded by
the limits, whatever a sandbox sends or an upstream answers.

Two other APIs are spoken over the same upstream (`translate`): a call to `POST /v1/messages`
(Anthropic's Messages API) or `POST /v1/responses` (OpenAI's Responses API), tagged or not,
becomes the chat call it means, which goes to the upstream's `/v1/chat/completions` and is
recorded exactly as a native chat call (same key handling, bounds, timeouts and failures; the
client's query, such as Claude Code's `?beta=true`, is not forwarded). Its answer is translated
back: whole, or a stream event by event as the upstream's chunks arrive (`_relay` through the
translator), and every error, the proxy's own and the upstream's, in the client's API's shape
(Anthropic's `{"type": "error", "error": {...}}` and its `error` event; the Responses API's
`response.failed`). `POST /v1/messages/count_tokens` gets an estimate, the upstream not asked."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from orchard.errors import ConfigError, InvalidRequest
from orchard.proxy import MAX_ANSWER_MIB, MAX_REQUEST_MIB, translate
from orchard.proxy.recorder import CHAT, Call, Recorder, run_id_of
from orchard.proxy.upstream import Answer, Pool, TimedOut, TooLarge, Unreachable, UpstreamError
from orchard.store import Store

DEFAULT_PORT = 8009
EXAMPLE = "http://127.0.0.1:8000/v1"
TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A run or sandbox tag: a safe id."""
RECORDED = {"/v1/chat/completions", "/v1/completions"}
"""The POST paths forwarded and recorded; `GET /v1/models[/ID]` is forwarded only."""
TRANSLATED = {translate.MESSAGES, translate.RESPONSES}
"""The POST paths of the other APIs: each call translated to a chat call, forwarded and recorded as one."""
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers"}
    | {"transfer-encoding", "upgrade", "content-length", "host", "accept-encoding"}
)
"""Headers that describe one connection, not the message, and those the proxy sets itself (it asks
for an uncompressed answer, to read it for the record; bodies pass as they are, encoded or not)."""
ANSWER_DROPPED = HOP_BY_HOP | {"date", "server"}
"""Upstream answer headers not passed on (uvicorn sends its own date and server)."""
GRACE_SECONDS = 1
"""At Ctrl-C or SIGTERM, how long answers still streaming may take to finish."""


def check_tag(value: str, what: str) -> str:
    if not TAG.fullmatch(value):
        raise InvalidRequest(
            f"bad {what} tag {value!r}: use letters, digits, '.', '_' and '-' (at most 128, the first a letter or digit)"
        )
    return value


def parse_target(path: str, default_run: str) -> tuple[str, str | None, str]:
    """(run, sandbox, API path) of a request's path: `/v1/...`, `/t/RUN/v1/...` or `/t/RUN/SANDBOX/v1/...`."""
    parts = path.strip("/").split("/")
    if parts[0] != "t":
        return default_run, None, path
    for tags in (1, 2):
        rest = parts[1 + tags :]
        if len(parts) > 1 + tags and rest[0] == "v1":
            tagged = [
                check_tag(value, what) for value, what in zip(parts[1 : 1 + tags], ("run", "sandbox"), strict=False)
            ]
            return tagged[0], tagged[1] if tags == 2 else None, "/" + "/".join(rest)
    raise InvalidRequest(f"no API path in {path!r}: tag calls as /t/RUN/v1/... or /t/RUN/SANDBOX/v1/...")


def upstream_base(url: str) -> str:
    """The upstream's address without its trailing `/v1` (the proxy adds the API path back)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (a port that is not a number raises here)
    except ValueError as exc:
        raise ConfigError(f"--upstream {url!r} is not a URL ({exc}); give the model server's, e.g. {EXAMPLE}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"--upstream {url!r}: give the model server's http(s) URL, e.g. {EXAMPLE}")
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/").removesuffix("/v1"), "", ""))


def _models(api: str) -> bool:
    """Whether a GET path is the model list or one model (whose id may hold `/`, never `.` or `..`:
    the upstream's key must not reach its other routes through the proxy)."""
    if api == "/v1/models":
        return True
    model = api.removeprefix("/v1/models/").split("/")
    return api.startswith("/v1/models/") and all(part not in ("", ".", "..") for part in model)


def _error(status: int, message: str, kind: str, dialect: str | None = None) -> Response:
    """The proxy's own error, in the shape of the client's API (`translate.dialect`)."""
    if dialect is not None:
        return JSONResponse(translate.error_body(dialect, status, message, kind), status_code=status)
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def _answered(content: bytes, status: int, headers: list[tuple[str, str]], kind: type[Response] = Response) -> Response:
    """A response of the upstream's status and headers (less those of its connection)."""
    response = kind(content, status_code=status)
    response.raw_headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers if k not in ANSWER_DROPPED]
    return response


KEY_HEADERS = frozenset({"authorization", "x-api-key", "api-key"})
"""Where clients put their key: OpenAI's `Authorization: Bearer`, Anthropic's `x-api-key`, Azure's
`api-key`. The proxy reads its own key there and forwards none of them."""


class Keys:
    """The keys the proxy answers: its own (any run and sandbox the path names), and keys granted
    for one run and sandbox (an attempt's), which record every call under those, whatever the
    path says, until revoked."""

    def __init__(self, key: str):
        self.key = key
        self.granted: dict[str, tuple[str, str | None]] = {}
        self.routes: dict[str, str] = {}
        """A granted key's path on the upstream, where it has one of its own."""

    def grant(self, run: str, sandbox: str | None = None, *, route: str | None = None) -> str:
        """A new key whose calls are recorded under `run` (and `sandbox`), and go to the upstream
        under the path prefix `/route` when given (an attempt's own model: `orchard.agents.external`)."""
        import secrets

        check_tag(run, "run")
        if sandbox is not None:
            check_tag(sandbox, "sandbox")
        if route is not None:
            check_tag(route, "route")
        key = "sk-orchard-" + secrets.token_urlsafe(24)
        self.granted[key] = (run, sandbox)
        if route is not None:
            self.routes[key] = route
        return key

    def route(self, headers: list[tuple[bytes, bytes]]) -> str:
        """The upstream path prefix of a request's granted key ('' for none)."""
        return next(("/" + self.routes[sent] for sent in _sent_keys(headers) if sent in self.routes), "")

    def revoke(self, key: str) -> None:
        self.granted.pop(key, None)
        self.routes.pop(key, None)

    def tags(self, headers: list[tuple[bytes, bytes]]) -> tuple[str, str | None] | bool:
        """For a request's headers: the tags its granted key binds it to, True for the proxy's own
        key, False for none (or an unknown one)."""
        import hmac

        for sent in _sent_keys(headers):
            if hmac.compare_digest(sent.encode(), self.key.encode()):
                return True
            if sent in self.granted:
                return self.granted[sent]
        return False


def _sent_keys(headers: list[tuple[bytes, bytes]]) -> Iterator[str]:
    """The keys a request carries, in any of `KEY_HEADERS` (a `Bearer ` prefix taken off)."""
    for name, value in headers:
        if name.decode("latin-1").lower() in KEY_HEADERS:
            sent = value.decode("latin-1").strip()
            yield sent[7:].strip() if sent[:7].lower() == "bearer " else sent


def create_app(
    upstream: str,
    recorder: Recorder,
    *,
    keys: Keys,
    api_key: str | None = None,
    timeout: float = 600.0,
    max_request: int = MAX_REQUEST_MIB << 20,
    max_answer: int = MAX_ANSWER_MIB << 20,
) -> Starlette:
    """The proxy as an ASGI app; it closes `recorder` when it shuts down (so a SIGTERM still
    leaves every answered call written)."""
    pool = Pool(upstream_base(upstream), timeout=timeout)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await recorder.attach()
        try:
            yield
        finally:
            pool.close()
            await recorder.aclose()

    def headers_out(incoming: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
        dropped = HOP_BY_HOP | KEY_HEADERS
        kept = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in incoming if k.decode("latin-1") not in dropped]
        kept.append(("accept-encoding", "identity"))  # bodies are read for the record: plain, not compressed
        if api_key:
            kept.append(("authorization", f"Bearer {api_key}"))
        return kept

    async def forward(request: Request) -> Response:
        dialect = translate.dialect(request.url.path)

        def refuse(status: int, message: str, kind: str) -> Response:
            return _error(status, message, kind, dialect)

        allowed = keys.tags(request.headers.raw)  # before a byte of the body is read
        if allowed is False:
            return refuse(
                401,
                "no valid key: send the proxy's key as Authorization: Bearer KEY (or x-api-key)",
                "authentication_error",
            )
        try:
            run, sandbox, api = parse_target(request.url.path, recorder.default_run)
        except InvalidRequest as exc:
            return refuse(400, str(exc), "invalid_request_error")
        if allowed is not True:  # an attempt's key: its own tags, whatever the path says
            run, sandbox = allowed
        post = request.method == "POST"
        recorded = post and (api in RECORDED or api in TRANSLATED)
        counted = post and api == translate.COUNT_TOKENS
        if not (recorded or counted or (request.method == "GET" and _models(api))):
            return refuse(404, f"orchard proxy does not forward {request.method} {api}", "invalid_request_error")
        body = await _bounded_body(request, max_request)
        if body is None:
            return refuse(413, f"the request's body is over the proxy's limit of {max_request} bytes", "too_large")
        query = request.url.query
        translation = None
        try:
            if counted:  # an estimate, the upstream not asked
                return JSONResponse(translate.count_tokens(body))
            if api in TRANSLATED:  # recorded and forwarded as the chat call it becomes
                translation = translate.translated(api, body)
                api, body, query = CHAT, translation.body(), ""
        except InvalidRequest as exc:
            return refuse(400, str(exc), "invalid_request_error")
        started, clock = time.time(), time.perf_counter()

        def call(status: int | None, answer: bytes, stream: bool, error: str | None = None) -> Call:
            return Call(run, sandbox, api, body, started, time.perf_counter() - clock, status, answer, stream, error)

        def failed(status: int, exc: Exception, kind: str) -> Response:
            if recorded:
                recorder.submit(call(None, b"", False, str(exc)))
            return refuse(status, str(exc), kind)

        try:
            target = keys.route(request.headers.raw) + api + (f"?{query}" if query else "")
            answer = await pool.request(request.method, target, headers_out(request.headers.raw), body)
        except InvalidRequest as exc:
            return refuse(400, str(exc), "invalid_request_error")
        except TimedOut as exc:
            return failed(504, exc, "upstream_timeout")
        except Unreachable as exc:
            return failed(502, exc, "upstream_unreachable")
        streamed = answer.header("content-type").startswith("text/event-stream") and answer.status < 400
        if streamed and (translation is None or translation.stream):
            events = translation.events() if translation is not None else None
            relayed = _relay(answer, call, recorder if recorded else None, max_answer, events)
            return _answered(relayed, answer.status, answer.headers, StreamingResponse)  # type: ignore[arg-type]
        try:
            content = await answer.read(max_answer)
        except TooLarge as exc:
            return failed(502, exc, "upstream_too_large")
        except (TimedOut, Unreachable) as exc:
            return failed(504 if isinstance(exc, TimedOut) else 502, exc, "upstream_unreachable")
        finally:
            answer.aclose()
        if recorded:
            recorder.submit(call(answer.status, content, streamed))
        if translation is not None:
            status, content, kind = translation.respond(answer.status, content, streamed)
            return Response(content, status_code=status, media_type=kind)
        return _answered(content, answer.status, answer.headers)

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])], lifespan=lifespan)


async def _bounded_body(request: Request, limit: int) -> bytes | None:
    """The request's body, or None once it is over `limit` bytes (read no further)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            return None
    return bytes(body)


def _stream_error(message: str) -> bytes:
    """An SSE error event, as OpenAI's API ends a stream that failed."""
    return b"data: " + json.dumps({"error": {"message": message, "type": "upstream_error"}}).encode() + b"\n\n"


async def _relay(
    answer: Answer, call: Any, recorder: Recorder | None, limit: int, events: translate.Events | None = None
) -> AsyncIterator[bytes]:
    """The upstream's chunks as they come, at most `limit` bytes of them (through `events`, for a
    client of another API: its events for them). The call is handed to the recorder before the chunk
    holding `[DONE]` is passed on, so a client's next request finds this one recorded first; a
    stream that fails is recorded failed and ends with an error event."""
    whole = bytearray()  # one buffer, not pieces and their join: memory stays near `limit`
    size, tail, error, ended, recorded = 0, b"", None, False, recorder is None
    try:
        async for chunk in answer.chunks():
            size += len(chunk)
            if size > limit:
                error = f"the upstream's answer is over the proxy's limit of {limit} bytes"
                break
            whole += chunk
            seen = tail + chunk
            if b'data: {"error"' in seen:
                error = "the upstream sent an error in its stream"
            if not ended and b"[DONE]" in seen:
                ended = True
                if not recorded and error is None:
                    recorded, data, whole = True, bytes(whole), bytearray()  # what follows [DONE] is not recorded
                    recorder.submit(call(answer.status, data, True))  # type: ignore[union-attr]
                    del data
            tail = chunk[-16:]
            out = chunk if events is None else events.feed(chunk)
            if out:
                yield out
        if not ended and error is None:
            error = "the upstream's stream ended before its [DONE]"
    except UpstreamError as exc:
        error = f"the stream broke off: {exc}"
    except BaseException:  # cancelled: the client went away, or the proxy is stopping
        error = "the stream was cut before it ended (the client went away, or the proxy stopped)"
        raise
    finally:
        answer.aclose()
        if not recorded:
            data, whole = bytes(whole), bytearray()  # one copy alive at a time
            recorder.submit(call(answer.status, data, True, error))  # type: ignore[union-attr]
            del data
    if error is not None and not ended:
        yield _stream_error(error) if events is None else events.fail(error)


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket listening on host:port, or one line saying why not."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        hint = "; another process holds it: choose another --port" if exc.errno == 98 else ""
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}{hint}") from None
    except (OverflowError, TypeError) as exc:  # a port outside 0-65535
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc}") from None
    return sock


class Unrecorded(Recorder):
    """A recorder that keeps nothing (`Proxy(record=False)`)."""

    def __init__(self, run: str):  # no store, no process
        self.default_run = run

    async def attach(self) -> None:
        pass

    def submit(self, call: Call) -> None:
        pass

    async def aclose(self) -> None:
        pass

    def close(self) -> None:
        pass

    def flush(self) -> None:
        pass


class Proxy:
    """The proxy, its socket bound and its store open: `serve()` runs it in this thread until
    Ctrl-C or `stop()`; as a context manager it serves in a thread, stopped when the block ends."""

    def __init__(
        self,
        upstream: str,
        *,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        api_key: str | None = None,
        run: str = "default",
        store: Store | None = None,
        timeout: float = 600.0,
        max_request: int = MAX_REQUEST_MIB << 20,
        max_answer: int = MAX_ANSWER_MIB << 20,
        key: str | None = None,
        record: bool = True,
    ):
        """`key`: what clients must send (a new random one when none is given: `self.keys.key`);
        `api_key`: the upstream's, sent in its place; `record=False`: no record of calls (its
        callers keep their own: an attempt's episode)."""
        import secrets

        import uvicorn

        try:
            check_tag(run, "run")
        except InvalidRequest as exc:
            raise ConfigError(f"--run: {exc}") from None
        self.upstream = upstream_base(upstream) + "/v1"
        self.run_id = run_id_of(run)
        self.socket = listening_socket(host, port)
        self.host, self.port = host, self.socket.getsockname()[1]
        try:
            self.recorder = Recorder(store, run).start() if record else Unrecorded(run)
        except BaseException:
            self.socket.close()
            raise
        self.keys = Keys(key or "sk-orchard-" + secrets.token_urlsafe(24))
        app = create_app(
            upstream,
            self.recorder,
            keys=self.keys,
            api_key=api_key,
            timeout=timeout,
            max_request=max_request,
            max_answer=max_answer,
        )
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            proxy_headers=False,
            timeout_keep_alive=150,
            timeout_graceful_shutdown=GRACE_SECONDS,
        )
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The base URL clients take (untagged): `http://HOST:PORT/v1`."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def tagged(self, run: str, sandbox: str | None = None) -> str:
        """The base URL that tags calls with `run` (and `sandbox`)."""
        return self.url.removesuffix("/v1") + "/t/" + "/".join([run, *([sandbox] if sandbox else [])]) + "/v1"

    def serve(self) -> None:
        try:
            self.server.run(sockets=[self.socket])
        finally:
            self.socket.close()
            self.recorder.close()

    def stop(self) -> None:
        self.server.should_exit = True

    def flush(self) -> None:
        """Wait until every call answered so far is in the store."""
        self.recorder.flush()

    def start(self) -> Proxy:
        """Serve in a thread of its own (a daemon: it ends with the process unless stopped)."""
        self._thread = threading.Thread(target=self.serve, name="orchard-proxy", daemon=True)
        self._thread.start()
        return self

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._thread is not None:
            self._thread.join(timeout=30)
