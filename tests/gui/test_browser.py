"""The host's browser driver (`orchard.recipes.gui.browser`) on a real Chromium in a real `blocked` sandbox.

Small pages are written into the sandbox as files and opened as `file://` (one is served by a
stdlib HTTP server on the sandbox's loopback, for cookies); the host reaches the browser only
through the exec agent. Each test gets a fresh browser context of the module's one Chromium.
Then a fake DevTools endpoint (a small Python server on port 9222 of a base-image sandbox) speaks
garbage, frames over the bound, or nothing at all, and the host gives a clear error in time.
"""

from __future__ import annotations

import base64
import struct
import time
import zlib
from collections.abc import Iterator

import pytest

from orchard.errors import InvalidRequest
from orchard.recipes.gui import browser as browser_module
from orchard.recipes.gui.browser import Browser, check_png
from orchard.recipes.gui.cdp import BrowserError, BrowserTimeout

PAGES = "/tmp/pages"
HTTP_PORT = 8765

BUTTONS = """<!doctype html><title>Buttons</title>
<style>body { margin: 0; font: 16px sans-serif } div, button { position: absolute; width: 120px; height: 40px }</style>
<button id="inc" style="left: 100px; top: 50px" onclick="this.textContent = 'Clicked ' + (++window.n)">Buy now</button>
<button id="dbl" style="left: 300px; top: 50px" ondblclick="this.textContent = 'Doubled'">Double me</button>
<div id="ctx" style="left: 500px; top: 50px" oncontextmenu="event.preventDefault(); this.textContent = 'Right'">Right me</div>
<div id="hov" style="left: 700px; top: 50px" onmouseover="this.textContent = 'Hovered'">Hover me</div>
<a id="far" href="form.html" style="position: absolute; left: 100px; top: 3000px">Far away</a>
<p style="position: absolute; left: 100px; top: 200px">Just text</p>
<script>window.n = 0</script>
"""
FORM = """<!doctype html><title>Form</title>
<form action="done.html">
  <label for="q">Query</label> <input id="q" name="q" placeholder="Search the shop">
  <input id="gift" type="checkbox" name="gift" checked aria-label="Gift wrap">
  <select id="size" name="size" aria-label="Size"><option>S</option><option selected>M</option><option>L</option></select>
  <textarea id="note" name="note" placeholder="A note"></textarea>
  <button id="go">Go</button>
</form>
"""
DONE = """<!doctype html><title>Done</title><p id="out"></p><script>out.textContent = location.search</script>"""
MOTION = """<!doctype html><title>Motion</title>
<style>body { margin: 0 } #tall { height: 5000px }</style>
<input id="range" type="range" min="0" max="100" value="0" style="position: absolute; left: 100px; top: 100px; width: 200px">
<div id="box" style="position: absolute; left: 100px; top: 300px; width: 50px; height: 50px; background: teal"></div>
<div id="tall"></div>
<script>
  const box = document.getElementById('box'); let grab = null;
  box.addEventListener('mousedown', (e) => { grab = [e.clientX - box.offsetLeft, e.clientY - box.offsetTop]; });
  document.addEventListener('mousemove', (e) => {
    if (grab) { box.style.left = (e.clientX - grab[0]) + 'px'; box.style.top = (e.clientY - grab[1]) + 'px'; }
  });
  document.addEventListener('mouseup', () => { grab = null; });
</script>
"""
POPUP = """<!doctype html><title>Opener</title>
<button id="pop" style="width: 200px; height: 50px" onclick="window.open('done.html?from=popup')">Open a popup</button>
"""
SETTLE = """<!doctype html><title>Settle</title>
<style>button { position: absolute; width: 200px; height: 50px }</style>
<button id="paint" style="left: 100px; top: 50px" onclick="requestAnimationFrame(() => this.textContent = 'painted')">Paint</button>
<button id="away" style="left: 400px; top: 50px" onclick="location.href = 'done.html?from=settle'">Away</button>
"""
FILES = {
    "buttons.html": BUTTONS,
    "form.html": FORM,
    "done.html": DONE,
    "motion.html": MOTION,
    "popup.html": POPUP,
    "settle.html": SETTLE,
}


def page(name: str) -> str:
    return f"file://{PAGES}/{name}"


@pytest.fixture(scope="module")
def pages(browser_box):
    """The test pages, as files in the sandbox, and served on its loopback for the cookie test."""
    for name, html in FILES.items():
        browser_box.write_file(f"{PAGES}/{name}", html)
    browser_box.exec(
        f"setsid python3 -m http.server {HTTP_PORT} --bind 127.0.0.1 --directory {PAGES} >/dev/null 2>&1 </dev/null &"
    )
    return browser_box


@pytest.fixture
def browser(pages) -> Iterator[Browser]:
    with Browser.launch(pages) as browser:
        yield browser


def png_size(png: bytes) -> tuple[int, int]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", png[16:24])


# --- launch, contexts, screenshots ---------------------------------------------------------------


def test_a_screenshot_is_a_png_of_exactly_the_viewport(pages):
    with Browser.launch(pages) as browser:
        assert png_size(browser.screenshot()) == (1280, 1000)
        assert len(browser.tabs()) == 1 and browser.url == "about:blank"
    with Browser.launch(pages, viewport=(640, 480)) as small:
        small.goto(page("buttons.html"))
        assert png_size(small.screenshot()) == (640, 480)
        assert small.evaluate("[innerWidth, innerHeight, devicePixelRatio]") == [640, 480, 1]


def test_a_second_launch_reuses_the_browser_with_a_fresh_context(pages):
    site = f"http://127.0.0.1:{HTTP_PORT}/done.html"
    first = Browser.launch(pages)
    oldest = pages.exec("pgrep -o -x chromium").stdout.strip()
    assert first.goto(site)
    first.evaluate("document.cookie = 'session=first; max-age=3600'; localStorage.setItem('cart', 'lamp')")
    assert first.evaluate("[document.cookie, localStorage.getItem('cart')]") == ["session=first", "lamp"]
    with Browser.launch(pages) as second:
        assert pages.exec("pgrep -o -x chromium").stdout.strip() == oldest  # the same Chromium
        assert second.goto(site)
        assert second.evaluate("[document.cookie, localStorage.getItem('cart')]") == ["", None]
        assert len(second.tabs()) == 1
    assert first.evaluate("document.cookie") == "session=first"  # the second's close left the first alone
    first.close()
    first.close()  # idempotent
    with pytest.raises(BrowserError, match="closed"):
        first.screenshot()


def test_a_screenshot_of_the_wrong_size_is_refused(browser):
    """The host checks what the browser sends: a page whose size was changed behind the
    driver's back gives a screenshot that is not the viewport's, and it is refused."""
    browser._send(
        "Emulation.setDeviceMetricsOverride", {"width": 500, "height": 400, "deviceScaleFactor": 1, "mobile": False}
    )
    with pytest.raises(BrowserError, match="the screenshot is 500x400, not the 1280x1000 viewport"):
        browser.screenshot()


def tiny_png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x00\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def test_check_png_takes_the_viewport_size_only():
    good = tiny_png(4, 3)
    assert check_png(base64.b64encode(good).decode(), (4, 3)) == good
    with pytest.raises(BrowserError, match="3x4, not the 4x3 viewport"):
        check_png(base64.b64encode(tiny_png(3, 4)).decode(), (4, 3))
    with pytest.raises(BrowserError, match="not a PNG"):
        check_png(base64.b64encode(b"GIF89a" + b"\x00" * 40).decode(), (4, 3))
    with pytest.raises(BrowserError, match="not valid base64"):
        check_png("not base64 at all!", (4, 3))
    with pytest.raises(BrowserError, match="at most"):
        check_png("A" * (23 * 2**20), (4, 3))  # refused before it is decoded


# --- the mouse ---------------------------------------------------------------------------------


def test_clicks_double_clicks_and_right_clicks_reach_the_page(browser):
    assert browser.goto(page("buttons.html")) and browser.title == "Buttons"
    browser.click(160, 70)
    browser.click(160, 70)
    browser.settle()
    assert browser.evaluate("document.getElementById('inc').textContent") == "Clicked 2"
    browser.click(360, 70, clicks=2)
    browser.click(560, 70, button="right")
    assert browser.evaluate("[dbl.textContent, ctx.textContent, n]") == ["Doubled", "Right", 2]
    assert browser.evaluate("navigator.userActivation.hasBeenActive") is True  # trusted input, as a person's
    with pytest.raises(InvalidRequest, match="outside the 1280x1000 viewport"):
        browser.click(1300, 10)
    with pytest.raises(InvalidRequest, match="button must be one of"):
        browser.click(10, 10, button="fourth")


def test_hover_scroll_and_drag(browser):
    browser.goto(page("buttons.html"))
    browser.hover(760, 70)
    assert browser.evaluate("hov.textContent") == "Hovered"
    browser.goto(page("motion.html"))
    browser.scroll(0, 600)
    browser.settle()
    assert browser.evaluate("scrollY") == 600
    browser.scroll(0, -600, at=(640, 500))
    browser.settle()
    assert browser.evaluate("scrollY") == 0
    browser.drag((102, 108), (298, 108))  # the range's thumb, from its left end to its right end
    assert int(browser.evaluate("document.getElementById('range').value")) >= 95
    browser.drag((125, 325), (425, 525), steps=5)  # a box that follows mouse moves
    assert browser.evaluate("[box.offsetLeft, box.offsetTop]") == [400, 500]


# --- the keyboard ------------------------------------------------------------------------------


def test_typing_clearing_and_keys(browser):
    browser.goto(page("form.html"))
    field = browser.locate("#q")
    assert field is not None and field.name == "Query"
    browser.click(*field.center)
    browser.insert_text("desk lamp")
    focused = browser.focused()
    assert focused is not None and (focused.tag, focused.value, focused.bid) == ("input", "desk lamp", field.bid)
    browser.clear_focused()
    assert browser.focused().value == ""
    browser.insert_text("lamp")
    browser.press(["ctrl", "a"], hotkey=True)
    browser.press(["Backspace"])
    assert browser.focused().value == ""
    browser.press(["shift", "x"], hotkey=True)
    browser.press(["y", "ArrowLeft", "z"])
    assert browser.focused().value == "Xzy"
    browser.press(["Tab"])
    assert browser.focused().bid == browser.locate("#gift").bid
    browser.press(["Space"])
    assert browser.locate("#gift").checked is False
    before = browser.navigations
    browser.click(*browser.locate("#q").center)
    browser.press(["Enter"])
    browser.settle()
    assert browser.navigations == before + 1
    assert browser.url == page("done.html") + "?q=Xzy&size=M&note="
    assert browser.back() and browser.url == page("form.html")
    with pytest.raises(InvalidRequest, match="no key 'Hyper'"):
        browser.press(["Hyper"])


def test_settle_waits_for_what_an_action_started_to_show(browser):
    """After a click, `settle` returns once the page has rendered what the click changed (here in
    the next animation frame) and once a navigation it started has loaded: the page read right
    after is the changed one. Without a wait, both reads see the page before."""
    for _ in range(3):
        browser.goto(page("settle.html"))
        browser.click(200, 75)
        browser.settle()
        assert browser.evaluate("document.getElementById('paint').textContent") == "painted"
        browser.click(500, 75)
        browser.settle()
        assert browser.evaluate("[location.search, document.readyState, out.textContent]") == [
            "?from=settle", "complete", "?from=settle",
        ]  # fmt: skip


def test_a_dialog_does_not_stall_the_page(browser):
    browser.goto(page("buttons.html"))
    browser.evaluate("document.getElementById('inc').onclick = () => { alert('hi'); window.after = confirm('ok?'); }")
    browser.click(160, 70)
    browser.settle()
    assert browser.evaluate("window.after") is True


# --- tabs --------------------------------------------------------------------------------------


def test_tabs_open_switch_and_close(browser):
    browser.goto(page("buttons.html"))
    browser.new_tab(page("form.html"))
    tabs = browser.tabs()
    assert [(tab.index, tab.title, tab.active) for tab in tabs] == [(0, "Buttons", False), (1, "Form", True)]
    assert browser.title == "Form" and png_size(browser.screenshot()) == (1280, 1000)
    browser.switch_tab(0)
    assert browser.title == "Buttons" and [tab.active for tab in browser.tabs()] == [True, False]
    browser.switch_tab(1)
    browser.close_tab()
    assert [tab.title for tab in browser.tabs()] == ["Buttons"] and browser.title == "Buttons"
    browser.close_tab()  # the last one: a fresh blank tab takes its place
    assert [tab.url for tab in browser.tabs()] == ["about:blank"]
    with pytest.raises(InvalidRequest, match="there is no tab 3"):
        browser.switch_tab(3)


def test_a_popup_shows_up_in_the_tabs(browser):
    browser.goto(page("popup.html"))
    browser.click(100, 25)
    browser.settle()
    deadline = time.monotonic() + 5
    while len(browser.tabs()) < 2 and time.monotonic() < deadline:
        browser.settle()
    tabs = browser.tabs()
    assert tabs[0].title == "Opener" and tabs[1].url == page("done.html") + "?from=popup"
    assert tabs[0].active
    browser.switch_tab(1)
    assert browser.evaluate("out.textContent") == "?from=popup"
    assert png_size(browser.screenshot()) == (1280, 1000)  # the popup gets the viewport too


def test_tabs_are_capped_and_extra_popups_closed(browser, monkeypatch):
    monkeypatch.setattr(browser_module, "MAX_TABS", 4)  # the cap's workings, with fewer tabs to open
    browser.goto(page("popup.html"))
    for _ in range(2):
        browser.new_tab()
    browser._cdp.send("Target.createTarget", {"url": "about:blank", "browserContextId": browser._context})
    assert len(browser.tabs()) == 4
    with pytest.raises(InvalidRequest, match="at most 4 tabs"):
        browser.new_tab()
    browser.switch_tab(0)
    browser.click(100, 25)  # a popup past the cap
    time.sleep(0.5)
    browser.settle()
    assert len(browser.tabs()) == 4 and browser.tabs()[0].active


# --- the page's elements -----------------------------------------------------------------------


def test_elements_of_a_known_page(browser):
    browser.goto(page("buttons.html"))
    found = {element.name: element for element in browser.elements()}
    assert set(found) == {"Buy now", "Double me"}  # divs with handlers are not interactive; far and text not shown
    buy = found["Buy now"]
    assert (buy.tag, buy.role, buy.box) == ("button", "button", (100.0, 50.0, 120.0, 40.0))
    assert buy.center == (160.0, 70.0)
    assert browser.evaluate("document.getElementById('inc').dataset.orchardBid") == buy.bid
    assert [e.bid for e in browser.elements()] == [e.bid for e in found.values()]  # stable
    assert browser.element_at(*buy.center) == buy
    assert browser.element_at(150, 210) is None

    browser.goto(page("form.html"))
    form = {(element.tag, element.role): element for element in browser.elements()}
    assert [(tag, role, element.name) for (tag, role), element in form.items()] == [
        ("label", "label", "Query"),
        ("input", "textbox", "Query"),  # named by its label
        ("input", "checkbox", "Gift wrap"),
        ("select", "combobox", "Size"),
        ("textarea", "textbox", "A note"),  # by its placeholder
        ("button", "button", "Go"),
    ]
    assert form["input", "textbox"].value == "" and form["input", "checkbox"].checked is True
    assert form["select", "combobox"].value == "M" and form["select", "combobox"].options == ("S", "M", "L")


def test_locate_scrolls_the_element_into_view(browser):
    browser.goto(page("buttons.html"))
    far = browser.locate("#far")
    assert far is not None and far.name == "Far away" and browser.evaluate("scrollY") > 2000
    _, top, _, height = far.box
    assert top >= 0 and top + height <= 1000
    assert browser.element_at(*far.center) == far
    assert browser.locate({"js": "document.querySelectorAll('button')[1]"}).name == "Double me"
    assert browser.locate("#nothing") is None and browser.locate({"js": "null"}) is None
    with pytest.raises(InvalidRequest, match="not a valid CSS selector"):
        browser.locate("button[")
    browser.evaluate("document.body.insertAdjacentHTML('beforeend', '<button>New</button>')")
    bids = [int(e.bid) for e in browser.elements()]
    assert len(set(bids)) == len(bids)


def test_a_page_that_forges_bids_gets_unique_ones(browser):
    browser.goto(page("buttons.html"))
    browser.evaluate("for (const b of document.querySelectorAll('button')) b.dataset.orchardBid = '7'")
    bids = [e.bid for e in browser.elements()]
    assert len(bids) == 2 and len(set(bids)) == 2
    browser.evaluate(
        "window.__orchardBid = 1e300; for (const b of document.querySelectorAll('button')) b.dataset.orchardBid = 'x'"
    )
    bids = [e.bid for e in browser.elements()]
    assert len(set(bids)) == 2 and all(len(bid) <= 3 for bid in bids)


def test_evaluate_takes_json_only(browser):
    assert browser.evaluate("({a: [1, 'two', null, true]})") == {"a": [1, "two", None, True]}
    assert browser.evaluate("Promise.resolve(42)") == 42
    assert browser.evaluate("undefined") is None
    assert browser.evaluate("-Infinity") == float("-inf") and browser.evaluate("10n ** 20n") == 10**20
    with pytest.raises(BrowserError, match="the script threw: Error: boom"):
        browser.evaluate("(() => { throw new Error('boom') })()")
    with pytest.raises(BrowserTimeout, match=r"did not finish within 0\.5 s"):
        browser.evaluate("while (true) {}", timeout=0.5)
    with pytest.raises(BrowserError, match=r"answer to Runtime\.evaluate is over 4194304 bytes"):
        browser.evaluate("'x'.repeat(5 * 2 ** 20)")
    assert browser.evaluate("1 + 1") == 2  # the page lives on after both


# --- a browser that dies -----------------------------------------------------------------------


def test_a_browser_that_dies_is_a_clear_error_and_a_new_one_starts(client, browser_image):
    from orchard.tasks.base import SANDBOX_LIMITS

    with client.create(browser_image, network="blocked", **SANDBOX_LIMITS) as box:
        browser = Browser.launch(box)
        assert png_size(browser.screenshot()) == (1280, 1000)
        box.exec("kill -9 $(pgrep -o -x chromium)")
        started = time.monotonic()
        with pytest.raises(BrowserError):
            for _ in range(50):  # the agent sees the socket end at once, or at the next call
                browser.screenshot()
                time.sleep(0.1)
        assert time.monotonic() - started < 10
        browser.close()
        with Browser.launch(box) as again:
            assert png_size(again.screenshot()) == (1280, 1000)


def test_a_browser_that_cannot_start_is_a_clear_error_with_its_log(client, base_image):
    with client.create(base_image, network="blocked") as box:  # no Chromium in this image
        started = time.monotonic()
        with pytest.raises(BrowserTimeout, match=r"did not come up in time .*its log ends: .*chromium"):
            Browser.launch(box, timeout=2)
        assert time.monotonic() - started < 5


# --- a hostile DevTools endpoint ---------------------------------------------------------------

FAKE = r'''
"""A fake DevTools endpoint on 127.0.0.1:9222; /tmp/mode says how its WebSocket misbehaves."""
import base64, hashlib, json, socket, struct, threading, time

def frame(payload):
    return b"\x81" + (bytes([len(payload)]) if len(payload) < 126 else b"\x7e" + struct.pack(">H", len(payload))) + payload

def serve(conn):
    mode = open("/tmp/mode").read().strip()
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return
        data += chunk
    head = data.split(b"\r\n\r\n")[0].decode("latin-1")
    with open("/tmp/seen.log", "a") as seen:
        seen.write(head.split("\r\n")[0] + "\n")
    if head.startswith("GET /json/version"):
        body = b"<html>not json" if mode == "version-garbage" else json.dumps(
            {"Browser": "Fake/1", "webSocketDebuggerUrl": "ws://10.9.9.9:1/devtools/browser/fake"}).encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n" % len(body) + body)
        conn.close()
        return
    if mode == "garbage":
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n\r\n" + b"\x00\xff" * 100)
        conn.close()
        return
    if mode == "redirect":  # elsewhere: the host must not follow it out of the sandbox
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: ws://10.9.9.9:80/devtools/browser/x\r\nContent-Length: 0\r\n\r\n")
        time.sleep(3600)
    if mode == "silent":
        time.sleep(3600)
    key = [line.split(":", 1)[1].strip() for line in head.split("\r\n") if line.lower().startswith("sec-websocket-key:")][0]
    accept = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
    conn.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  "Sec-WebSocket-Accept: " + accept + "\r\n\r\n").encode())
    conn.recv(65536)  # the first command
    if mode == "huge":  # a text frame that claims a terabyte, then a trickle
        conn.sendall(b"\x81\x7f" + struct.pack(">Q", 1 << 40) + b"x" * 4096)
    elif mode == "notjson":
        conn.sendall(frame(b"{{{ not json"))
    elif mode == "binary":
        conn.sendall(b"\x82\x04abcd")
    time.sleep(3600)  # "mute": never an answer

server = socket.create_server(("127.0.0.1", 9222))
while True:
    conn, _ = server.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
'''


@pytest.fixture(scope="module")
def fake_box(client, base_image):
    with client.create(base_image, network="blocked") as box:
        box.write_file("/tmp/fake.py", FAKE)
        box.write_file("/tmp/mode", "mute")
        box.exec("setsid python3 /tmp/fake.py >/tmp/fake.log 2>&1 </dev/null &")
        deadline = time.monotonic() + 20
        while box.exec("python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 9222))'").exit_code:
            assert time.monotonic() < deadline, "the fake DevTools server did not start"
            time.sleep(0.1)
        yield box


@pytest.mark.parametrize(
    ("mode", "error", "message"),
    [
        ("version-garbage", BrowserError, "answered /json/version with no webSocketDebuggerUrl"),
        ("garbage", BrowserError, "refused the DevTools WebSocket"),
        ("redirect", BrowserError, "cannot follow redirect"),
        ("silent", BrowserTimeout, "did not finish the DevTools handshake"),
        ("huge", BrowserError, "a DevTools message over 25165824 bytes"),
        ("notjson", BrowserError, "not JSON"),
        ("binary", BrowserError, "binary DevTools message"),
        ("mute", BrowserTimeout, "did not answer Target.createBrowserContext"),
    ],
)
def test_a_hostile_devtools_endpoint_is_a_clear_error_in_time(fake_box, mode, error, message):
    fake_box.write_file("/tmp/mode", mode)
    started = time.monotonic()
    with pytest.raises(error, match=message):
        Browser.launch(fake_box, timeout=2)
    assert time.monotonic() - started < 2 + 3  # its timeout, and slack for a loaded machine


def test_the_host_connects_through_the_agent_whatever_host_the_browser_names(fake_box):
    """The fake names `ws://10.9.9.9:1/...`: only its path is taken, and the WebSocket still goes
    to the sandbox's own port 9222 through the agent."""
    fake_box.write_file("/tmp/mode", "mute")
    fake_box.exec("rm -f /tmp/seen.log")
    with pytest.raises(BrowserTimeout):
        Browser.launch(fake_box, timeout=2)
    assert fake_box.read_file("/tmp/seen.log").decode().splitlines() == [
        "GET /json/version HTTP/1.1",
        "GET /devtools/browser/fake HTTP/1.1",
    ]
