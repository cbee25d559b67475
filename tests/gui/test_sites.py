"""Orchard's offline sites (`examples/gui/sites/`) and their runtime (`orchard/recipes/gui/site.py`), on the host,
without a browser: each site served by the real server, started as the sandbox starts it (`python -S`,
so the standard library only), and worked through its own HTML by `Tab`, a small stand-in for a browser
that plays a task's abstract steps (click, write, select, press Enter, goto) over the parsed pages and
their forms. Each task's solution reaches a state where all its checks hold and its wrong attempt
leaves one failing; the host's replay of the server's log gives the server's own state; the token
guards Orchard's routes; and every bound (a full log, a large body or URL, a forged log) is refused
with a clear error."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
import pytest

from orchard.env.bundle import build_bundle
from orchard.errors import ConfigError, InvalidRequest, TooLarge
from orchard.recipes.gui import site as runtime
from orchard.recipes.gui.site import (
    MAX_BODY,
    MAX_LOG,
    MAX_LOG_BYTES,
    MAX_URL,
    Request,
    check_log,
    load_site,
    parse_log,
    replay,
)
from orchard.recipes.gui.task import SOURCES
from orchard.tasks.checks import Check

ROOT = Path(__file__).resolve().parents[2]
SITES = ROOT / "examples" / "gui" / "sites"
TASKS = {task["instance_id"]: task for task in json.loads((ROOT / "examples" / "gui" / "tasks.json").read_text())}
SITE_CLASSES = {path.stem: load_site(path) for path in sorted(SITES.glob("*.py"))}
TOKEN = "s3cret-token-for-tests"


# The real server, as the sandbox starts it.


class Served:
    """One site's server: its URL, its process, and Orchard's token-guarded routes."""

    def __init__(self, url: str, process: subprocess.Popen) -> None:
        self.url, self.process = url, process
        self.http = httpx.Client(base_url=url, timeout=10)

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", int(self.url.rsplit(":", 1)[1])

    def orchard(self, route: str, token: str | None = TOKEN) -> httpx.Response:
        return self.http.get(f"/_orchard/{route}", headers={"X-Orchard-Token": token} if token is not None else {})

    def log(self) -> list[dict[str, Any]]:
        answer = self.orchard("log")
        assert answer.status_code == 200, answer.text
        return parse_log(answer.content)

    def state(self) -> dict[str, Any]:
        return self.orchard("state").json()


def _program(folder: Path) -> str:
    """The server laid out in `folder` as the sandbox has it (`GuiTask.serve`): `site.py` beside its
    HTTP layer; the path of `site.py`."""
    for source in SOURCES:
        (folder / source.name).write_bytes(source.read_bytes())
    return str(folder / "site.py")


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """`serve(site, data)` starts `site`'s server on a free loopback port; each is stopped after the
    test. `python` is the interpreter's argv (default: this one's, with `-S`)."""
    started: list[Served] = []

    def start(
        site: str,
        data: dict[str, Any],
        *,
        token_file: bool = True,
        env: dict[str, str] | None = None,
        python: list[str] | None = None,
    ) -> Served:
        folder = tmp_path / f"site-{len(started)}"
        folder.mkdir()
        (folder / "data.json").write_text(json.dumps(data))
        command = [*(python or [sys.executable, "-S"]), _program(folder), str(SITES / f"{site}.py")]
        command += ["--data", "data.json", "--port", "0", "--ready", "ready"]
        if token_file:
            (folder / "token").write_text(TOKEN)
            command += ["--token-file", "token"]
        process = subprocess.Popen(command, cwd=folder, env=env, stderr=subprocess.PIPE)
        ready = folder / "ready"
        for _ in range(1000):
            if ready.exists() and ready.read_text():
                break
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            time.sleep(0.005)
        served = Served(f"http://127.0.0.1:{ready.read_text()}", process)
        started.append(served)
        return served

    yield start
    for served in started:
        served.http.close()
        served.process.terminate()
        served.process.wait(10)
        if served.process.stderr:
            served.process.stderr.close()


# A stand-in for the browser: pages parsed into elements, forms filled and submitted as Chromium does.

VOID = {"input", "br", "meta", "hr", "img", "link", "area", "base", "col", "source", "wbr"}
TEXT_INPUTS = {"text", "email", "number", "search", "password", "tel", "url", "date"}


class Node:
    def __init__(self, tag: str, attrs: dict[str, str], parent: Node | None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node | str] = []
        self.value, self.checked = "", False

    def walk(self) -> Iterator[Node]:
        for child in self.children:
            if isinstance(child, Node):
                yield child
                yield from child.walk()

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def up(self, tag: str) -> Node | None:
        node = self.parent
        while node is not None and node.tag != tag:
            node = node.parent
        return node

    def __repr__(self) -> str:
        return f"<{self.tag} {self.attrs}>"


class Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = self.current = Node("#document", {}, None)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs}, self.current)
        self.current.children.append(node)
        if tag not in VOID:
            self.current = node

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.current.children.append(Node(tag, {k: v or "" for k, v in attrs}, self.current))

    def handle_endtag(self, tag: str) -> None:
        node: Node | None = self.current
        while node is not None and node.tag != tag:
            node = node.parent
        assert node is not None and node.parent is not None, f"</{tag}> closes nothing"
        self.current = node.parent

    def handle_data(self, data: str) -> None:
        self.current.children.append(data)


def parse(html: str) -> Node:
    parser = Parser()
    parser.feed(html)
    parser.close()
    for node in parser.root.walk():
        if node.tag == "input":
            node.value, node.checked = node.attrs.get("value", ""), "checked" in node.attrs
        elif node.tag == "textarea":
            node.value = node.text()
        elif node.tag == "select":
            options = [o for o in node.walk() if o.tag == "option"]
            chosen = next((o for o in options if "selected" in o.attrs), options[0] if options else None)
            node.value = _option_value(chosen) if chosen else ""
    return parser.root


def _option_value(option: Node) -> str:
    return option.attrs.get("value", option.text())


_COMPOUND = re.compile(r"""([a-z][a-z0-9]*)|\#([\w-]+)|\.([\w-]+)|\[([\w-]+)(?:=(?:"([^"]*)"|'([^']*)'|([^\]]*)))?\]""")


def _matches(node: Node, compound: str) -> bool:
    at = 0
    for part in _COMPOUND.finditer(compound):
        assert part.start() == at, f"a selector this stand-in does not read: {compound!r}"
        at = part.end()
        tag, id_, css, attr = part.group(1, 2, 3, 4)
        wanted = next((v for v in part.group(5, 6, 7) if v is not None), None)
        if tag and node.tag != tag:
            return False
        if id_ and node.attrs.get("id") != id_:
            return False
        if css and css not in node.attrs.get("class", "").split():
            return False
        if attr and (attr not in node.attrs or (wanted is not None and node.attrs[attr] != wanted)):
            return False
    assert at == len(compound), f"a selector this stand-in does not read: {compound!r}"
    return True


def query(root: Node, selector: str) -> list[Node]:
    """The elements `selector` (compounds of tag, #id, .class, [attr=value], and descendants) matches."""
    *ancestors, last = re.findall(r"(?:[^\s\[]+|\[[^\]]*\])+", selector)
    found = []
    for node in root.walk():
        if not _matches(node, last):
            continue
        parent, wanted = node.parent, list(ancestors)
        while wanted and parent is not None:
            if _matches(parent, wanted[-1]):
                wanted.pop()
            parent = parent.parent
        if not wanted:
            found.append(node)
    return found


class Tab:
    """One browser tab on a site: it loads pages, fills in their forms and submits them as Chromium does
    (the submitter's name and value, checked radios, selected options, CRLF in a textarea)."""

    def __init__(self, url: str) -> None:
        self.http = httpx.Client(base_url=url, timeout=10, follow_redirects=True)
        self.path, self.status = "/", 0
        self.root = Node("#document", {}, None)
        self.focused: Node | None = None
        self.statuses: list[int] = []
        self.answer = ""

    def _load(self, response: httpx.Response) -> None:
        self.statuses += [r.status_code for r in response.history] + [response.status_code]
        self.status, self.path = response.status_code, response.url.raw_path.decode()
        self.root, self.focused = parse(response.text), None

    def goto(self, url: str) -> None:
        self._load(self.http.get(url))

    def one(self, selector: str) -> Node:
        found = query(self.root, selector)
        assert len(found) == 1, f"{selector!r} matches {len(found)} elements on {self.path} (status {self.status})"
        return found[0]

    def click(self, selector: str) -> None:
        node = self.one(selector)
        if node.tag == "label":
            node = self.one(f"#{node.attrs['for']}")
        if node.tag == "a":
            self.goto(node.attrs["href"])
        elif node.tag == "button" or (node.tag == "input" and node.attrs.get("type") == "submit"):
            self._submit(node.up("form"), node)
        elif node.tag == "input" and node.attrs.get("type") == "radio":
            form = node.up("form")
            for other in query(form or self.root, f'input[name="{node.attrs["name"]}"]'):
                other.checked = False
            node.checked = True
        elif node.tag == "input" and node.attrs.get("type") == "checkbox":
            node.checked = not node.checked
        elif node.tag in ("input", "textarea", "select"):
            self.focused = node
        else:
            raise AssertionError(f"clicking {node} does nothing")

    def write(self, selector: str, text: str) -> None:
        node = self.one(selector)
        assert node.tag == "textarea" or (node.tag == "input" and node.attrs.get("type", "text") in TEXT_INPUTS), node
        node.value, self.focused = text, node

    def select(self, selector: str, value: str) -> None:
        node = self.one(selector)
        options = [o for o in node.walk() if o.tag == "option"]
        chosen = next((o for o in options if o.text() == value or _option_value(o) == value), None)
        assert node.tag == "select" and chosen is not None, f"{selector!r} offers no {value!r}"
        node.value = _option_value(chosen)

    def press(self, keys: list[str]) -> None:
        assert keys == ["Enter"], f"this stand-in presses Enter only, not {keys}"
        form = self.focused.up("form") if self.focused is not None and self.focused.tag == "input" else None
        assert form is not None, "Enter with no field of a form focused"
        buttons = [b for b in form.walk() if b.tag == "button" and b.attrs.get("type", "submit") == "submit"]
        self._submit(form, buttons[0] if buttons else None)

    def _submit(self, form: Node | None, submitter: Node | None) -> None:
        assert form is not None, "a submit button outside a form"
        fields: list[tuple[str, str]] = []
        for node in form.walk():
            name = node.attrs.get("name")
            if not name or "disabled" in node.attrs:
                continue
            kind = node.attrs.get("type", "text") if node.tag == "input" else node.tag
            if kind in ("radio", "checkbox"):
                if node.checked:
                    fields.append((name, node.attrs.get("value", "on")))
            elif kind in ("button", "submit"):
                if node is submitter:
                    fields.append((name, node.attrs.get("value", "")))
            elif node.tag == "textarea":
                fields.append((name, re.sub(r"\r?\n", "\r\n", node.value)))
            elif node.tag in ("input", "select"):
                fields.append((name, node.value))
        action = form.attrs.get("action") or self.path
        if form.attrs.get("method", "get").lower() == "post":
            self._load(
                self.http.post(
                    action, content=urlencode(fields), headers={"Content-Type": "application/x-www-form-urlencoded"}
                )
            )
        else:
            self.goto(f"{urlsplit(action).path}?{urlencode(fields)}")

    def play(self, steps: list[dict[str, Any]]) -> None:
        """A task's abstract steps (`solution`, `wrong`), as a harness would turn them into actions."""
        for step in steps:
            if step["kind"] == "submit":
                self.answer = step["content"]
                continue
            tool, arguments = step["tool"], step["arguments"]
            if tool == "goto":
                self.goto(arguments["url"])
            elif tool == "click":
                self.click(arguments["target"])
            elif tool == "write":
                self.write(arguments["target"], arguments["text"])
            elif tool == "select":
                self.select(arguments["target"], arguments["value"])
            elif tool == "press":
                self.press(arguments["keys"])
            elif tool != "scroll":
                raise AssertionError(f"a step this stand-in does not play: {step}")


def work(
    served: Served, task: dict[str, Any], steps: list[dict[str, Any]]
) -> tuple[Tab, dict[str, Any], list[dict[str, Any]]]:
    """The tab after `steps` from the task's start page, and the state and calls the host's replay gives."""
    tab = Tab(served.url)
    tab.goto(task["start"])
    tab.play(steps)
    state, calls = replay(SITE_CLASSES[task["site"]], task["data"], served.log())
    return tab, state, calls


def failing(task: dict[str, Any], state: dict[str, Any], calls: list[dict[str, Any]], answer: str) -> list[str]:
    return [c["name"] for c in task["checks"] if not Check(**c).holds(calls, state, answer)]


# The tasks.


@pytest.mark.parametrize("instance_id", sorted(TASKS))
def test_the_solution_reaches_a_state_where_every_check_holds(serve, instance_id):
    task = TASKS[instance_id]
    served = serve(task["site"], task["data"])
    tab, state, calls = work(served, task, task["solution"])
    assert all(status < 500 for status in tab.statuses), tab.statuses
    assert failing(task, state, calls, tab.answer) == []
    assert state == served.state(), "the host's replay of the log differs from the server's own state"


@pytest.mark.parametrize("instance_id", sorted(TASKS))
def test_the_wrong_attempt_leaves_a_check_failing(serve, instance_id):
    task = TASKS[instance_id]
    served = serve(task["site"], task["data"])
    tab, state, calls = work(served, task, task["wrong"])
    assert all(status < 500 for status in tab.statuses), tab.statuses
    assert failing(task, state, calls, tab.answer)
    assert state == served.state()


def test_each_site_has_five_tasks_or_more_whose_checks_name_its_state_and_routes():
    for name, site_class in SITE_CLASSES.items():
        tasks = [t for t in TASKS.values() if t["site"] == name]
        assert len(tasks) >= 5, name
        assert any(any(c["type"] == "answer" for c in t["checks"]) for t in tasks), f"{name}: no answer read off a page"
        site = site_class(tasks[0]["data"])
        for task in tasks:
            assert task["instance_id"].startswith(f"gui-{name}-") and task["kind"] == "gui"
            assert task["start"].startswith("/") and task["solution"][-1]["kind"] == "submit"
            for check in map(lambda c: Check(**c), task["checks"]):
                if check.type == "state":
                    assert check.service == name and check.collection in site_class.collections, check
                if check.type == "called":  # a route that posts, or a GET the site logs
                    posted, got = site.route_for("POST", check.endpoint), site.route_for("GET", check.endpoint)
                    assert posted[0] is not None or got[2], check


def test_the_task_file_loads_as_gui_tasks():
    from orchard.tasks.loading import load_tasks

    loaded = load_tasks(ROOT / "examples" / "gui" / "tasks.json")
    assert sorted(t.instance_id for t in loaded) == sorted(TASKS)


# The pages.


CRAWLED = {
    "shop": (
        "gui-shop-order-status",
        {"cart": TASKS["gui-shop-cart-cleanup"]["data"]["cart"]},
        ["/search?q=mug", "/checkout"],
    ),
    "wiki": ("gui-wiki-coffee-vandalism", {}, ["/search?q=coffee", "/new?title=Parking"]),
    "booking": (
        "gui-booking-cancel-thursday",
        {},
        ["/booking/LB-4M2X", "/manage?code=LB-9TQ7", "/availability?date=2026-03-06", "/availability?date=2026-03-03"],
    ),
}
"""Per site: the task whose data it is crawled with, changes to that data, and pages no link leads to."""


def _pages(site_class: type[runtime.Site], data: dict[str, Any], starts: list[str]) -> Iterator[tuple[str, str]]:
    """(path, HTML) of every page reached from / and `starts` by the links that change nothing."""
    site, seen, queue = site_class(data), set(), ["/", *starts]
    while queue:
        target = queue.pop()
        path, _, raw_query = target.partition("?")
        request = Request("GET", path, dict(q.split("=", 1) for q in raw_query.split("&") if "=" in q))
        if target in seen or site.changes(request):
            continue
        seen.add(target)
        response = site.handle(request)
        assert response.status == 200, (target, response.status)
        yield target, response.body
        queue += [
            a.attrs["href"]
            for a in parse(response.body).walk()
            if a.tag == "a" and a.attrs.get("href", "").startswith("/")
        ]


@pytest.mark.parametrize("name", sorted(SITE_CLASSES))
def test_every_page_is_plain_html_with_labelled_fields_and_nothing_from_elsewhere(name):
    instance_id, changes, starts = CRAWLED[name]
    pages = dict(_pages(SITE_CLASSES[name], {**TASKS[instance_id]["data"], **changes}, starts))
    assert len(pages) >= 7, sorted(pages)
    for path, html in pages.items():
        assert "<script" not in html and " src=" not in html and "http" not in html.split("</style>")[0], path
        root = parse(html)
        assert [n.tag for n in root.walk()].count("h1") == 1, path
        for node in root.walk():
            if node.tag in ("input", "select", "textarea") and node.attrs.get("type") != "hidden":
                labelled = node.attrs.get("aria-label") or query(root, f'label[for="{node.attrs.get("id")}"]')
                assert node.attrs.get("name") and labelled, (path, node)
            if node.tag == "button":
                assert node.text().strip() and node.attrs.get("id"), (path, node)
            if node.tag == "form":
                assert node.attrs.get("method") in ("get", "post"), (path, node)


def test_a_site_answers_a_page_that_is_not_there_and_a_wrong_method():
    shop = SITE_CLASSES["shop"](TASKS["gui-shop-rain-jacket"]["data"])
    assert shop.handle(Request("GET", "/nowhere")).status == 404
    assert shop.handle(Request("GET", "/product/p-999")).status == 404
    assert shop.handle(Request("GET", "/cart/add")).status == 405
    assert "There is no page at /nowhere" in shop.handle(Request("GET", "/nowhere")).body


# The server and its log.


def test_only_requests_that_may_change_state_are_logged_and_a_redirect_is_logged_as_done(serve):
    task = TASKS["gui-shop-cart-cleanup"]
    served = serve("shop", task["data"])
    for path in ("/", "/search?q=mug", "/product/p-301", "/cart", "/checkout", "/favicon.ico"):
        served.http.get(path)
    assert served.log() == []
    served.http.get("/cart/remove?line=line-a")  # a link that changes the cart: the site marks its route
    served.http.post("/cart/update", data={"line": "line-b", "quantity": "lots"})
    assert served.log() == [
        {
            "endpoint": "/cart/remove",
            "method": "GET",
            "query": {"line": "line-a"},
            "request_body": {"line": "line-a"},
            "status": 200,
        },
        {
            "endpoint": "/cart/update",
            "method": "POST",
            "query": {},
            "request_body": {"line": "line-b", "quantity": "lots"},
            "status": 422,
        },
    ]


def test_the_replay_gives_its_own_statuses_and_the_same_state_every_time():
    task = TASKS["gui-booking-full-slot"]
    booking = {"date": "2026-03-07", "time": "20:00", "party": "2", "name": "Omar Haddad", "email": "omar@example.com"}
    log = [
        {
            "endpoint": "/book",
            "method": "POST",
            "query": {},
            "request_body": booking,
            "status": 200,
        },  # the slot is full
        {
            "endpoint": "/book",
            "method": "POST",
            "query": {},
            "request_body": {**booking, "time": "21:00"},
            "status": 500,
        },
    ]
    first, calls = replay(SITE_CLASSES["booking"], task["data"], log)
    assert [c["status"] for c in calls] == [422, 200]
    assert replay(SITE_CLASSES["booking"], task["data"], {"calls": log}) == (first, calls)
    assert [b["time"] for b in first["booking"]["bookings"] if b["name"] == "Omar Haddad"] == ["21:00"]


def test_orchard_routes_answer_only_with_the_token_which_the_process_does_not_show(serve):
    served = serve("wiki", TASKS["gui-wiki-on-call"]["data"])
    for route in ("log", "health", "state"):
        assert served.orchard(route, token=None).status_code == 403
        assert served.orchard(route, token="not-the-token").status_code == 403
        assert served.orchard(route).status_code == 200
    assert served.orchard("health").json() == {"status": "ok", "site": "wiki", "logged": 0}
    folder = Path(f"/proc/{served.process.pid}")
    assert TOKEN.encode() not in (folder / "cmdline").read_bytes()
    assert TOKEN.encode() not in (folder / "environ").read_bytes()


def test_the_token_file_is_deleted_and_the_environment_can_give_the_token_instead(serve, tmp_path):
    served = serve("booking", TASKS["gui-booking-free-times"]["data"])
    assert not (tmp_path / "site-0" / "token").exists()
    by_env = serve(
        "booking", TASKS["gui-booking-free-times"]["data"], token_file=False, env={"ORCHARD_SITE_TOKEN": TOKEN}
    )
    assert by_env.orchard("health").status_code == 200 and by_env.orchard("health", token=None).status_code == 403
    assert served.orchard("health").status_code == 200


def test_every_site_serves_on_the_bundles_interpreter(serve):
    """As in a sandbox, where the server runs on the bundle's interpreter (here where it is built),
    which carries what the server and each site import."""
    bundle = build_bundle()
    home = str(bundle.path)
    for site in SITE_CLASSES:
        data = next(task["data"] for task in TASKS.values() if task["site"] == site)
        served = serve(site, data, python=bundle.python(home), env=bundle.environment(home))
        assert Path(f"/proc/{served.process.pid}/exe").resolve() == bundle.path / "lib" / bundle.linker
        assert served.http.get("/").status_code == 200
        assert served.orchard("health").json() == {"status": "ok", "site": site, "logged": 0}


def test_a_server_without_a_token_does_not_start(tmp_path):
    (tmp_path / "data.json").write_text("{}")
    done = subprocess.run(
        [sys.executable, "-S", _program(tmp_path), str(SITES / "wiki.py"), "--data", "data.json", "--port", "0"],
        cwd=tmp_path, capture_output=True, text=True, timeout=30, env={},
    )  # fmt: skip
    assert done.returncode != 0 and "no token" in done.stderr


def test_past_max_log_changes_the_server_refuses_them_unhandled(serve):
    task = TASKS["gui-booking-friday-dinner"]
    served = serve("booking", task["data"])
    junk = urlencode({"date": "yesterday"})
    with socket.create_connection(served.address) as sock:  # pipelined: quick
        request = f"POST /book HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(junk)}\r\n\r\n{junk}"
        sock.sendall(request.encode() * MAX_LOG)
        received = b""
        while received.count(b"HTTP/1.1 422") < MAX_LOG:
            received += sock.recv(1 << 20)
    booking = {"date": "2026-03-06", "time": "18:00", "party": "2", "name": "Late Comer", "email": "late@example.com"}
    refused = served.http.post("/book", data=booking)
    assert refused.status_code == 429 and "takes no more" in refused.text
    assert served.http.get("/").status_code == 200  # reading goes on
    assert len(served.log()) == MAX_LOG
    assert not any(b["name"] == "Late Comer" for b in served.state()["booking"]["bookings"])


def test_past_max_log_bytes_the_server_refuses_changes(serve):
    served = serve("wiki", TASKS["gui-wiki-on-call"]["data"])
    body = {"body": "x" * (MAX_BODY - 100), "summary": "big"}
    statuses = [
        served.http.post("/wiki/main-page/edit", data=body).status_code for _ in range(MAX_LOG_BYTES // MAX_BODY + 2)
    ]
    assert statuses[-1] == 429 and 422 in statuses
    answer = served.orchard("log")
    assert len(answer.content) <= MAX_LOG_BYTES + 64 * 1024
    assert len(parse_log(answer.content)) == statuses.index(429)


def _raw(served: Served, data: bytes) -> bytes:
    with socket.create_connection(served.address) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"POST /book HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1) + b"a" * (MAX_BODY + 1), b"413"),
        (b"GET /" + b"a" * MAX_URL + b" HTTP/1.1\r\n\r\n", b"414"),
        (b"GET / HTTP/1.1\r\n" + b"X-Filler: " + b"a" * 70000 + b"\r\n\r\n", b"431"),
        (b"POST /book HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", b"411"),
        (b"POST /book HTTP/1.1\r\nContent-Type: multipart/form-data\r\nContent-Length: 5\r\n\r\nhello", b"415"),
        (b"POST /book HTTP/1.1\r\nContent-Length: 801\r\n\r\n" + b"&".join([b"a=1"] * 201) + b"\r\n", b"400"),
        (b"NONSENSE\r\n\r\n", b"400"),
    ],
    ids=["body", "url", "head", "chunked", "multipart", "fields", "request-line"],
)
def test_a_request_over_a_bound_is_refused_and_not_logged(serve, request_bytes, status):
    served = serve("booking", TASKS["gui-booking-free-times"]["data"])
    assert _raw(served, request_bytes).split(b" ", 2)[1] == status
    assert served.log() == []


# Forged logs: what the host checks before it replays.

GOOD = {"endpoint": "/book", "method": "POST", "query": {}, "request_body": {"date": "2026-03-06"}, "status": 200}


@pytest.mark.parametrize(
    ("log", "error", "says"),
    [
        ({"calls": "nope"}, InvalidRequest, "not a list"),
        ([GOOD] * (MAX_LOG + 1), TooLarge, f"at most {MAX_LOG}"),
        (["a string"], InvalidRequest, "logged request 1 is not an object"),
        ([GOOD, {**GOOD, "endpoint": "book"}], InvalidRequest, "logged request 2: its endpoint"),
        ([{**GOOD, "method": "DELETE"}], InvalidRequest, "not GET or POST"),
        ([{**GOOD, "request_body": {"date": {"nested": "object"}}}], InvalidRequest, "field 'date' is not a string"),
        ([{**GOOD, "request_body": {"date": [["deeper"]]}}], InvalidRequest, "field 'date' is not a string"),
        ([{**GOOD, "query": ["x"]}], InvalidRequest, "its query is not an object"),
        ([{**GOOD, "request_body": {"body": "x" * (MAX_BODY + 1)}}], InvalidRequest, "longer than a request body"),
        ([{**GOOD, "status": "200"}], InvalidRequest, "status is not a number"),
        ([{**GOOD, "request_body": {"body": "x" * (MAX_BODY - 10)}}] * 200, InvalidRequest, "longer than"),
    ],
    ids=[
        "not-a-list",
        "too-many",
        "not-an-object",
        "endpoint",
        "method",
        "object-value",
        "nested-list",
        "query",
        "long-value",
        "status",
        "too-many-bytes",
    ],
)
def test_a_forged_log_is_refused_before_anything_replays(log, error, says):
    with pytest.raises(error, match=re.escape(says)):
        replay(SITE_CLASSES["booking"], TASKS["gui-booking-free-times"]["data"], log)


def test_a_forged_log_too_deep_or_too_large_to_parse_is_refused():
    with pytest.raises(InvalidRequest, match="nested too deeply"):
        parse_log(b'{"calls": ' + b"[" * 200_000 + b"]" * 200_000 + b"}")
    with pytest.raises(TooLarge, match="holds at most"):
        parse_log(b" " * (MAX_LOG_BYTES + 65 * 1024))
    with pytest.raises(InvalidRequest, match="not JSON"):
        parse_log(b"{calls")
    assert check_log([GOOD]) == [GOOD]


def test_a_site_module_that_defines_no_site_or_two_is_one_clear_error(tmp_path):
    (tmp_path / "none.py").write_text("X = 1\n")
    (tmp_path / "two.py").write_text(
        "from orchard.recipes.gui.site import Site\nclass A(Site):\n    name = 'a'\nclass B(Site):\n    name = 'b'\n"
    )
    for file, says in (
        ("none.py", "defines 0 Site subclasses"),
        ("two.py", "defines 2 Site subclasses"),
        ("gone.py", "no site module"),
    ):
        with pytest.raises(ConfigError, match=says):
            load_site(tmp_path / file)


def test_a_task_file_finds_its_sites_beside_it(tmp_path):
    """A copied GUI task folder (its task file and `sites/`) works wherever it is: a site named in
    it is looked up in `sites/` beside the task file first, then among the example sites."""
    import shutil

    from orchard.tasks.loading import load_tasks

    examples = Path(__file__).parents[2] / "examples" / "gui"
    (tmp_path / "sites").mkdir()
    shutil.copy(examples / "sites" / "shop.py", tmp_path / "sites" / "myshop.py")
    rows = json.loads((examples / "tasks.json").read_text())
    row = next(r for r in rows if r["site"] == "shop")
    (tmp_path / "tasks.json").write_text(json.dumps([{**row, "site": "myshop"}]))
    (task,) = load_tasks(tmp_path / "tasks.json")
    assert Path(task.site) == (tmp_path / "sites" / "myshop.py").resolve()
    (tmp_path / "tasks.json").write_text(json.dumps([{**row, "site": "nosuchsite"}]))
    with pytest.raises(ConfigError, match="no site 'nosuchsite'"):
        load_tasks(tmp_path / "tasks.json")
