"""The runtime of Orchard's offline web sites: the `Site` base class, its HTTP server, and the host's replay.

A site is a small web app, one module holding one `Site` subclass (`examples/gui/sites/shop.py`):
pages rendered on the server as plain HTML (a little inline CSS, no scripts, nothing fetched from
elsewhere), forms that post, and records in named collections, made from a task's fixtures (its
`data`) and changed only by requests. A site is deterministic: the same data and the same requests
give the same pages, ids and state (no clock, no randomness: "today" comes from the data, ids and
codes from a counter), and no cookie or session carries state, so the request alone says what it
does. One site therefore serves twice: inside a task's sandbox, behind this file's server, where an
agent works it through a browser; and on the host, where the grade replays the server's log into a
fresh instance (`replay`) and checks the state that comes out. The sandbox's word on the state is
never taken.

    PYTHON -S site.py SITE_FILE --data DATA.json --port 8000 [--token-file FILE] [--ready READY_FILE]

serves the site SITE_FILE defines, made from DATA.json (a JSON object), on 127.0.0.1:PORT only (the
host reaches it through the exec agent), and writes the port to READY_FILE once it listens (PORT 0
picks a free one). Orchard's own routes, `GET /_orchard/log` (`{"calls": [...]}`: every logged
request, in order, what the host replays), `GET /_orchard/health` and `GET /_orchard/state` (what
the sandbox's site holds, for people debugging a task; no grade reads it), answer only a request
whose `X-Orchard-Token` header is the token, and 403 otherwise. The token is read from the
`--token-file`, which is then deleted, so that it is in neither the server's command line nor its
environment, both of which a browser in the same sandbox could open as `file:///proc/PID/cmdline`
and `environ`; without one, from `ORCHARD_SITE_TOKEN`, which is then removed from `os.environ`
(but stays in the process's first environment, which `/proc/PID/environ` shows).

Logged: every POST, and every GET of a route marked `changes=True`, as `{"endpoint": path,
"method", "query", "request_body", "status"}`. `request_body` is the form for a POST and the query
for a GET (what a `called` check matches); `status` is the answer's, except that a redirect (the
post/redirect/get answer to a change that worked) is logged as 200, which the check language counts
as done; a refused change answers 4xx, never a redirect. The log holds at most `MAX_LOG` entries and
`MAX_LOG_BYTES` of JSON: past that, a request that may change state answers 429 and is neither
handled nor logged, so the log stays exactly what the site did.

Bounds on what the browser sends: a request line of `MAX_URL` bytes (414), a head of `MAX_HEAD`
(431), a body of `MAX_BODY` (413), `MAX_FIELDS` form or query fields (400), forms urlencoded only
(415), no chunked bodies (411).

Standard library only. In the sandbox PYTHON is the bundle's interpreter
(`orchard.env.bundle.sandbox_python`), so the image needs no Python of its own, and the HTTP layer,
`orchard/env/sandboxed/httpd.py`, lies beside this file. A site module may import what the bundle
carries of the standard library (`orchard.env.bundle.SERVER_MODULES` and what they import: `re`,
`datetime`, `json`, `html`, `math`, ...); another is missing there, and the site does not start. It
imports what it needs of this file with `from orchard.recipes.gui.site import ...`; when this file runs as
the server it registers itself under that name first, so the same line works in the sandbox, where
only this file, its HTTP layer and the site's are copied, and on the host.
"""

from __future__ import annotations

import copy
import json
import os
import socketserver
import sys
import threading
from _operator import _compare_digest  # hmac's, without the import of hashlib (and libcrypto) hmac makes
from urllib.parse import parse_qsl, quote, unquote

try:
    from orchard.env.sandboxed import httpd
except ImportError:  # in the sandbox, where the module lies beside this file
    import httpd  # type: ignore[no-redef]

MAX_URL = 8 * 1024
MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024
MAX_FIELDS = 200
MAX_LOG = 2000
"""Logged requests the server keeps and a replay accepts."""
MAX_LOG_BYTES = 8 << 20
"""JSON bytes of the logged entries (the log's answer is this and a few bytes more)."""
MAX_RECORDS = 500
"""Records one collection may hold: creating one more is refused (`Site.room`)."""
TOKEN_HEADER = "X-Orchard-Token"
TOKEN_ENV = "ORCHARD_SITE_TOKEN"
"""Where the server finds its token when no `--token-file` names one."""


class Request:
    """One request as a site sees it: `query` and `form` map a field to its value, or to the list of
    its values when it was sent more than once."""

    __slots__ = ("form", "method", "path", "query")

    def __init__(self, method: str, path: str, query: dict | None = None, form: dict | None = None) -> None:
        self.method, self.path = method, path
        self.query, self.form = dict(query or {}), dict(form or {})

    def value(self, name: str, default: str = "") -> str:
        """The field's value (its first, when it was sent more than once), from the form of a POST
        or the query of a GET, stripped of surrounding spaces."""
        found = (self.form if self.method == "POST" else self.query).get(name, default)
        return (found[0] if found else default).strip() if isinstance(found, list) else str(found).strip()


class Response:
    """What a site answers: an HTML page (or another `content_type`), or a redirect to `location`."""

    __slots__ = ("body", "content_type", "location", "status")

    def __init__(
        self, status: int = 200, body: str = "", content_type: str = "text/html; charset=utf-8", location: str = ""
    ) -> None:
        self.status, self.body, self.content_type, self.location = status, body, content_type, location

    @classmethod
    def redirect(cls, location: str) -> Response:
        """303 See Other: the browser GETs `location` (post/redirect/get: a reload never posts twice)."""
        return cls(303, "", location=quote(location, safe="/?=&%:#+-._~"))

    @property
    def logged(self) -> int:
        """The status the log keeps: 200 for a redirect (a change that worked), else the answer's."""
        return 200 if 300 <= self.status < 400 else self.status


class Refused(Exception):
    """A request a site turns down (`status`, a 4xx, and a message for the page)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def route(method: str, pattern: str, *, changes: bool = False):
    """Marks a site's method as the handler of `method` on `pattern` (`/product/{id}`: a `{name}`
    segment is passed as the keyword `name`, decoded). A POST may change state, so is logged; a GET
    is logged too when `changes` says it may (a link that removes a cart line)."""

    def mark(handler):
        handler.route = (method.upper(), [s for s in pattern.strip("/").split("/") if s], changes)
        return handler

    return mark


def esc(value: object) -> str:
    """`value` as text safe inside HTML and attribute values."""
    return (
        str(value)
        .replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace('"', "&quot;")
        .replace("'", "&#x27;")
    )


def money(amount: float) -> str:
    return f"${amount:,.2f}"


CSS = """
*{box-sizing:border-box}
body{margin:0;font:16px/1.5 "DejaVu Sans",Arial,sans-serif;color:#1d2329;background:#f5f6f8}
header{display:flex;align-items:center;gap:24px;padding:12px 32px;background:#23395d;color:#fff}
header a{color:#fff}
.brand{font-size:22px;font-weight:bold;text-decoration:none}
header form{display:flex;gap:6px;margin:0}
header input{width:280px}
header nav{margin-left:auto;display:flex;gap:18px}
main{max-width:980px;margin:0 auto;padding:16px 32px 48px}
h1{font-size:26px;margin:12px 0 16px}
h2{font-size:20px;margin:20px 0 10px}
a{color:#1a56b8}
label{display:block;font-weight:bold;margin-bottom:4px}
.field{margin-bottom:14px}
.choice{display:flex;align-items:center;gap:8px;font-weight:normal;margin:4px 0}
input,select,textarea{font:inherit;padding:6px 8px;border:1px solid #8a94a0;border-radius:4px;background:#fff}
input[type=radio],input[type=checkbox]{width:18px;height:18px}
input[type=number]{width:90px}
.row{display:flex;gap:24px;flex-wrap:wrap;align-items:flex-start}
.row .error{max-width:360px}
.columns{display:grid;grid-template-columns:3fr 2fr;gap:32px;align-items:start}
textarea{width:100%}
button{font:inherit;font-weight:bold;padding:8px 18px;border:0;border-radius:4px;background:#1a56b8;color:#fff;cursor:pointer}
button.danger{background:#b3261e}
.invalid{border-color:#b3261e;border-width:2px}
.hint{color:#5b6573;font-size:14px}
.error{color:#b3261e;font-weight:bold;margin:4px 0 0}
.errors{border:2px solid #b3261e;background:#fdecea;padding:10px 16px;margin-bottom:16px;border-radius:4px}
.notice{border:2px solid #2e7d32;background:#e8f5e9;padding:10px 16px;margin-bottom:16px;border-radius:4px}
.grid{display:grid;grid-template-columns:repeat(3,1fr);gap:16px}
.card{background:#fff;border:1px solid #d5dae0;border-radius:6px;padding:12px 16px}
.inline{display:inline-flex;gap:6px;align-items:center;margin:0}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{border:1px solid #d5dae0;padding:6px 10px;text-align:left;vertical-align:middle}
.price{font-weight:bold}
"""


class Site:
    """One web app: its pages (methods marked with `route`), its records (`collections`, from the
    data's lists of the same names, each record a JSON object), and the rules that change them.

    Subclasses set `name` (the service a `state` check names), `title` (the header's; the data's
    `title` overrides it), `collections`, and `search` (the path of the header's search box, or
    empty for none), and override `nav` for the header's links."""

    name = ""
    title = ""
    collections: tuple = ()
    search = ""
    search_hint = "Search"
    routes: list = []

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        found = {}
        for klass in reversed(cls.__mro__):
            for attr, handler in vars(klass).items():
                if callable(handler) and hasattr(handler, "route"):
                    found[attr] = handler.route
        cls.routes = [(method, segments, changes, attr) for attr, (method, segments, changes) in found.items()]

    def __init__(self, data: dict) -> None:
        if not isinstance(data, dict):
            raise ValueError(f"a site's data is a JSON object, not {type(data).__name__}")
        self.data = copy.deepcopy(data)
        self.records: dict = {}
        for collection in self.collections:
            records = self.data.get(collection, [])
            if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
                raise ValueError(f"{self.name}'s data: {collection!r} is a list of objects")
            self.records[collection] = records
        self.counter = 0

    # What the grade reads.

    def state(self) -> dict:
        """`{collection: [records]}`, a copy."""
        return copy.deepcopy(self.records)

    # Dispatch.

    def route_for(self, method: str, path: str) -> tuple:
        """(handler name, params, changes) of the route for `method` on `path`; (None, {}, False) when
        there is none, with params `{"allowed": True}` when another method has one."""
        parts = [s for s in path.strip("/").split("/") if s]
        other = False
        for want, segments, changes, attr in self.routes:
            if len(segments) != len(parts):
                continue
            params = {}
            for segment, part in zip(segments, parts):  # noqa: B905 (`strict` is 3.10's; the lengths are equal)
                if segment.startswith("{") and segment.endswith("}"):
                    params[segment[1:-1]] = part
                elif segment != part:
                    break
            else:
                if want == method:
                    return attr, params, changes
                other = True
        return None, {"allowed": other}, False

    def changes(self, request: Request) -> bool:
        """Whether `request` may change state, so is logged: a POST, or a GET its route marks."""
        if request.method == "POST":
            return True
        attr, _, changes = self.route_for(request.method, request.path)
        return bool(attr and changes)

    def handle(self, request: Request) -> Response:
        """The answer to `request`: its route's, a 404 or 405 page, or a 4xx page for a `Refused`."""
        attr, params, _ = self.route_for(request.method, request.path)
        if attr is None:
            if params["allowed"]:
                return self.error(405, f"{request.path} does not take a {request.method}.")
            return self.error(404, f"There is no page at {request.path}.")
        try:
            return getattr(self, attr)(request, **params)
        except Refused as refused:
            return self.error(refused.status, str(refused))

    # Helpers for subclasses.

    def new_id(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.counter:04d}"

    def room(self, collection: str) -> None:
        """Refused (422) when `collection` holds `MAX_RECORDS` already: a site stays small to replay."""
        if len(self.records[collection]) >= MAX_RECORDS:
            raise Refused(422, f"This site holds at most {MAX_RECORDS} {collection}.")

    def find(self, collection: str, value: str, key: str = "id") -> dict | None:
        for record in self.records[collection]:
            if str(record.get(key)) == value:
                return record
        return None

    def nav(self) -> list:
        """The header's links, `[(href, text)]`."""
        return []

    def page(self, heading: str, content: str, *, status: int = 200, query: str = "", title: str = "") -> Response:
        """A whole page: the header (the site's name, its search box, its links), then `heading` and
        `content` (HTML)."""
        site = esc(self.data.get("title") or self.title)
        search = ""
        if self.search:
            search = (
                f'<form method="get" action="{self.search}" role="search">'
                f'<input type="search" id="q" name="q" value="{esc(query)}" placeholder="{esc(self.search_hint)}"'
                f' aria-label="{esc(self.search_hint)}"><button type="submit" id="search-button">Search</button></form>'
            )
        links = "".join(f'<a href="{esc(href)}">{esc(text)}</a>' for href, text in self.nav())
        body = (
            f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{esc(title or heading)} - {site}</title><style>{CSS}</style></head><body>"
            f'<header><a class="brand" href="/">{site}</a>{search}<nav>{links}</nav></header>'
            f"<main><h1>{esc(heading)}</h1>{content}</main></body></html>"
        )
        return Response(status, body)

    def error(self, status: int, message: str) -> Response:
        heading = {404: "Page not found", 405: "Not allowed"}.get(status, "Something is wrong")
        return self.page(
            heading, f'<p class="errors">{esc(message)}</p><p><a href="/">Back to the start page</a></p>', status=status
        )


# Form markup, the same on every site: a label above each field, its error below it.


def errors_box(errors: dict) -> str:
    """The list of what is wrong with a form, above it, or nothing."""
    if not errors:
        return ""
    items = "".join(f"<li>{esc(message)}</li>" for message in errors.values())
    return f'<div class="errors" role="alert"><strong>Please fix the following:</strong><ul>{items}</ul></div>'


def _error(errors: dict, name: str) -> str:
    return f'<p class="error" id="{esc(name)}-error">{esc(errors[name])}</p>' if errors.get(name) else ""


def text_field(
    label: str,
    name: str,
    value: object = "",
    *,
    errors: dict | None = None,
    kind: str = "text",
    hint: str = "",
    size: int = 30,
) -> str:
    errors = errors or {}
    invalid = ' class="invalid" aria-invalid="true"' if errors.get(name) else ""
    hint_html = f' <span class="hint">{esc(hint)}</span>' if hint else ""
    return (
        f'<div class="field"><label for="{esc(name)}">{esc(label)}{hint_html}</label>'
        f'<input type="{kind}" id="{esc(name)}" name="{esc(name)}" value="{esc(value)}" size="{size}"{invalid}>'
        f"{_error(errors, name)}</div>"
    )


def textarea(label: str, name: str, value: object = "", *, errors: dict | None = None, rows: int = 8) -> str:
    errors = errors or {}
    invalid = ' class="invalid" aria-invalid="true"' if errors.get(name) else ""
    return (
        f'<div class="field"><label for="{esc(name)}">{esc(label)}</label>'
        f'<textarea id="{esc(name)}" name="{esc(name)}" rows="{rows}"{invalid}>{esc(value)}</textarea>'
        f"{_error(errors, name)}</div>"
    )


def select(
    label: str, name: str, options: list, chosen: object = "", *, errors: dict | None = None, prompt: str = ""
) -> str:
    """A <select> whose options' values are their texts; `prompt` adds an empty first option."""
    errors = errors or {}
    invalid = ' class="invalid" aria-invalid="true"' if errors.get(name) else ""
    first = f'<option value="">{esc(prompt)}</option>' if prompt else ""
    items = "".join(
        f"<option{' selected' if str(option) == str(chosen) else ''}>{esc(option)}</option>" for option in options
    )
    return (
        f'<div class="field"><label for="{esc(name)}">{esc(label)}</label>'
        f'<select id="{esc(name)}" name="{esc(name)}"{invalid}>{first}{items}</select>{_error(errors, name)}</div>'
    )


def radios(label: str, name: str, options: list, chosen: object = "", *, errors: dict | None = None) -> str:
    """Radio buttons, `options` `[(value, text)]`, each with the id `NAME-VALUE`."""
    errors = errors or {}
    items = "".join(
        f'<label class="choice" for="{esc(name)}-{esc(value)}"><input type="radio" id="{esc(name)}-{esc(value)}"'
        f' name="{esc(name)}" value="{esc(value)}"{" checked" if str(value) == str(chosen) else ""}>{esc(text)}</label>'
        for value, text in options
    )
    return f'<fieldset class="field"><legend><strong>{esc(label)}</strong></legend>{items}{_error(errors, name)}</fieldset>'


def row(*fields: str) -> str:
    """Fields side by side."""
    return f'<div class="row">{"".join(fields)}</div>'


def hidden(name: str, value: object) -> str:
    return f'<input type="hidden" name="{esc(name)}" value="{esc(value)}">'


def form(
    action: str, content: str, *, button: str, button_id: str, method: str = "post", css: str = "", danger: bool = False
) -> str:
    """A form that posts (or gets) to `action`: its fields, then one submit button (`button_id`; red
    when it does what cannot be undone). `novalidate`: the server's checks are the ones that count."""
    style = f' class="{css}"' if css else ""
    red = ' class="danger"' if danger else ""
    return (
        f'<form method="{method}" action="{esc(action)}" novalidate{style}>{content}'
        f'<button type="submit" id="{esc(button_id)}"{red}>{esc(button)}</button></form>'
    )


# Serving, in the sandbox.


def answer(site: Site, request: Request) -> Response:
    """`site.handle(request)`, and a 500 page when the site fails (the traceback on stderr): the
    server and the replay answer alike, so a site's bug replays as it ran."""
    try:
        return site.handle(request)
    except Exception:
        import traceback

        traceback.print_exc()
        return site.error(500, "The site failed on this request.")


def _fields(text: str) -> dict:
    """A query string or urlencoded form as `{name: value or [values]}` (ValueError past MAX_FIELDS)."""
    found: dict = {}
    for name, value in parse_qsl(text, keep_blank_values=True, max_num_fields=MAX_FIELDS, errors="replace"):
        if name in found:
            found[name] = (found[name] if isinstance(found[name], list) else [found[name]]) + [value]
        else:
            found[name] = value
    return found


def entry(request: Request, response: Response) -> dict:
    """The log's record of a request that may have changed state."""
    return {
        "endpoint": request.path,
        "method": request.method,
        "query": request.query,
        "request_body": request.form if request.method == "POST" else request.query,
        "status": response.logged,
    }


class Handler(httpd.Handler):
    """The site's connections (`orchard.env.sandboxed.httpd`): a request line of `MAX_URL` bytes, a
    head of `MAX_HEAD`, a body of `MAX_BODY`; each request answered by the `Server`."""

    server: Server
    max_line, max_head, max_body = MAX_URL, MAX_HEAD, MAX_BODY

    def respond(self, method: str, target: str, headers: dict, body: bytes) -> tuple:
        return self.server.respond(method, target, headers, body)


class Server(socketserver.ThreadingTCPServer):
    """One site on 127.0.0.1:`port`, its log, and Orchard's token-guarded routes."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, site: Site, port: int, token: str) -> None:
        if not token:
            raise ValueError("the server needs a token: its log answers only a request that has it")
        super().__init__(("127.0.0.1", port), Handler)
        self.site, self.token, self.lock = site, token, threading.Lock()
        self.log: list = []
        self.log_bytes = 0

    def respond(self, method: str, target: str, headers: dict, body: bytes) -> tuple:
        """(status, content type, body text, location) of one request."""
        raw_path, _, raw_query = target.partition("?")
        if not raw_path.startswith("/"):
            return 400, "text/plain; charset=utf-8", "the request target is a path", ""
        path = "/" + "/".join(s for s in unquote(raw_path).split("/") if s)
        if path.startswith("/_orchard/"):
            return self._orchard(method, path, headers)
        try:
            query = _fields(raw_query)
            form: dict = {}
            if method == "POST" and body:
                kind = headers.get("content-type", "application/x-www-form-urlencoded").split(";")[0].strip().lower()
                if kind != "application/x-www-form-urlencoded":
                    return 415, "text/plain; charset=utf-8", "forms are sent urlencoded", ""
                form = _fields(body.decode("utf-8", "replace"))
        except ValueError:
            return 400, "text/plain; charset=utf-8", f"a request has at most {MAX_FIELDS} fields", ""
        request = Request(method.upper(), path, query, form)
        with self.lock:
            if not self.site.changes(request):
                response = answer(self.site, request)
            else:
                logged = entry(request, Response(200))  # its size: the status is three digits whatever it is
                size = len(json.dumps(logged)) + 1
                if len(self.log) >= MAX_LOG or self.log_bytes + size > MAX_LOG_BYTES:
                    response = self.site.error(429, f"This site took {len(self.log)} changes; it takes no more.")
                else:
                    response = answer(self.site, request)
                    logged["status"] = response.logged
                    self.log.append(logged)
                    self.log_bytes += size
        return response.status, response.content_type, response.body, response.location

    def _orchard(self, method: str, path: str, headers: dict) -> tuple:
        if not _compare_digest(headers.get(TOKEN_HEADER.lower(), "").encode(), self.token.encode()):
            return 403, "text/plain; charset=utf-8", f"Orchard's routes need the {TOKEN_HEADER} header", ""
        with self.lock:
            if method == "GET" and path == "/_orchard/health":
                found = {"status": "ok", "site": self.site.name, "logged": len(self.log)}
            elif method == "GET" and path == "/_orchard/log":
                found = {"calls": self.log}
            elif method == "GET" and path == "/_orchard/state":
                found = {self.site.name: self.site.state()}
            else:
                return 404, "text/plain; charset=utf-8", f"no route {method} {path}", ""
            return 200, "application/json", json.dumps(found), ""


def _options(argv: list) -> tuple:
    """(site file, {option: value}) of `SITE_FILE --name value ...`."""
    usage = "usage: site.py SITE_FILE --data DATA.json --port PORT [--token-file FILE] [--ready FILE]"
    if not argv or argv[0].startswith("--") or len(argv) % 2 == 0:
        raise SystemExit(usage)
    options = dict(zip(argv[1::2], argv[2::2]))  # noqa: B905 (`strict` is 3.10's; the length is even)
    if set(options) - {"--data", "--port", "--token-file", "--ready"} or not {"--data", "--port"} <= set(options):
        raise SystemExit(usage)
    return argv[0], options


def _token(options: dict) -> str:
    """The token of Orchard's routes: the `--token-file`'s text (the file is deleted), else
    `TOKEN_ENV`'s value (removed from the environment, so no child inherits it; the process's
    first environment, which /proc/PID/environ shows, still holds it: prefer the file)."""
    if "--token-file" in options:
        with open(options["--token-file"], encoding="utf-8") as f:
            token = f.read().strip()
        os.unlink(options["--token-file"])
    else:
        token = os.environ.pop(TOKEN_ENV, "").strip()
    if not token:
        raise SystemExit(f"site.py: no token: give --token-file FILE or set {TOKEN_ENV}")
    return token


def _module(path: str, name: str):
    """The module the Python file at `path` defines, run as `name`."""
    module = type(sys)(name)
    module.__file__ = os.path.abspath(path)
    sys.modules[name] = module
    try:
        with open(path, encoding="utf-8") as f:
            exec(compile(f.read(), module.__file__, "exec"), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _site_class(module) -> type:
    found = [
        value
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, Site) and value.__module__ == module.__name__
    ]
    if len(found) != 1:
        raise ValueError(f"{module.__file__} defines {len(found)} Site subclasses; a site module defines one")
    if not found[0].name:
        raise ValueError(f"{found[0].__name__} in {module.__file__} has no `name`")
    return found[0]


def main(argv: list) -> None:
    site_file, options = _options(argv)
    sys.modules.setdefault("orchard.recipes.gui.site", sys.modules[__name__])
    token = _token(options)
    site_class = _site_class(_module(site_file, "orchard_site"))
    with open(options["--data"], encoding="utf-8") as f:
        site = site_class(json.load(f))
    server = Server(site, int(options["--port"]), token)
    if "--ready" in options:
        with open(options["--ready"], "w") as f:
            f.write(str(server.server_address[1]))
    server.serve_forever()


# Grading, on the host.


def load_site(path: str | os.PathLike) -> type[Site]:
    """The `Site` subclass the Python file at `path` defines (ConfigError when it defines none, or
    more than one). It runs the file: name only files of a trusted folder."""
    from pathlib import Path

    from orchard.errors import ConfigError

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"no site module at {file}")
    try:
        return _site_class(_module(str(file), f"orchard_site_{file.stem}"))
    except (ValueError, SyntaxError, ImportError) as exc:
        raise ConfigError(f"site {file}: {exc}") from None


def parse_log(raw: bytes | str) -> list[dict]:
    """The entries of the server's answer to `GET /_orchard/log`, checked (`check_log`): it comes
    from the sandbox. TooLarge past `MAX_LOG_BYTES` and a little more, InvalidRequest otherwise."""
    from orchard.errors import InvalidRequest, TooLarge

    if len(raw) > MAX_LOG_BYTES + 64 * 1024:
        raise TooLarge(f"the site's log is {len(raw)} bytes; it holds at most {MAX_LOG_BYTES}")
    try:
        data = json.loads(raw)
    except RecursionError:
        raise InvalidRequest("the site's log is nested too deeply") from None
    except ValueError as exc:
        raise InvalidRequest(f"the site's log is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("calls"), list):
        raise InvalidRequest('the site\'s log is not {"calls": [...]}')
    return check_log(data["calls"])


def _check_fields(where: str, fields: object) -> dict:
    from orchard.errors import InvalidRequest

    if not isinstance(fields, dict) or len(fields) > MAX_FIELDS:
        raise InvalidRequest(f"{where} is not an object of at most {MAX_FIELDS} fields")
    for name, value in fields.items():
        values = value if isinstance(value, list) else [value]
        if len(name) > MAX_BODY or len(values) > MAX_FIELDS or not all(isinstance(v, str) for v in values):
            raise InvalidRequest(f"{where}: field {name[:40]!r} is not a string or a list of strings")
        if sum(len(v) for v in values) > MAX_BODY:
            raise InvalidRequest(f"{where}: field {name[:40]!r} is longer than a request body may be")
    return fields


def check_log(log: object) -> list[dict]:
    """`log`, a list of logged requests, when each is what the server writes (InvalidRequest naming
    the first that is not; TooLarge past `MAX_LOG` entries): the types, sizes and depth a replay
    can trust, whatever the sandbox sent."""
    from orchard.errors import InvalidRequest, TooLarge

    if not isinstance(log, list):
        raise InvalidRequest("the site's log is not a list of requests")
    if len(log) > MAX_LOG:
        raise TooLarge(f"the site's log holds {len(log)} requests; a site logs at most {MAX_LOG}")
    total = 0
    for number, item in enumerate(log, 1):
        where = f"logged request {number}"
        if not isinstance(item, dict):
            raise InvalidRequest(f"{where} is not an object")
        endpoint, method = item.get("endpoint"), item.get("method")
        if not isinstance(endpoint, str) or not endpoint.startswith("/") or len(endpoint) > MAX_URL:
            raise InvalidRequest(f"{where}: its endpoint is not a path of at most {MAX_URL} characters")
        if method not in ("GET", "POST"):
            raise InvalidRequest(f"{where}: its method is not GET or POST")
        for key in ("query", "request_body"):
            _check_fields(f"{where}: its {key}", item.get(key, {}))
        if not isinstance(item.get("status", 200), int):
            raise InvalidRequest(f"{where}: its status is not a number")
        total += len(json.dumps(item))
        if total > MAX_LOG_BYTES:
            raise InvalidRequest(f"the site's log is longer than {MAX_LOG_BYTES} bytes by request {number}")
    return log


def replay(site_class: type[Site], data: dict, log: object) -> tuple[dict, list[dict]]:
    """(state, calls) after a fresh `site_class(data)` handled every request of `log` in order.

    `log` is the server's answer to `GET /_orchard/log` (`{"calls": [...]}`, parsed) or its list
    of requests, `check_log`ged first: it comes from the sandbox. `state` is what checks read,
    `{site name: {collection: [records]}}`; `calls` are the requests with the status the replay
    gave each (the sandbox's is never taken), for `called` checks."""
    if isinstance(log, dict) and set(log) == {"calls"}:
        log = log["calls"]
    site = site_class(data)
    calls = []
    for item in check_log(log):
        method = item["method"]
        query = dict(item.get("query") or {})
        form = dict(item.get("request_body") or {}) if method == "POST" else {}
        request = Request(method, item["endpoint"], query, form)
        calls.append(entry(request, answer(site, request)))
    return {site_class.name: site.state()}, calls


if __name__ == "__main__":
    main(sys.argv[1:])
