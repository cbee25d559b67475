"""Attacks on the GUI recipe (issue 17): everything inside a sandbox is hostile, Chromium and the
exec agent included, and the agent (the model) has only the browser tools. It must not forge a
grade, reach outside the sandbox, or make the host do anything else.

* **The agent through the harnesses**, on a shipped `gui` task (the shop, served in a real
  `blocked` sandbox of the browser image, its real Chromium): every URL off the task's site is
  refused (`javascript:` in any case or spacing, `data:`, `file:`, `view-source:`, `chrome:`, the
  DevTools port, other ports and hosts); relative and encoded URLs resolve on the site; the site's
  log answers the browser 403, and its token is nowhere the browser could read it.
* **Hostile pages**, of a browser task made here (`AttackPages`), worked by the real loop, the real
  harnesses and the scripted model: 10,000 elements, control characters, a 1 MiB title, popup spam,
  an endless alert loop, a script that never returns, `beforeunload`, a page that never finishes
  loading. Each step stays bounded and the episode ends, at worst `aborted` with the browser's error.
* **A hostile browser** (a fake Chromium: a Python server on port 9222 of a base-image sandbox)
  sends screenshots of huge dimensions, a deflate bomb of the viewport's size, a PNG that does not
  decode, element lists and outlines of the wrong types or sizes, JSON nested too deep, 5,000 tabs.
* **A hostile exec agent** answering `/connect`: a fake agent on a Unix socket of the host, since
  a sandbox cannot replace its own agent's socket (its run folder is read-only to it).
* **The store and the TUI**: `load_images` with a path elsewhere, `half_blocks` on a bomb.
* **Grades** from forged submissions: a `gui` log of calls the agent never made (the documented
  trust boundary: the log is what the site did), logs of wrong types or over the bound, MiniWoB
  rewards of 1e309, NaN or text.

Each test asserts what must hold; the ones that first found a break (the default `file:` rule,
popups, a new tab's relative URLs, a tunnel that closes or trickles, stored images that are no
regular file, PIL's bomb error, 400-digit numbers) fail without the fix that followed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchard.agents import harness_factory
from orchard.agents.base import Action, FormatError, Reply, ToolCall
from orchard.agents.loop import IMAGE_URL, Episode, Limits, load_images, run_episode
from orchard.agents.models import ScriptedModel
from orchard.env import client as client_module
from orchard.env import images
from orchard.env.backends.base import AgentEndpoint
from orchard.env.calls import TUNNEL_MAX_HEAD, AgentCalls
from orchard.env.client import Sandbox
from orchard.env.transport import AgentChannel
from orchard.errors import AgentError, OrchardError
from orchard.recipes.gui import browser as browser_module
from orchard.recipes.gui import cdp as cdp_module
from orchard.recipes.gui import task as gui_task
from orchard.recipes.gui.browser import MAX_TABS, Browser
from orchard.recipes.gui.cdp import BrowserError, BrowserTimeout, CDPConnection
from orchard.recipes.gui.harnesses import OUTLINE_CHARS, BidHarness, ComputerHarness
from orchard.recipes.gui.miniwob import MiniWobTask
from orchard.recipes.gui.site import MAX_LOG
from orchard.recipes.gui.task import BrowserTask, GuiTask, session_of
from orchard.tasks.base import Grade, Step, task_sandbox
from orchard.tasks.loading import load_tasks
from orchard.tui.picture import half_blocks

ROOT = Path(__file__).resolve().parents[2]
TASKS = {task.instance_id: task for task in load_tasks(ROOT / "examples" / "gui" / "tasks.json")}
SITE = "http://127.0.0.1:8000"
HARNESSES = {"computer": ComputerHarness, "bid": BidHarness}
GOTO = {"computer": "goto_url", "bid": "goto"}
FOLDER = "/tmp/attack"
"""Where `AttackPages` writes its pages in the sandbox."""
ORIGIN = "http://127.0.0.1:8766"
"""Where `AttackPages` serves them when it is an `http` task."""
MOST_TEXT = 16_000
"""The most characters one text of an episode may hold: an outline (`OUTLINE_CHARS`) and the tabs line."""


def act(harness: Any, box: Sandbox, name: str, **arguments: Any) -> str:
    """What the harness tells the model after one tool call (`execute`, as the loop calls it)."""
    return harness.execute(Action(name, arguments), box, "/tmp")


# --- the agent through the harnesses, on a shipped task -----------------------------------------


@pytest.fixture(scope="module")
def shop(client, browser_image) -> Iterator[Sandbox]:
    """The shop task started in a `blocked` sandbox of the browser image: its site, its Chromium."""
    task = TASKS["gui-shop-rain-jacket"]
    with task_sandbox(client, task, browser_image, network="blocked") as box:
        task.start(box)
        yield box
        task.conclude(box, [], [])


@pytest.fixture
def on_the_shop(shop) -> Sandbox:
    """The shop's start page, in its one tab."""
    browser = session_of(shop).browser
    while len(browser.tabs()) > 1:
        browser.close_tab()
    assert browser.goto(SITE + "/")
    return shop


OFF_THE_SITE = [
    "javascript:alert(1)",
    "JavaScript:alert(1)",
    "  javascript:alert(1)",
    "java\tscript:alert(1)",
    "\njavascript:alert(1)",
    "data:text/html,<script>alert(1)</script>",
    "file:///proc/1/environ",
    "file:///opt/orchard-gui/token",
    "file:///opt/orchard-gui/data.json",
    "view-source:http://127.0.0.1:8000/",
    "chrome://version",
    "devtools://devtools/bundled/inspector.html",
    "about:blank",
    "blob:http://127.0.0.1:8000/x",
    "http://127.0.0.1:9222/json",  # Chromium's DevTools port
    "//127.0.0.1:9222/json",
    "ws://127.0.0.1:9222/devtools/browser",
    "http://127.0.0.1:8001/",
    "http://localhost:8000/",
    "http://0x7f000001:8000/",
    "http://127.1:8000/",
    "http://10.0.0.1/",
    "http://127.0.0.1:8000@127.0.0.1:9222/json",
    "http://127.0.0.1:8000\\@127.0.0.1:9222/json",
]


@pytest.mark.parametrize("harness", HARNESSES)
@pytest.mark.parametrize("url", OFF_THE_SITE)
def test_the_agent_is_refused_every_url_off_the_tasks_site(on_the_shop, harness, url):
    browser = session_of(on_the_shop).browser
    said = act(HARNESSES[harness](), on_the_shop, GOTO[harness], url=url)
    assert said == f"Error: {url!r} is not a page of this task; stay on its site"
    assert browser.url == SITE + "/"


@pytest.mark.parametrize(
    ("url", "lands"),
    [
        ("%6aavascript:alert(1)", "/%6aavascript:alert(1)"),  # no scheme: a path of the site
        ("\\\\127.0.0.1:9222/json", "/127.0.0.1:9222/json"),  # backslashes: a path too
        ("http:\\\\127.0.0.1:9222/json", "///127.0.0.1:9222/json"),
        ("/../../../etc/passwd", "/etc/passwd"),
        ("HTTP://127.0.0.1:8000/cart", "/cart"),
    ],
)
def test_relative_and_encoded_urls_resolve_on_the_site(on_the_shop, url, lands):
    browser = session_of(on_the_shop).browser
    said = act(ComputerHarness(), on_the_shop, "goto_url", url=url)
    assert said.startswith(f"opened {SITE}/"), said
    assert browser.url.startswith(SITE + "/") and browser.url.endswith(lands), browser.url
    assert browser.evaluate("location.origin") == SITE


def test_the_sites_own_routes_answer_the_browser_403_and_its_token_is_out_of_reach(on_the_shop):
    browser = session_of(on_the_shop).browser
    for path in ("/_orchard/log", "/_orchard/state", "/%5Forchard/log", "/_orchard//health"):
        said = act(BidHarness(), on_the_shop, "goto", url=path)
        assert said.startswith(f"opened {SITE}/"), said
        shown = browser.evaluate("document.body.innerText")
        assert "need the X-Orchard-Token header" in shown and "calls" not in shown, (path, shown[:200])
    token = gui_task._TOKENS[on_the_shop.id]
    on_the_shop.write_file("/tmp/needle", token)  # grep reads it from a file: its own command line holds no token
    try:
        found = on_the_shop.exec(
            "grep -lsF -f /tmp/needle /proc/[0-9]*/cmdline /proc/[0-9]*/environ /opt/orchard-gui/*; true"
        )
    finally:
        on_the_shop.exec("rm -f /tmp/needle")
    assert found.stdout == "" and on_the_shop.exec("test -e /opt/orchard-gui/token").exit_code == 1


def test_a_url_over_the_browsers_bound_is_refused_to_the_model(on_the_shop):
    """Were the browser's InvalidRequest let out of `execute`, the loop would abort the episode,
    which `played` counts the machine's fault: no verdict, and a resumed run tries again (a model
    could re-roll a failing attempt with one long URL)."""
    said = act(ComputerHarness(), on_the_shop, "goto_url", url=SITE + "/" + "a" * 9000)
    assert said == "Error: a URL is a string of 1 to 8192 characters"


def test_a_tab_past_the_bound_is_refused_to_the_model(on_the_shop):
    """Likewise for the twenty-first tab: told, not an aborted episode."""
    harness = ComputerHarness()
    said = [act(harness, on_the_shop, "new_tab") for _ in range(MAX_TABS)]
    assert said[-2].startswith("the active tab is now")
    assert said[-1] == f"Error: a browser has at most {MAX_TABS} tabs: close one first"


def test_a_relative_url_opens_from_a_new_tab(on_the_shop):
    harness = BidHarness()
    act(harness, on_the_shop, "new_tab")
    assert act(harness, on_the_shop, "goto", url="/cart") == f"opened {SITE}/cart"


# --- hostile pages, of a task made here ----------------------------------------------------------

STALL_SERVER = r"""
import http.server, os, time

class Pages(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/stall"):  # a page that never finishes loading
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            self.wfile.write(b"<title>Stall</title><p>loading forever")
            self.wfile.flush()
            time.sleep(3600)
            return
        super().do_GET()

    def log_message(self, *args):
        pass

os.chdir("/tmp/attack")
http.server.ThreadingHTTPServer(("127.0.0.1", 8766), Pages).serve_forever()
"""


class AttackPages(BrowserTask):
    """A browser task made for these attacks: its `pages` written into the sandbox under `FOLDER`
    and opened as `file:` pages, or with `http` served on `ORIGIN` (with `/stall`, a page that
    never finishes loading); `steps` the scripted model's solution; graded on nothing."""

    kind: str = "gui-attack"
    problem_statement: str = "Press the button, then say done."
    pages: dict[str, str]
    first: str = "index.html"
    http: bool = False
    steps: list[dict[str, Any]] = []

    def sandbox_image(self, prepare: Any) -> str:
        from orchard.recipes.gui.image import build_image

        return build_image()

    def start_url(self) -> str:
        return f"{ORIGIN if self.http else 'file://' + FOLDER}/{self.first}"

    def serve(self, box: Sandbox) -> None:
        for name, html in self.pages.items():
            box.write_file(f"{FOLDER}/{name}", html)
        listening = "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8766))' 2>/dev/null"
        if self.http and box.exec(listening).exit_code:
            box.write_file("/tmp/stall.py", STALL_SERVER)
            box.exec("setsid python3 /tmp/stall.py >/dev/null 2>&1 </dev/null &")
            deadline = time.monotonic() + 20
            while box.exec(listening).exit_code:
                assert time.monotonic() < deadline, "the pages' server did not start"
                time.sleep(0.1)

    def finish(self, box: Sandbox, browser: Browser | None, answer: str, screenshots: list[str]) -> str:
        try:
            url = browser.url if browser is not None else None
        except OrchardError:
            url = None
        return json.dumps({"url": url, "answer": answer})

    def grade(self, client: Any, submission: str, image: str = "") -> Grade:
        return Grade(self.instance_id, "unresolved")

    def script(self, name: str) -> list[Step]:
        return [Step(**step) for step in self.steps]


def click(target: str) -> dict[str, Any]:
    return {"kind": "call", "tool": "click", "arguments": {"target": target}}


BUTTON = "style='position: absolute; left: 10px; top: 10px; width: 300px; height: 80px'"
PRESS = [click("#b"), {"kind": "submit", "content": "done"}]
HOSTILE = {
    "many": "<title>Many</title>" + f"<button id=b {BUTTON}>first</button>" + "<button>b</button>" * 10_000,
    "controls": "<title>Ctrl\x1b[31m\x07\x08</title>"
    f"<button id=b {BUTTON} aria-label='evil\x1b]0;pwned\x07\x00\x08name'>x</button>",
    "title": "<title>" + "T" * (1 << 20) + f"</title><button id=b {BUTTON}>b</button>",
    "popups": f'<title>Popups</title><button id=b {BUTTON} onclick="for (let i = 0; i < 200; i++)'
    " window.open('index.html?' + i)\">spam</button><script>setInterval(() => window.open('index.html'), 5)</script>",
    "alerts": f"<title>Alerts</title><button id=b {BUTTON} onclick='while (true) alert(1)'>alert</button>",
    "busy": f"<title>Busy</title><button id=b {BUTTON} onclick='while (true) {{}}'>busy</button>",
}
"""Hostile pages, each with a button `#b` the script clicks."""


@pytest.fixture(scope="module")
def pages_box(browser_box) -> Iterator[Sandbox]:
    """The browser sandbox with the pages' index, which popups open."""
    browser_box.write_file(f"{FOLDER}/index.html", "<title>Index</title><p>index</p>")
    return browser_box


def work(box: Sandbox, task: AttackPages, harness: str) -> tuple[Episode, float]:
    """The real loop: the scripted model plays `task.steps` through `harness` in `box`; the
    episode and how long it took."""
    worker = harness_factory(harness)()
    model = ScriptedModel("solution")
    started = time.monotonic()
    episode = run_episode(
        task, worker, model.session(task, worker), box, model_name=model.name, limits=Limits(episode_steps=10)
    )
    return episode, time.monotonic() - started


def texts(episode: Episode) -> list[str]:
    """Every text the model was shown or wrote: message contents and their text parts."""
    found = []
    for message in episode.messages:
        content = message.get("content")
        parts = content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
        found += [str(part.get("text", "")) for part in parts if part.get("type") == "text"]
    return found


def bounded(episode: Episode, took: float, seconds: float) -> None:
    """The episode ended in `seconds`, each step in 40, and each text it holds is bounded."""
    assert took < seconds, f"the episode took {took:.0f} s"
    assert all(step.duration < 40 for step in episode.steps), [step.duration for step in episode.steps]
    longest = max(texts(episode), key=len)
    assert len(longest) <= MOST_TEXT, f"a text of {len(longest)} characters: {longest[:200]!r}"


@pytest.mark.parametrize(
    ("name", "harness"),
    [
        ("many", "computer"),
        ("many", "bid"),
        ("controls", "computer"),
        ("controls", "bid"),
        ("title", "computer"),
        ("title", "bid"),
        ("popups", "computer"),
    ],
)
def test_a_hostile_page_keeps_every_step_bounded(pages_box, name, harness):
    task = AttackPages(instance_id=f"attack/{name}", pages={f"{name}.html": HOSTILE[name]}, first=f"{name}.html")
    task.steps = PRESS
    episode, took = work(pages_box, task, harness)
    assert episode.status == "completed", episode.error
    bounded(episode, took, 60)
    tabs = [text for text in texts(episode) if "\nTabs: " in text]
    assert tabs and all(text.split("\n")[1].count("] ") <= MAX_TABS for text in tabs)
    assert json.loads(episode.submission)["url"].endswith(f"{name}.html")


@pytest.mark.parametrize("name", ["alerts", "busy"])
def test_a_page_that_never_yields_aborts_the_episode_in_time_and_the_browser_goes_on(pages_box, name, monkeypatch):
    """An endless alert loop (each dialog accepted, the next one opening) or an endless script
    holds the tab's renderer: the click's command times out, the episode is aborted with the
    browser's error, the context is disposed, and the sandbox's Chromium serves the next task.
    The command timeout (`COMMAND_TIMEOUT`, 10 s in use) is 3 s here: the page burns a core while
    it is waited out."""
    monkeypatch.setattr(cdp_module, "COMMAND_TIMEOUT", 3.0)
    task = AttackPages(instance_id=f"attack/{name}", pages={f"{name}.html": HOSTILE[name]}, first=f"{name}.html")
    task.steps = PRESS
    episode, took = work(pages_box, task, "computer")
    assert episode.status == "aborted" and "did not answer" in str(episode.error), episode.error
    bounded(episode, took, 60)
    with Browser.launch(pages_box) as browser:
        assert browser.goto(f"file://{FOLDER}/index.html") and browser.title == "Index"


def test_beforeunload_does_not_keep_the_agent_on_a_page(pages_box):
    """The page asks to stay when left after a change; the dialog is accepted, and the agent's
    `goto` goes."""
    unload = (
        "<title>Unload</title><input id=q style='width: 300px; height: 40px'>"
        "<script>addEventListener('beforeunload', (e) => { e.preventDefault(); e.returnValue = 'stay'; })</script>"
    )
    task = AttackPages(instance_id="attack/unload", pages={"unload.html": unload}, first="unload.html")
    task.steps = [
        {"kind": "call", "tool": "write", "arguments": {"target": "#q", "text": "unsaved"}},
        {"kind": "call", "tool": "goto", "arguments": {"url": "index.html"}},
        {"kind": "submit", "content": "done"},
    ]
    episode, took = work(pages_box, task, "computer")
    assert episode.status == "completed", episode.error
    bounded(episode, took, 60)
    assert json.loads(episode.submission)["url"] == f"file://{FOLDER}/index.html"


def test_a_page_that_never_finishes_loading_costs_a_bounded_wait(pages_box, monkeypatch):
    """The goto waits out the browser's load timeout (`LOAD_TIMEOUT`, 20 s in use, 3 s here) and
    the episode goes on."""
    monkeypatch.setattr(browser_module, "LOAD_TIMEOUT", 3.0)
    task = AttackPages(instance_id="attack/stall", pages={"index.html": "<title>Index</title>"}, http=True)
    task.steps = [{"kind": "call", "tool": "goto", "arguments": {"url": "/stall"}}, PRESS[-1]]
    episode, took = work(pages_box, task, "bid")
    assert episode.status == "completed", episode.error
    bounded(episode, took, 60)
    assert f"opened {ORIGIN}/stall" in texts(episode)  # the goto's feedback, once its load timed out
    assert episode.steps[0].duration >= 3.0  # it did wait for the load


def test_an_outline_with_a_huge_label_is_clipped(pages_box):
    """A 5 MiB label and options of a megabyte: the outline's element lines are the host's, written
    from the checked `Element` (its name and options clipped in the page), so the bid view stays
    bounded rather than over the answer's bound (which would abort the episode at every view)."""
    options = "".join(f"<option>{letter * (1 << 20)}</option>" for letter in "abc")
    label = (
        f"<title>Label</title><label for=b>{'L' * (5 << 20)}</label><input id=b {BUTTON}>"
        f"<select style='position: absolute; top: 200px'>{options}</select>"
    )
    task = AttackPages(instance_id="attack/label", pages={"label.html": label}, first="label.html")
    task.steps = PRESS
    episode, took = work(pages_box, task, "bid")
    assert episode.status == "completed", episode.error
    bounded(episode, took, 90)


@pytest.fixture
def folder_task(pages_box) -> Iterator[AttackPages]:
    """A `file:` task whose folder is `FOLDER/inner/`, with a page beside the folder, not in it."""
    task = AttackPages(
        instance_id="attack/folder",
        first="inner/index.html",
        pages={
            "inner/index.html": "<title>Inner</title><p>in the folder</p>",
            "secret.html": "<title>Secret</title><p>outside the folder</p>",
            "inner/popup.html": f"<title>Opener</title><button id=b {BUTTON} "
            f"onclick=\"window.open('file://{FOLDER}/secret.html')\">open</button>",
        },
    )
    task.start(pages_box)
    yield task
    task.conclude(pages_box, [], [])


@pytest.mark.parametrize(
    "url",
    [
        f"file://{FOLDER}/inner/../secret.html",
        f"file://{FOLDER}/secret.html",
        "../secret.html",
        "file://localhost/etc/passwd",
        f"{ORIGIN}/inner/index.html",
    ],
)
def test_a_file_task_keeps_the_agent_in_its_folder(pages_box, folder_task, url):
    said = act(ComputerHarness(), pages_box, "goto_url", url=url)
    assert said.startswith("Error:"), said
    assert session_of(pages_box).browser.title == "Inner"


@pytest.mark.parametrize(
    "url",
    [
        f"file://{FOLDER}/inner/%2e%2e/secret.html",
        f"file://{FOLDER}/inner/.%2e/secret.html",
        f"file://{FOLDER}/inner/..\\secret.html",
    ],
)
def test_an_encoded_climb_does_not_leave_the_folder(pages_box, folder_task, url):
    said = act(ComputerHarness(), pages_box, "goto_url", url=url)
    assert said.startswith("Error:") and session_of(pages_box).browser.title == "Inner", said


def test_a_popup_off_the_task_is_not_the_agents_to_work(pages_box, folder_task):
    harness = ComputerHarness()
    browser = session_of(pages_box).browser
    assert browser.goto(f"file://{FOLDER}/inner/popup.html")
    act(harness, pages_box, "click", point_2d=[100, 30])
    assert [tab.url for tab in browser.tabs()][-1] == f"file://{FOLDER}/secret.html"  # the page opened it
    said = act(harness, pages_box, "switch_tab", tab_index=len(browser.tabs()) - 1)
    assert said.startswith("Error:") and browser.title != "Secret", said


# --- a hostile browser -----------------------------------------------------------------------------

FAKE_CHROMIUM = r'''
"""A fake Chromium on 127.0.0.1:9222: enough of the DevTools protocol for `Browser.launch` and one
tab; screenshots, scripts and targets answer as /tmp/mode says."""
import base64, hashlib, json, os, socket, struct, threading, zlib

def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

def png(width, height, idat):
    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")

def bomb():
    """Half a gigabyte of zeros deflated to half a megabyte: a hundred times what the image needs."""
    packer, zeros = zlib.compressobj(9), bytes(1 << 24)
    return b"".join(packer.compress(zeros) for _ in range(32)) + packer.flush()

SHOTS = {
    "huge": lambda: png(100_000, 100_000, zlib.compress(bytes(1000))),
    "bomb": lambda: png(1280, 1000, bomb()),
    "undecodable": lambda: png(1280, 1000, b"this is no deflate stream"),
    "jpeg": lambda: b"\xff\xd8\xff\xe0" + bytes(1000),
    "plain": lambda: png(1280, 1000, zlib.compress(bytes(1000 * (1 + 1280 * 4)))),
}
RECORD = {"bid": "1", "tag": "button", "role": "button", "name": "ok", "box": [1, 2, 3, 4], "value": None,
          "options": [], "checked": None}
ELEMENTS = {
    "not-a-list": '{"a": 1}',
    "too-many": json.dumps([dict(RECORD, bid=str(i)) for i in range(501)]),
    "box-of-text": json.dumps([dict(RECORD, box=[0, 0, "1", 1])]),
    "box-infinite": json.dumps([RECORD]).replace("[1, 2, 3, 4]", "[1e999, 2, 3, 4]"),
    "bid-not-ascii": json.dumps([dict(RECORD, bid="\u0661\u0662")]),
    "name-too-long": json.dumps([dict(RECORD, name="n" * 81)]),
    "checked-text": json.dumps([dict(RECORD, checked="yes")]),
    "options-nested": json.dumps([dict(RECORD, options=[["a"]])]),
    "deep": "[" * 100_000 + "]" * 100_000,
}
OUTLINES = {
    "outline-object": '{"lines": ["[1] button"]}',
    "outline-long": json.dumps("x" * (3 << 20)),
    "outline-over": json.dumps("x" * (5 << 20)),
}

def mode():
    with open("/tmp/mode") as f:
        return f.read().strip()

def result(message):
    """The JSON text of one command's result."""
    method, params, now = message["method"], message.get("params", {}), mode()
    page = {"targetId": "T1", "type": "page", "url": "http://127.0.0.1:8000/", "title": "Fake",
            "browserContextId": "CTX", "attached": True}
    if method == "Target.createBrowserContext":
        return '{"browserContextId": "CTX"}'
    if method == "Target.createTarget":
        return '{"targetId": "T1"}'
    if method == "Target.attachToTarget":
        return '{"sessionId": "S1"}'
    if method == "Target.getTargetInfo":
        if now == "long-title":
            page = dict(page, title="T" * (1 << 20), url="http://127.0.0.1:8000/" + "u" * 20_000)
        return json.dumps({"targetInfo": page})
    if method == "Target.getTargets":
        extra = [dict(page, targetId="P%d" % i) for i in range(5000)] if now == "targets-flood" else []
        return json.dumps({"targetInfos": [page] + extra})
    if method == "Page.captureScreenshot":
        if now == "unanswered" or (now == "unanswered-once" and not os.path.exists("/tmp/asked")):
            open("/tmp/asked", "w").close()
            return None  # no answer at all, as a capture asked while a navigation commits may get
        return json.dumps({"data": SHOT.get(now, SHOT["plain"])})
    if method == "Page.navigate":
        return '{"frameId": "T1"}'
    if method == "Runtime.evaluate":
        expression = params.get("expression", "")
        if expression == "big-int":
            return json.dumps({"result": {"type": "bigint", "unserializableValue": "9" * 100_000 + "n"}})
        if "'elements', null" in expression:
            value = ELEMENTS.get(now, "[]")
        elif "lines.push" in expression:
            value = OUTLINES.get(now, '""')
        else:
            value = "null"
        return '{"result": {"type": "object", "value": ' + value + "}}"
    return "{}"

def frames(conn, buffer):
    """The text frames the host sends (masked, as a client's are)."""
    def take(n):
        nonlocal buffer
        while len(buffer) < n:
            data = conn.recv(1 << 20)
            if not data:
                raise EOFError
            buffer += data
        out, buffer = buffer[:n], buffer[n:]
        return out
    while True:
        first, second = take(2)
        length = second & 0x7F
        if length == 126:
            length = struct.unpack(">H", take(2))[0]
        elif length == 127:
            length = struct.unpack(">Q", take(8))[0]
        mask = take(4) if second & 0x80 else bytes(4)
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(take(length)))
        if first & 0x0F == 8:
            return
        yield payload

def send(conn, text):
    data = text.encode()
    size = bytes([len(data)]) if len(data) < 126 else b"\x7e" + struct.pack(">H", len(data)) if len(data) < 65536 else b"\x7f" + struct.pack(">Q", len(data))
    conn.sendall(b"\x81" + size + data)

def serve(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        if not more:
            return
        data += more
    head, _, buffer = data.partition(b"\r\n\r\n")
    text = head.decode("latin-1")
    if text.startswith("GET /json/version"):
        body = json.dumps({"Browser": "Fake/1", "webSocketDebuggerUrl": "ws://127.0.0.1:9222/devtools/browser/fake"})
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (len(body), body.encode()))
        conn.close()
        return
    key = [line.split(":", 1)[1].strip() for line in text.split("\r\n") if line.lower().startswith("sec-websocket-key:")][0]
    accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
    conn.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  "Sec-WebSocket-Accept: " + accept + "\r\n\r\n").encode())
    try:
        for payload in frames(conn, buffer):
            message = json.loads(payload)
            session = ', "sessionId": ' + json.dumps(message["sessionId"]) if "sessionId" in message else ""
            answer = result(message)
            if answer is not None:
                send(conn, '{"id": %d, "result": %s%s}' % (message["id"], answer, session))
    except (EOFError, OSError):
        pass
    conn.close()

SHOT = {name: base64.b64encode(make()).decode() for name, make in SHOTS.items()}
server = socket.create_server(("127.0.0.1", 9222))
open("/tmp/fake-ready", "w").close()
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
'''


@pytest.fixture(scope="module")
def fake_chromium(client, base_image) -> Iterator[Sandbox]:
    """A `blocked` base-image sandbox (no Chromium in it) whose port 9222 is the fake's."""
    with client.create(base_image, network="blocked") as box:
        box.write_file("/tmp/fake.py", FAKE_CHROMIUM)
        box.write_file("/tmp/mode", "none")
        box.exec("setsid python3 /tmp/fake.py >/tmp/fake.log 2>&1 </dev/null &")
        deadline = time.monotonic() + 60
        while box.exec("test -e /tmp/fake-ready").exit_code:
            assert time.monotonic() < deadline, box.exec("cat /tmp/fake.log").stdout
            time.sleep(0.2)
        yield box


@pytest.fixture
def fake_browser(fake_chromium) -> Iterator[Browser]:
    fake_chromium.write_file("/tmp/mode", "none")
    with Browser.launch(fake_chromium, timeout=10) as browser:
        yield browser


def answering(box: Sandbox, mode: str) -> None:
    box.write_file("/tmp/mode", mode)


@pytest.mark.parametrize(
    ("mode", "says"),
    [("huge", "the screenshot is 100000x100000, not the 1280x1000 viewport"), ("jpeg", "the screenshot is not a PNG")],
)
def test_a_screenshot_the_host_cannot_size_is_refused(fake_chromium, fake_browser, mode, says):
    answering(fake_chromium, mode)
    with pytest.raises(BrowserError, match=says):
        fake_browser.screenshot()


def test_a_capture_left_unanswered_is_asked_once_more_and_then_is_the_browsers_timeout(
    fake_chromium, fake_browser, monkeypatch
):
    """A capture asked as a navigation commits may never be answered (seen on a loaded machine);
    it is asked again once the page settled, and a second silence is the browser's timeout."""
    monkeypatch.setattr(browser_module, "SCREENSHOT_TIMEOUT", 1.0)
    fake_chromium.exec("rm -f /tmp/asked")
    answering(fake_chromium, "unanswered-once")
    assert fake_browser.screenshot().startswith(b"\x89PNG")
    answering(fake_chromium, "unanswered")
    started = time.monotonic()
    with pytest.raises(BrowserTimeout, match=r"did not answer Page\.captureScreenshot within 1 s"):
        fake_browser.screenshot()
    assert 2 <= time.monotonic() - started < 2 + 5 + 3  # two captures, one settle between them


def bomb_png(width: int, height: int) -> bytes:
    """A PNG that claims `width` x `height` and holds next to nothing."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(1000))) + chunk(b"IEND", b"")
    )


def test_a_deflate_bomb_of_the_viewports_size_decodes_only_what_the_size_needs(fake_chromium, fake_browser, tmp_path):
    """The host checks a screenshot's signature and size, never its pixels: a bomb that claims the
    viewport's size passes, and every decoder of the host (the TUI's picture, the vision model's
    images) stops at the pixels that size holds."""
    from orchard.agents.vision import png_image

    answering(fake_chromium, "bomb")
    png = fake_browser.screenshot()
    assert len(png) < 1 << 20
    (tmp_path / "bomb.png").write_bytes(png)
    started = time.monotonic()
    assert half_blocks(tmp_path / "bomb.png", 40).plain.startswith("▀" * 40)
    assert png_image(png).size == (1280, 1000)
    assert time.monotonic() - started < 5


def test_a_screenshot_that_does_not_decode_is_named_not_drawn(fake_chromium, fake_browser, tmp_path):
    from orchard.agents.vision import png_image

    answering(fake_chromium, "undecodable")
    png = fake_browser.screenshot()  # its signature and size are right: what the browser check covers
    (tmp_path / "broken.png").write_bytes(png)
    assert "cannot be drawn: broken data stream" in half_blocks(tmp_path / "broken.png").plain
    with pytest.raises(ValueError, match="broken PNG"):
        png_image(png)


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("not-a-list", "element list is not a list of at most 500"),
        ("too-many", "element list is not a list of at most 500"),
        ("box-of-text", "bad box"),
        ("box-infinite", "bad box"),
        ("bid-not-ascii", "bad bid"),
        ("name-too-long", "bad name"),
        ("checked-text", "bad checked"),
        ("options-nested", "bad options"),
    ],
)
def test_an_element_list_of_the_wrong_shape_is_refused(fake_chromium, fake_browser, mode, says):
    answering(fake_chromium, mode)
    with pytest.raises(BrowserError, match=says):
        fake_browser.elements()
    answering(fake_chromium, "none")
    assert fake_browser.elements() == []  # a refused answer leaves the connection as it was


def test_a_value_nested_too_deep_ends_the_connection_with_its_reason(fake_chromium, fake_browser):
    answering(fake_chromium, "deep")
    with pytest.raises(BrowserError, match="not JSON"):
        fake_browser.elements()
    started = time.monotonic()
    with pytest.raises(BrowserError, match="not JSON"):  # every later command fails at once, naming why
        fake_browser.screenshot()
    assert time.monotonic() - started < 1


def test_an_unserializable_value_past_its_bound_is_none(fake_browser):
    assert fake_browser.evaluate("big-int") is None


class FakeSiteTask(BrowserTask):
    """A browser task on the fake Chromium: its start page "opens" (the fake answers any navigation)."""

    kind: str = "gui-attack-fake"
    problem_statement: str = "Look."

    def sandbox_image(self, prepare: Any) -> str:
        return images.build_base()

    def start_url(self) -> str:
        return SITE + "/"

    def finish(self, box: Sandbox, browser: Browser | None, answer: str, screenshots: list[str]) -> str:
        return "{}"

    def grade(self, client: Any, submission: str, image: str = "") -> Grade:
        return Grade(self.instance_id, "unresolved")


@pytest.fixture
def fake_session(fake_chromium) -> Iterator[Sandbox]:
    answering(fake_chromium, "none")
    task = FakeSiteTask(instance_id="attack/fake")
    task.start(fake_chromium)
    yield fake_chromium
    task.conclude(fake_chromium, [], [])


def test_an_outline_of_the_wrong_type_or_size_is_clipped_or_refused(fake_session):
    harness = BidHarness()
    answering(fake_session, "outline-object")
    assert harness.view(fake_session)[0]["text"].endswith("[an empty page]")
    answering(fake_session, "outline-long")
    shown = harness.view(fake_session)[0]["text"]
    assert len(shown) <= OUTLINE_CHARS + 200 and "xxxx" in shown
    answering(fake_session, "outline-over")
    with pytest.raises(BrowserError, match=r"answer to Runtime\.evaluate is over 4194304 bytes"):
        harness.view(fake_session)
    answering(fake_session, "none")
    assert harness.view(fake_session)[0]["text"].startswith(f"URL: {SITE}/")


def test_a_title_and_url_of_any_length_are_clipped(fake_session):
    """A real Chromium clips a title to 4096 characters itself; the host does not count on it."""
    answering(fake_session, "long-title")
    browser = session_of(fake_session).browser
    assert len(browser.title) <= 1000 and len(browser.url) <= 8192
    for view in (ComputerHarness().view(fake_session)[0]["text"], BidHarness().view(fake_session)[0]["text"]):
        assert len(view) < 8192 + 400 and "T" * 41 not in view, view[:500]  # the URL line, the tabs


def test_a_flood_of_tabs_is_cut_to_the_bound_in_bounded_time(fake_chromium, fake_browser):
    answering(fake_chromium, "targets-flood")  # 5000 pages of this context, which nothing closes
    started = time.monotonic()
    assert len(fake_browser.tabs()) == MAX_TABS
    assert time.monotonic() - started < 60


# --- a hostile exec agent ----------------------------------------------------------------------------

TUNNEL_OPEN = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: orchard-tunnel\r\nConnection: Upgrade\r\n\r\n"
HEADS = {
    "not-http": b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
    "long-head": b"HTTP/1.1 101 Switching Protocols\r\nX: " + b"y" * (TUNNEL_MAX_HEAD + 10),
    "other-upgrade": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
}
"""What a fake agent answers `/connect` with, in these modes."""


def _head(conn: socket.socket) -> bool:
    """Read a request's head off `conn` (its body, when it has one, comes in the same read); False
    when the peer closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        if not more:
            return False
        data += more
    return True


class FakeAgent:
    """An exec agent on a Unix socket of the host that answers `/connect` as `mode` says. A
    sandbox cannot put one in its own agent's place (its run folder is read-only to it), so this is
    the agent that hostile would be. `garbage`: the tunnel opens and the WebSocket's request is
    answered with garbage; `gone`: the tunnel opens and closes at once; `mute`: nothing, ever."""

    def __init__(self, path: Path):
        self.mode = "garbage"
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(8)
        self.connections: list[socket.socket] = []
        self.done = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()
        channel = AgentChannel(AgentEndpoint(token="fake", uds=str(path)))
        self.box = Sandbox("fake-agent", "none", channel, AgentCalls(), on_delete=lambda _id: None)

    def _accept(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections.append(conn)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            if not _head(conn):
                return
            mode = self.mode
            if mode in HEADS:
                conn.sendall(HEADS[mode])
            elif mode == "trickle":  # a head that never ends, a byte at a time
                while not self.done.wait(0.5):
                    conn.sendall(b"X")
            elif mode != "mute":
                conn.sendall(TUNNEL_OPEN)
                if mode.startswith("garbage") and _head(conn):  # the answer to the WebSocket's request
                    conn.sendall(b"\x00\xff not a WebSocket's answer\r\n\r\n" + os.urandom(4096))
                elif mode == "endless-handshake":  # a WebSocket answer whose headers never end
                    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\n")
                    while not self.done.wait(0.01):
                        conn.sendall(b"X-Again: and again\r\n")
            if mode not in ("garbage", "gone"):
                self.done.wait()  # the connection stays open, saying nothing more

    def close(self) -> None:
        """Stop answering: the listener and every connection shut down (which wakes their threads)."""
        self.done.set()
        for sock in [self.server, *self.connections]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.server.close()


@pytest.fixture
def fake_agent(tmp_path) -> Iterator[FakeAgent]:
    agent = FakeAgent(tmp_path / "agent.sock")
    yield agent
    agent.close()


@pytest.mark.parametrize(
    ("mode", "error", "says"),
    [
        ("garbage", BrowserError, "refused the DevTools WebSocket"),
        ("garbage-kept-open", BrowserTimeout, "did not finish the DevTools handshake within 2 s"),
        ("silent", BrowserTimeout, "did not finish the DevTools handshake within 2 s"),
        ("endless-handshake", BrowserError, "DevTools"),
        ("not-http", AgentError, "is not HTTP"),
        ("long-head", AgentError, f"head over {TUNNEL_MAX_HEAD} bytes"),
        ("other-upgrade", AgentError, "switched /connect to 'websocket'"),
    ],
)
def test_an_agent_that_answers_connect_with_garbage_is_a_clear_error_in_time(fake_agent, mode, error, says):
    fake_agent.mode = mode
    started = time.monotonic()
    with pytest.raises(error, match=says):
        CDPConnection.open(fake_agent.box.connect(9222, timeout=2), "/devtools/browser/x", timeout=2)
    assert time.monotonic() - started < 2 + 3


def test_a_stream_that_closes_at_once_is_a_browser_error(fake_agent):
    fake_agent.mode = "gone"
    with pytest.raises(BrowserError):
        CDPConnection.open(fake_agent.box.connect(9222, timeout=2), "/devtools/browser/x", timeout=2)


ALLOWANCE = 1.0
"""The agent's connect allowance in the two tests below (`EXPOSE_CONNECT_SECONDS`, 10 s in use):
the bound they check is the caller's timeout plus that allowance, whatever it is."""


def test_an_agent_that_never_answers_connect_is_an_agent_error(fake_agent, monkeypatch):
    monkeypatch.setattr(client_module, "EXPOSE_CONNECT_SECONDS", ALLOWANCE)
    fake_agent.mode = "mute"
    started = time.monotonic()
    with pytest.raises(AgentError):
        fake_agent.box.connect(9222, timeout=1)
    assert time.monotonic() - started < 1 + ALLOWANCE + 3


def test_an_agent_that_trickles_its_answer_is_cut_off_in_time(fake_agent, monkeypatch):
    monkeypatch.setattr(client_module, "EXPOSE_CONNECT_SECONDS", ALLOWANCE)
    fake_agent.mode = "trickle"
    failed: list[BaseException] = []

    def connect() -> None:
        try:
            fake_agent.box.connect(9222, timeout=2)
        except BaseException as exc:  # whatever it is, the assertion names it
            failed.append(exc)

    caller = threading.Thread(target=connect, daemon=True)
    caller.start()
    caller.join(2 + ALLOWANCE + 5)  # its timeout, the agent's connect allowance, slack
    still_waiting = caller.is_alive()
    fake_agent.close()  # ends the trickle: the caller then sees the connection close
    caller.join(10)
    assert not still_waiting and isinstance(failed[0], AgentError)


# --- the store and the TUI ------------------------------------------------------------------------


def stored(path: Path, digest: str) -> list[dict[str, Any]]:
    """A stored message naming an image by hash and path, as `store_images` writes it."""
    part = {"type": "image_url", "image_url": {"url": IMAGE_URL + digest}, "path": str(path)}
    return [{"role": "user", "content": [part]}]


def test_a_stored_image_is_inlined_only_when_its_file_has_its_hash(tmp_path):
    elsewhere = tmp_path / "not-the-runs-folder.txt"
    elsewhere.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    right = hashlib.sha256(elsewhere.read_bytes()).hexdigest()
    wrong = stored(elsewhere, "0" * 64)
    assert load_images(wrong) == wrong  # a reference it stays
    inlined = load_images(stored(elsewhere, right))[0]["content"][0]["image_url"]["url"]
    assert inlined.startswith("data:image/png;base64,")  # the hash names these bytes: the documented trust


def test_a_stored_image_that_is_no_file_is_not_read(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    loaded: list[Any] = []
    reader = threading.Thread(target=lambda: loaded.append(load_images(stored(fifo, "0" * 64))), daemon=True)
    reader.start()
    reader.join(5)
    blocked = reader.is_alive()
    while reader.is_alive():  # open the other end, so that the reader gets its end of file
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            time.sleep(0.05)
        reader.join(0.1)
    assert not blocked


def test_a_picture_too_large_to_draw_is_named(tmp_path):
    (tmp_path / "large.png").write_bytes(bomb_png(5000, 5000))
    started = time.monotonic()
    assert half_blocks(tmp_path / "large.png").plain == f"[{tmp_path / 'large.png'}: 5000x5000 is too large to draw]"
    assert time.monotonic() - started < 1


def test_a_picture_past_pils_own_bound_is_named_too(tmp_path):
    (tmp_path / "bomb.png").write_bytes(bomb_png(20_000, 20_000))
    assert "is too large to draw" in half_blocks(tmp_path / "bomb.png").plain


def test_the_vision_models_decoder_refuses_a_bomb_with_a_value_error():
    from orchard.agents.vision import png_image

    with pytest.raises(ValueError, match="an image part is too large"):
        png_image(bomb_png(20_000, 20_000))


# --- grades from forged submissions -----------------------------------------------------------------

CANCEL = {"endpoint": "/cancel", "method": "POST", "query": {}, "request_body": {"code": "LB-4M2X"}, "status": 200}


def test_a_gui_grade_takes_the_log_as_what_the_site_did_but_never_its_statuses():
    """The documented trust boundary: the log is the site's record of the browser's requests, so a
    log of a call the agent never made grades as if it had (the agent has only the browser, and
    the log is behind a token the browser never sees). The replay gives each request its own
    status: a forged 200 for a request the site refuses changes nothing."""
    task = TASKS["gui-booking-cancel-thursday"]
    assert isinstance(task, GuiTask)
    forged = task.grade(None, json.dumps({"log": [{**CANCEL, "status": 500}], "answer": ""}))
    assert forged.resolved and forged.score == 1.0
    # the second cancel is refused (422: cancelled already), whatever status the log claims, so the
    # check "cancelled one booking" (done once, at most) still holds
    twice = task.grade(None, json.dumps({"log": [CANCEL, CANCEL], "answer": ""}))
    assert twice.resolved, twice.checks


@pytest.mark.parametrize(
    ("submission", "says"),
    [
        ('{"log": [{"endpoint": 5, "method": "POST"}], "answer": ""}', "its endpoint is not a path"),
        ('{"log": [{"endpoint": "/cancel", "method": "POST", "status": NaN}], "answer": ""}', "status is not a number"),
        ('{"log": "all of it", "answer": ""}', "not a list of requests"),
        (json.dumps({"log": [CANCEL] * (MAX_LOG + 1), "answer": ""}), f"a site logs at most {MAX_LOG}"),
        ('{"log": [], "answer": 5}', "its answer is not text"),
        ("[" * 100_000, "not a site log"),
        ("[1, 2]", "not a JSON object"),
    ],
)
def test_a_gui_log_of_the_wrong_shape_or_size_grades_unresolved_naming_it(submission, says):
    grade = TASKS["gui-booking-cancel-thursday"].grade(None, submission)
    assert grade.outcome == "unresolved" and not grade.resolved and says in str(grade.error), grade.error


def miniwob_submission(**changes: str) -> str:
    """A well-formed MiniWoB submission of click-button, seed 0, its page's numbers replaced by raw JSON."""
    page = {"env": "click-button", "seed": 0, "done": True, "reward": 1, "raw_reward": 1, "reason": None}
    text = json.dumps({"env": "click-button", "seed": 0, "answer": "", "page": {**page, "episodes": 1}})
    for key, raw in changes.items():
        text = text.replace(f'"{key}": 1', f'"{key}": {raw}', 1)
    return text


@pytest.fixture(scope="module")
def click_button() -> MiniWobTask:
    """MiniWoB's click-button, seed 0 (its page names come from the wheel, fetched once)."""
    return MiniWobTask(instance_id="miniwob/click-button/0", env="click-button", seed=0)


@pytest.mark.parametrize("key", ["raw_reward", "reward"])
@pytest.mark.parametrize("raw", ["1e309", "-1e309", "NaN", "Infinity", '"1"', "[1]", "null"])
def test_a_miniwob_reward_that_is_no_finite_number_is_an_error_grade(click_button, key, raw):
    grade = click_button.grade(None, miniwob_submission(**{key: raw}))
    assert grade.outcome == "error" and not grade.resolved
    assert f"`{key}` is not a number" in str(grade.error), grade.error


def test_a_miniwob_reward_of_a_huge_integer_is_an_error_grade(click_button):
    grade = click_button.grade(None, miniwob_submission(raw_reward="1" + "0" * 400))
    assert grade.outcome == "error"


@pytest.mark.parametrize("harness", HARNESSES)
def test_a_huge_integer_argument_is_a_format_error(harness):
    call = ToolCall("call_1", "wait", '{"seconds": 1' + "0" * 400 + "}")
    with pytest.raises(FormatError, match="must be"):
        HARNESSES[harness]().parse(Reply(content="", tool_calls=[call]))
