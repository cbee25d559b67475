"""`Browser`: a Chromium inside a sandbox, driven from the host over the DevTools protocol.

    with Browser.launch(box, viewport=(1280, 1000)) as browser:
        browser.goto("http://127.0.0.1:8000/")
        browser.click(640, 120)
        browser.settle()
        png = browser.screenshot()

Chromium is started inside the sandbox (once: a second `launch` on the same sandbox finds it
running and reuses it) and listens on the sandbox's own loopback, `127.0.0.1:CDP_PORT`; the host
reaches it through the exec agent (`Sandbox.connect`), so a `blocked` sandbox is fine and no port
is published. Each `Browser` is a fresh browser context (its own cookies, storage and cache) with
one tab; `close()` disposes of it, and so does the browser when the connection drops.

Coordinates are CSS pixels of the viewport (device scale factor 1). Input is the browser's own
(`Input.dispatchMouseEvent`, `Input.dispatchKeyEvent`, `Input.insertText`), so pages see trusted
events, as from a person. `elements()` lists the interactive elements in view with short ids
(`data-orchard-bid` attributes) that stay the same while the page does.

What comes back is checked on the host: messages bounded (`cdp`), a screenshot's PNG signature and
size, `evaluate`'s result type, every field of an element, at most `MAX_TABS` tabs (extra popups
are closed). JavaScript dialogs are accepted and downloads denied, so neither can stall a page.
A browser that dies is a `BrowserError` at the next call, never a hang.

Not covered: HTML5 drag and drop (`drag` is mouse down, moves, up: ranges, sliders, and
mouse-event drags work; `draggable` elements get no `drop`), iframes' elements in `elements()`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import shlex
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchard.env.bundle import sandbox_python
from orchard.env.client import Sandbox
from orchard.errors import AgentError, InvalidRequest
from orchard.recipes.gui.cdp import MAX_MESSAGE, BrowserError, BrowserTimeout, CDPConnection, CDPError
from orchard.recipes.gui.image import CHROMIUM

CDP_PORT = 9222
"""Chromium's DevTools port, on the sandbox's loopback only."""
PROFILE_DIR = "/tmp/orchard-chromium"
LOG_FILE = "/tmp/orchard-chromium.log"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",  # the sandbox is the container; Chromium's own needs privileges it has not
    "--disable-gpu",
    "--disable-dev-shm-usage",  # Docker's /dev/shm is 64 MiB
    "--remote-debugging-address=127.0.0.1",
    f"--remote-debugging-port={CDP_PORT}",
    f"--user-data-dir={PROFILE_DIR}",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-extensions",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-breakpad",
    "--mute-audio",
    "--hide-scrollbars",
    "--force-device-scale-factor=1",
    "--disable-smooth-scrolling",  # a wheel scrolls at once, so a step's screenshot shows it
    "--disable-background-timer-throttling",  # a tab not in front keeps its timers
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
    "--disable-ipc-flooding-protection",
    "--disable-hang-monitor",
    "--password-store=basic",
    "--disable-features=Translate,MediaRouter,OptimizationHints,DialMediaRouteProvider",
)
MAX_TABS = 20
MAX_SCREENSHOT = 16 * 2**20
"""The most a screenshot's PNG may hold."""
MAX_ELEMENTS = 500
MAX_NAME = 80
MAX_VALUE = 1000
MAX_OPTIONS = 100
MAX_TEXT = 64 * 1024
"""The most `insert_text` types at once."""
MAX_URL = 8192
SCREENSHOT_TIMEOUT = 10.0
"""Seconds a screenshot's capture may take; one that goes unanswered is asked once more."""
LOAD_TIMEOUT = 20.0
"""Seconds `goto` waits for a page's load by default."""
FRAME = "new Promise(done => requestAnimationFrame(() => requestAnimationFrame(() => done(1))))"
"""Resolves once the page has rendered a frame after everything before it (an action's events,
what its handlers changed, a navigation it asked for): what `settle` waits for."""
FRAME_WAIT = 1.0
"""Seconds `settle` waits for a rendered frame; a page that renders none by then (busy, hidden)
is taken as it is."""
VERSION_BYTES = 64 * 1024
START_POLL = 0.05
START_WAIT = 30.0
"""Seconds `start_command` waits for Chromium to listen on its DevTools port, by default."""
START_SCRIPT = r"""
import os, socket, subprocess, sys, time
log, port, wait, argv = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4:]
env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONUTF8", "PYTHONDONTWRITEBYTECODE")}

def listening():  # not create_connection: its getaddrinfo needs the idna codec, which the bundle lacks
    probe = socket.socket()
    probe.settimeout(0.5)
    try:
        probe.connect(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        probe.close()

def fail(why):
    try:
        with open(log, "rb") as out:
            out.seek(max(0, out.seek(0, 2) - 1500))
            tail = out.read().decode("utf-8", "replace").strip()
    except OSError:
        tail = ""
    print(why)
    print(tail)
    sys.exit(1)

if listening():
    sys.exit(0)
with open(log, "wb") as out:
    try:
        chromium = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
    except OSError as exc:
        out.write(("could not start %s: %s\n" % (argv[0], exc)).encode())
        out.close()
        fail("it could not start")
end = time.monotonic() + wait
while not listening():
    if chromium.poll() is not None:
        fail("it exited with code %s" % chromium.returncode)
    if time.monotonic() > end:
        fail("it did not listen on its DevTools port within %g s" % wait)
    time.sleep(0.02)
"""
"""Run inside the sandbox by `start_command` (stdlib only, on the bundle's interpreter): start
Chromium in a session of its own, its output to the log and without the interpreter's variables in
its environment, unless something listens on the DevTools port already; exit 0 once it listens,
else 1 with a line saying why, then the log's tail."""
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

BUTTONS = {"left": 1, "right": 2, "middle": 4}
MODIFIERS = {"alt": 1, "ctrl": 2, "control": 2, "meta": 4, "cmd": 4, "command": 4, "shift": 8}
MODIFIER_KEYS = {
    1: ("Alt", "AltLeft", 18),
    2: ("Control", "ControlLeft", 17),
    4: ("Meta", "MetaLeft", 91),
    8: ("Shift", "ShiftLeft", 16),
}
NAMED_KEYS: dict[str, tuple[str, str, int, str]] = {  # name: key, code, Windows key code, text
    "enter": ("Enter", "Enter", 13, "\r"),
    "tab": ("Tab", "Tab", 9, ""),
    "escape": ("Escape", "Escape", 27, ""),
    "backspace": ("Backspace", "Backspace", 8, ""),
    "delete": ("Delete", "Delete", 46, ""),
    "arrowup": ("ArrowUp", "ArrowUp", 38, ""),
    "arrowdown": ("ArrowDown", "ArrowDown", 40, ""),
    "arrowleft": ("ArrowLeft", "ArrowLeft", 37, ""),
    "arrowright": ("ArrowRight", "ArrowRight", 39, ""),
    "home": ("Home", "Home", 36, ""),
    "end": ("End", "End", 35, ""),
    "pageup": ("PageUp", "PageUp", 33, ""),
    "pagedown": ("PageDown", "PageDown", 34, ""),
    "space": (" ", "Space", 32, " "),
}
KEY_ALIASES = {
    "return": "enter",
    "esc": "escape",
    "del": "delete",
    "up": "arrowup",
    "down": "arrowdown",
    "left": "arrowleft",
    "right": "arrowright",
    "pgup": "pageup",
    "pgdn": "pagedown",
    " ": "space",
}
PUNCTUATION = {  # character: code, Windows key code (US layout); others are typed with no code
    "-": ("Minus", 189), "=": ("Equal", 187), "[": ("BracketLeft", 219), "]": ("BracketRight", 221),
    "\\": ("Backslash", 220), ";": ("Semicolon", 186), "'": ("Quote", 222), ",": ("Comma", 188),
    ".": ("Period", 190), "/": ("Slash", 191), "`": ("Backquote", 192),
}  # fmt: skip


@dataclass(frozen=True)
class Element:
    """One element of the page, as the host checked it."""

    bid: str
    """Short id, the same for the same element while the page stays (its `data-orchard-bid`)."""
    tag: str
    role: str
    name: str
    """Visible text, label, placeholder or aria-label, at most 80 characters."""
    box: tuple[float, float, float, float]
    """x, y, width, height in viewport CSS pixels, clipped to the viewport."""
    value: str | None = None
    """An input's or textarea's value, a select's selected option's text."""
    options: tuple[str, ...] = ()
    """A select's option texts."""
    checked: bool | None = None

    @property
    def center(self) -> tuple[float, float]:
        """The middle of its box: where a click on it lands."""
        x, y, width, height = self.box
        return x + width / 2, y + height / 2


@dataclass(frozen=True)
class Tab:
    """One tab of a browser context."""

    index: int
    title: str
    url: str
    active: bool


class _PageState:
    """What the events of one page tell: whether its main frame is loading, its navigations.
    Updated on the connection's reader thread, read under `changed`."""

    def __init__(self, target_id: str):
        self.target_id = target_id
        self.changed = threading.Condition()
        self.loading = False
        self.navigations = 0
        self.stops = 0

    def on_event(self, method: str, params: dict[str, Any]) -> None:
        frame = params.get("frame") if method == "Page.frameNavigated" else None
        # a page's main frame has no parent, and its target's id
        main = not frame.get("parentId") if isinstance(frame, dict) else params.get("frameId") == self.target_id
        with self.changed:
            if method == "Page.frameNavigated" and main:
                self.navigations += 1
            elif method in ("Page.frameStartedLoading", "Page.frameRequestedNavigation") and main:
                self.loading = True  # a navigation asked for is under way from then: its load may start late
            elif method == "Page.frameStoppedLoading" and main:
                self.loading = False
                self.stops += 1
            elif method == "Page.loadEventFired":
                self.stops += 1
            elif method != "Page.navigatedWithinDocument":
                return
            self.changed.notify_all()

    def wait(self, done: Callable[[], bool], timeout: float) -> bool:
        """Wait up to `timeout` seconds for `done()` (called under the lock); whether it came."""
        with self.changed:
            return self.changed.wait_for(done, timeout)


class Browser:
    """A fresh browser context in the sandbox's Chromium: tabs, input, screenshots, the page's
    elements. Not thread-safe: one agent drives it. Use `launch`, and as a context manager."""

    def __init__(self, box: Sandbox, connection: CDPConnection, context_id: str, viewport: tuple[int, int]):
        self.box = box
        self.viewport = viewport
        self._cdp = connection
        self._context = context_id
        self._order: list[str] = []  # target ids, in the order the tabs were first seen
        self._closing: set[str] = set()  # tabs we closed that Chromium may still list for a moment
        self._sessions: dict[str, str] = {}  # target id: session id
        self._states: dict[str, _PageState] = {}
        self._active = ""
        self._closed = False
        connection.listeners.append(self._on_event)

    @classmethod
    def launch(cls, box: Sandbox, *, viewport: tuple[int, int] = (1280, 1000), timeout: float = 30.0) -> Browser:
        """Start Chromium in `box` unless it runs there already, connect to it, and open a fresh
        browser context with one about:blank tab. `BrowserError` (with the log's tail) when it
        does not come up within `timeout` seconds."""
        if not (
            isinstance(viewport, tuple | list)
            and len(viewport) == 2
            and all(isinstance(side, int) and not isinstance(side, bool) and 100 <= side <= 4096 for side in viewport)
        ):
            raise InvalidRequest(f"a viewport is two whole numbers of pixels from 100 to 4096, not {viewport!r}")
        width, height = viewport
        deadline = time.monotonic() + timeout
        path = _find_or_start_chromium(box, viewport, deadline)
        connection = CDPConnection.open(box.connect(CDP_PORT, timeout=_left(deadline)), path, timeout=_left(deadline))
        try:
            context = connection.send(
                "Target.createBrowserContext", {"disposeOnDetach": True}, timeout=_left(deadline)
            ).get("browserContextId")
            if not isinstance(context, str) or not 0 < len(context) <= 128:
                raise BrowserError("Target.createBrowserContext answered no browserContextId")
            browser = cls(box, connection, context, (width, height))
            connection.send(
                "Browser.setDownloadBehavior",
                {"behavior": "deny", "browserContextId": context},
                timeout=_left(deadline),
            )
            browser._open_tab("about:blank", timeout=_left(deadline))
        except BaseException:
            connection.abort()
            raise
        return browser

    # --- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Dispose of this browser context (its tabs, cookies, storage) and close the
        connection; Chromium keeps running for the next `launch`. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self._cdp.closed:
                self._cdp.send("Target.disposeBrowserContext", {"browserContextId": self._context}, timeout=5.0)
        except BrowserError:
            pass  # the browser is gone, or the context with it: disposeOnDetach ends it at the close anyway
        finally:
            self._cdp.close()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the active tab ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The active tab's URL."""
        return self._target_info(self._active)[0]

    @property
    def title(self) -> str:
        """The active tab's title."""
        return self._target_info(self._active)[1]

    @property
    def navigations(self) -> int:
        """Top-level navigations of the active tab so far (its first about:blank not counted)."""
        return self._states[self._active].navigations

    def goto(self, url: str, *, timeout: float | None = None) -> bool:
        """Open `url` (relative to the current page's, when relative) in the active tab and wait
        up to `timeout` seconds (`LOAD_TIMEOUT` by default) for its load; False when it could not be
        opened (the browser's error page shows instead)."""
        timeout = LOAD_TIMEOUT if timeout is None else timeout
        if not isinstance(url, str) or not 0 < len(url) <= MAX_URL:
            raise InvalidRequest(f"a URL is a string of 1 to {MAX_URL} characters")
        target = urllib.parse.urljoin(self.url, url)
        state = self._states[self._active]
        with state.changed:
            mark = state.stops
        answer = self._send("Page.navigate", {"url": target}, timeout=timeout)
        if answer.get("errorText"):
            self._wait_loaded(state, mark, timeout)
            return False
        if answer.get("loaderId"):  # a new document (none for a jump within the page)
            self._wait_loaded(state, mark, timeout)
        return True

    def back(self) -> bool:
        """Go back one entry of the active tab's history; False when there is none."""
        history = self._send("Page.getNavigationHistory")
        index, entries = history.get("currentIndex"), history.get("entries")
        if not (isinstance(index, int) and isinstance(entries, list) and 0 < index < len(entries) <= 1000):
            return False
        entry = entries[index - 1]
        if not (isinstance(entry, dict) and isinstance(entry.get("id"), int)):
            raise BrowserError("Page.getNavigationHistory answered an entry with no id")
        state = self._states[self._active]
        with state.changed:
            mark, navigations = state.stops, state.navigations
        self._send("Page.navigateToHistoryEntry", {"entryId": entry["id"]})
        # a page from the back-forward cache is shown again with no load: its navigation is enough
        state.wait(lambda: state.navigations > navigations or state.stops > mark, 10.0)
        self.settle(timeout=10.0)
        return True

    def settle(self, *, timeout: float = 2.0) -> None:
        """Wait, up to `timeout` seconds, until what an action started has shown: the active tab
        renders a frame after it (`FRAME`: by then the action's events were handled and a
        navigation it asked for has begun), and a navigation under way has loaded and rendered
        its first frame. No fixed quiet period. Tabs the page closed or opened are taken in
        (`tabs()`)."""
        state = self._states[self._active]
        deadline = time.monotonic() + timeout
        for _ in range(3):  # a frame, then a navigation's load and its frame (a redirect: once more)
            if not state.loading:
                self._frame(deadline)
            with state.changed:
                if not state.loading:
                    break
                state.changed.wait_for(lambda: not state.loading, max(0.0, deadline - time.monotonic()))
        self._refresh_tabs()

    def _frame(self, deadline: float) -> None:
        """Until the active tab renders a frame (`FRAME`), `FRAME_WAIT` seconds at most (or until
        `deadline`). A navigation that replaces the page ends the wait too (its document, and the
        promise with it, goes); then the tab is loading, which `settle` waits for."""
        left = min(FRAME_WAIT, deadline - time.monotonic())
        if left <= 0:
            return
        params = {"expression": FRAME, "awaitPromise": True, "returnByValue": True}
        with contextlib.suppress(CDPError, BrowserTimeout):  # gone with its document, or rendering nothing
            self._send("Runtime.evaluate", params, timeout=left)

    # --- input -------------------------------------------------------------------------------

    def click(self, x: float, y: float, *, clicks: int = 1, button: str = "left") -> None:
        """Move the mouse to (x, y) and click `clicks` times (2: a double click) with `button`."""
        x, y = self._point(x, y)
        if button not in BUTTONS:
            raise InvalidRequest(f"button must be one of {', '.join(BUTTONS)}, not {button!r}")
        if not (isinstance(clicks, int) and 1 <= clicks <= 3):
            raise InvalidRequest("clicks must be 1, 2 or 3")
        self._mouse("mouseMoved", x, y)
        for count in range(1, clicks + 1):
            self._mouse("mousePressed", x, y, button=button, buttons=BUTTONS[button], clickCount=count)
            self._mouse("mouseReleased", x, y, button=button, buttons=0, clickCount=count)

    def hover(self, x: float, y: float) -> None:
        """Move the mouse to (x, y)."""
        self._mouse("mouseMoved", *self._point(x, y))

    def drag(self, start: tuple[float, float], end: tuple[float, float], *, steps: int = 10) -> None:
        """Press the left button at `start`, move to `end` in `steps` moves, release it there."""
        (x0, y0), (x1, y1) = self._point(*start), self._point(*end)
        if not (isinstance(steps, int) and 1 <= steps <= 100):
            raise InvalidRequest("steps must be a whole number from 1 to 100")
        self._mouse("mouseMoved", x0, y0)
        self._mouse("mousePressed", x0, y0, button="left", buttons=1, clickCount=1)
        for step in range(1, steps + 1):
            fraction = step / steps
            self._mouse("mouseMoved", x0 + (x1 - x0) * fraction, y0 + (y1 - y0) * fraction, button="left", buttons=1)
        self._mouse("mouseReleased", x1, y1, button="left", buttons=0, clickCount=1)

    def scroll(self, dx: float, dy: float, *, at: tuple[float, float] | None = None) -> None:
        """Turn the mouse wheel by (dx, dy) CSS pixels (positive: right, down) at `at`, the
        viewport's middle by default: what is under it scrolls."""
        x, y = self._point(*at) if at is not None else (self.viewport[0] / 2, self.viewport[1] / 2)
        deltas = [_number(delta, "a scroll delta") for delta in (dx, dy)]
        if any(abs(delta) > 100_000 for delta in deltas):
            raise InvalidRequest("a scroll delta is at most 100000 pixels")
        self._mouse("mouseWheel", x, y, deltaX=deltas[0], deltaY=deltas[1])

    def insert_text(self, text: str) -> None:
        """Type `text` into the focused element, as an input method would (one `input` event)."""
        if not isinstance(text, str) or len(text) > MAX_TEXT:
            raise InvalidRequest(f"text must be a string of at most {MAX_TEXT} characters")
        if text:
            self._send("Input.insertText", {"text": text})

    def clear_focused(self) -> None:
        """Select all of the focused field's text and delete it (a real Backspace: the page sees
        the input events)."""
        if self.evaluate(_SELECT_FOCUSED_JS):
            self.press(["Backspace"])

    def focused(self) -> Element | None:
        """The focused element (its value included), or None when nothing is focused."""
        return self._one(self._page_call("'focused', null"))

    def press(self, keys: list[str], *, hotkey: bool = False, presses: int = 1) -> None:
        """Press `keys` one after the other, or with `hotkey` all together (the earlier ones held
        while the last is pressed: `["ctrl", "a"]`), `presses` times. Keys are named ("Enter",
        "Tab", "ArrowDown", "ctrl", "shift", ...) or single characters."""
        if not (isinstance(keys, list) and 0 < len(keys) <= 10 and all(isinstance(key, str) for key in keys)):
            raise InvalidRequest("keys must be a list of 1 to 10 key names")
        if not (isinstance(presses, int) and 1 <= presses <= 100):
            raise InvalidRequest("presses must be a whole number from 1 to 100")
        parsed = [_key(key) for key in keys]
        for _ in range(presses):
            if hotkey:
                held = 0
                for key in parsed:
                    held = self._key_event("down", key, held)
                for key in reversed(parsed):
                    held = self._key_event("up", key, held)
            else:
                for key in parsed:
                    modifiers = self._key_event("down", key, 0)
                    self._key_event("up", key, modifiers)

    # --- what the page shows -----------------------------------------------------------------

    def element_at(self, x: float, y: float) -> Element | None:
        """The interactive element at (x, y) (the element there, or its nearest interactive
        ancestor), or None."""
        x, y = self._point(x, y)
        return self._one(self._page_call(f"'at', [{x!r}, {y!r}]"))

    def elements(self) -> list[Element]:
        """The interactive elements (links, buttons, fields, ...) visible in the viewport, in
        document order, at most `MAX_ELEMENTS`, each with its bid."""
        found = self._page_call("'elements', null")
        if not isinstance(found, list) or len(found) > MAX_ELEMENTS:
            raise BrowserError(f"the page's element list is not a list of at most {MAX_ELEMENTS}")
        return [_element(item) for item in found]

    def locate(self, target: str | dict[str, str]) -> Element | None:
        """The element a CSS selector (its first match) or `{"js": expression}` (an expression
        whose value is the element) names, scrolled into view; None when nothing matches."""
        if isinstance(target, str) and 0 < len(target) <= 2000:
            call = f"'css', {_js_string(target)}"
        elif isinstance(target, dict) and set(target) == {"js"} and isinstance(target["js"], str):
            call = f"'node', (() => ({target['js']}))()"
        else:
            raise InvalidRequest('a target is a CSS selector or {"js": expression}')
        found = self._page_call(call)
        if isinstance(found, dict) and "error" in found:
            raise InvalidRequest(f"{target!r} is not a valid CSS selector")
        return self._one(found)

    def screenshot(self) -> bytes:
        """A PNG of the active tab's viewport, checked: its signature, and a size equal to the
        viewport's."""
        params = {"format": "png", "optimizeForSpeed": True, "captureBeyondViewport": False, "fromSurface": True}
        unanswered = 0
        for attempt in range(3):
            try:
                answer = self._send("Page.captureScreenshot", params, timeout=SCREENSHOT_TIMEOUT, max_bytes=MAX_MESSAGE)
                break
            except BrowserTimeout:  # asked as a navigation committed (a loaded machine), it may go unanswered
                unanswered += 1
                if attempt == 2 or unanswered == 2:  # once more only: a hung renderer is the page's
                    raise
                self.settle(timeout=5.0)
            except CDPError as exc:  # a page in the middle of a navigation has nothing to capture yet
                if attempt == 2 or "not attached to an active page" not in str(exc).lower():
                    raise
                self.settle(timeout=5.0)
        return check_png(answer.get("data"), self.viewport)

    def evaluate(self, expression: str, *, timeout: float = 10.0) -> Any:
        """The JSON value of a JavaScript expression in the active tab (promises awaited). What
        cannot be made JSON comes back as None; the script's exception is a `BrowserError`."""
        if not isinstance(expression, str) or not 0 < len(expression) <= 1_000_000:
            raise InvalidRequest("an expression is a non-empty string of at most 1000000 characters")
        started = time.monotonic()
        try:
            answer = self._send(
                "Runtime.evaluate",
                {"expression": expression, "returnByValue": True, "awaitPromise": True, "timeout": int(timeout * 1000)},
                timeout=timeout + 2.0,
            )
        except CDPError as exc:  # V8 ended a script that ran past `timeout` with an "internal error"
            if time.monotonic() - started >= timeout * 0.9:
                raise BrowserTimeout(f"the script did not finish within {timeout:g} s; it was stopped") from exc
            raise
        details = answer.get("exceptionDetails")
        if details is not None:
            raise BrowserError(f"the script threw: {_exception_text(details)}")
        result = answer.get("result")
        if not isinstance(result, dict):
            raise BrowserError("Runtime.evaluate answered no result")
        if "unserializableValue" in result:
            return _unserializable(result["unserializableValue"])
        value = result.get("value")
        if not _json_value(value):
            raise BrowserError("Runtime.evaluate answered a value that is not JSON")
        return value

    # --- tabs --------------------------------------------------------------------------------

    def tabs(self) -> list[Tab]:
        """The tabs of this browser context, popups included, in the order they opened."""
        self._refresh_tabs()
        infos = {}
        for target in list(self._order):
            try:
                infos[target] = self._target_info(target)
            except CDPError:  # closed since the refresh (a page that closed itself): no tab any more
                if target == self._active:
                    raise
                self._forget(target)
        return [
            Tab(index, infos[target][1], infos[target][0], target == self._active)
            for index, target in enumerate(self._order)
        ]

    def new_tab(self, url: str = "about:blank") -> None:
        """Open a tab at `url` and make it the active one."""
        if not isinstance(url, str) or not 0 < len(url) <= MAX_URL:
            raise InvalidRequest(f"a URL is a string of 1 to {MAX_URL} characters")
        self._refresh_tabs()
        if len(self._order) >= MAX_TABS:
            raise InvalidRequest(f"a browser has at most {MAX_TABS} tabs: close one first")
        self._open_tab(url)

    def switch_tab(self, index: int) -> None:
        """Make the tab at `index` (of `tabs()`) the active one."""
        self._refresh_tabs()
        if not (isinstance(index, int) and 0 <= index < len(self._order)):
            raise InvalidRequest(f"there is no tab {index!r}: the tabs are 0 to {len(self._order) - 1}")
        self._activate(self._order[index])

    def close_tab(self) -> None:
        """Close the active tab; the one before it becomes active (a fresh about:blank when it
        was the last)."""
        self._refresh_tabs()
        index = self._order.index(self._active) if self._active in self._order else 0
        with contextlib.suppress(CDPError):  # already gone
            self._cdp.send("Target.closeTarget", {"targetId": self._active})
        self._closing.add(self._active)  # its close is under way: a refresh does not take it back as a popup
        self._forget(self._active)
        if self._order:
            self._activate(self._order[max(0, index - 1)])
        else:
            self._open_tab("about:blank")

    # --- the machinery -----------------------------------------------------------------------

    def _send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        max_bytes: int | None = None,
    ) -> dict[str, Any]:
        """A command to the active tab's session (`timeout`: `cdp.COMMAND_TIMEOUT` by default)."""
        if self._closed:
            raise BrowserError("this browser was closed")
        extra = {"max_bytes": max_bytes} if max_bytes is not None else {}
        return self._cdp.send(method, params, session_id=self._sessions[self._active], timeout=timeout, **extra)

    def _on_event(self, method: str, params: dict[str, Any], session_id: str | None) -> None:
        """Every event (on the reader thread): a page's to its state; dialogs accepted."""
        if session_id is None or not method.startswith("Page."):
            return
        for target, session in list(self._sessions.items()):
            if session == session_id:
                if method == "Page.javascriptDialogOpening":
                    self._cdp.post("Page.handleJavaScriptDialog", {"accept": True}, session_id=session)
                elif (state := self._states.get(target)) is not None:
                    state.on_event(method, params)
                return

    def _open_tab(self, url: str, *, timeout: float = 10.0) -> None:
        """A new page target of this context at `url`, attached and active."""
        answer = self._cdp.send(
            "Target.createTarget", {"url": "about:blank", "browserContextId": self._context}, timeout=timeout
        )
        target = answer.get("targetId")
        if not isinstance(target, str) or not 0 < len(target) <= 128:
            raise BrowserError("Target.createTarget answered no targetId")
        self._order.append(target)
        self._activate(target, timeout=timeout)
        if url != "about:blank":
            self.goto(url, timeout=max(timeout, 20.0))

    def _activate(self, target: str, *, timeout: float = 10.0) -> None:
        """Make `target` the active tab: attached (once), its viewport set, brought to front."""
        if target not in self._sessions:
            answer = self._cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True}, timeout=timeout)
            session = answer.get("sessionId")
            if not isinstance(session, str) or not 0 < len(session) <= 128:
                raise BrowserError("Target.attachToTarget answered no sessionId")
            self._states[target] = _PageState(target)
            self._sessions[target] = session
            self._active = target
            self._send("Page.enable", timeout=timeout)
            width, height = self.viewport
            self._send(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                timeout=timeout,
            )
        self._active = target
        self._send("Page.bringToFront", timeout=timeout)

    def _refresh_tabs(self) -> None:
        """Take in the context's pages as they are now: closed ones forgotten, new ones (popups)
        appended, those past `MAX_TABS` closed. A closed active tab gives way to the last one."""
        answer = self._cdp.send("Target.getTargets")
        infos = answer.get("targetInfos")
        if not isinstance(infos, list) or len(infos) > 10_000:
            raise BrowserError("Target.getTargets answered no list of targets")
        pages = [
            info["targetId"]
            for info in infos
            if isinstance(info, dict)
            and info.get("type") == "page"
            and info.get("browserContextId") == self._context
            and isinstance(info.get("targetId"), str)
            and 0 < len(info["targetId"]) <= 128
        ]
        for target in [target for target in self._order if target not in pages]:
            self._forget(target)
        self._closing &= set(pages)  # gone for good: forgotten
        for target in pages:
            if target not in self._order and target not in self._closing:
                if len(self._order) >= MAX_TABS:
                    with contextlib.suppress(CDPError):  # already gone
                        self._cdp.send("Target.closeTarget", {"targetId": target})
                    continue
                self._order.append(target)
        if self._active not in self._order:
            if self._order:
                self._activate(self._order[-1])
            else:
                self._open_tab("about:blank")

    def _forget(self, target: str) -> None:
        if target in self._order:
            self._order.remove(target)
        self._sessions.pop(target, None)
        self._states.pop(target, None)

    def _target_info(self, target: str) -> tuple[str, str]:
        """A tab's (url, title), bounded."""
        info = self._cdp.send("Target.getTargetInfo", {"targetId": target}).get("targetInfo")
        if not isinstance(info, dict):
            raise BrowserError("Target.getTargetInfo answered no targetInfo")
        url, title = info.get("url"), info.get("title")
        if not (isinstance(url, str) and isinstance(title, str)):
            raise BrowserError("Target.getTargetInfo answered a url or title that is not a string")
        return url[:MAX_URL], title[:1000]

    def _wait_loaded(self, state: _PageState, mark: int, timeout: float) -> None:
        """Wait up to `timeout` seconds for a load after `mark` (a page that never finishes
        loading is left loading), then settle."""
        state.wait(lambda: state.stops > mark, timeout)
        self.settle(timeout=min(timeout, 2.0))

    def _point(self, x: Any, y: Any) -> tuple[float, float]:
        """(x, y) checked: finite numbers inside the viewport."""
        x, y = _number(x, "x"), _number(y, "y")
        width, height = self.viewport
        if not (0 <= x <= width and 0 <= y <= height):
            raise InvalidRequest(f"({x:g}, {y:g}) is outside the {width}x{height} viewport")
        return float(x), float(y)

    def _mouse(self, kind: str, x: float, y: float, **fields: Any) -> None:
        self._send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "pointerType": "mouse", **fields})

    def _key_event(self, direction: str, key: tuple[str, str, int, str, int], held: int) -> int:
        """Press or release one key with the modifiers `held`; the modifiers held after it."""
        name, code, key_code, text, modifier = key
        held = held | modifier if direction == "down" else held & ~modifier
        params: dict[str, Any] = {"key": name, "code": code, "windowsVirtualKeyCode": key_code, "modifiers": held}
        if direction == "down":
            typed = text if not held & ~MODIFIERS["shift"] else ""  # ctrl+a types no "a"
            if typed and held & MODIFIERS["shift"] and len(typed) == 1:
                typed = typed.upper()
            params.update(type="keyDown" if typed else "rawKeyDown", text=typed, unmodifiedText=typed)
        else:
            params["type"] = "keyUp"
        self._send("Input.dispatchKeyEvent", params)
        return held

    def _page_call(self, arguments: str) -> Any:
        """Run the page helper (`_PAGE_JS`) with `arguments` (JavaScript source)."""
        width, height = self.viewport
        return self.evaluate(f"({_PAGE_JS})({arguments}, {width}, {height})")

    def _one(self, found: Any) -> Element | None:
        return None if found is None else _element(found)


def check_png(data: Any, viewport: tuple[int, int]) -> bytes:
    """The PNG of a screenshot's base64 `data`, checked: bounded before decoding, its signature,
    and an IHDR width and height equal to the viewport's. `BrowserError` otherwise."""
    if not isinstance(data, str) or len(data) > (MAX_SCREENSHOT + 2) // 3 * 4:
        raise BrowserError(f"the screenshot is not base64 text of at most {MAX_SCREENSHOT} bytes")
    try:
        png = base64.b64decode(data, validate=True)
    except ValueError as exc:
        raise BrowserError("the screenshot is not valid base64") from exc
    if len(png) < 24 or png[:8] != PNG_SIGNATURE or png[12:16] != b"IHDR":
        raise BrowserError("the screenshot is not a PNG")
    width, height = struct.unpack(">II", png[16:24])
    if (width, height) != tuple(viewport):
        raise BrowserError(f"the screenshot is {width}x{height}, not the {viewport[0]}x{viewport[1]} viewport")
    return png


class _NoAnswer(BrowserError):
    """Something holds the DevTools port but gave no answer (a browser starting, or dying)."""


def _devtools_path(box: Sandbox, *, timeout: float) -> str | None:
    """The path of the browser's DevTools WebSocket, from `/json/version`, when something
    answers on the DevTools port; None when nothing listens there."""
    try:
        answer = box.http("/json/version", port=CDP_PORT, method="GET", timeout=timeout, max_bytes=VERSION_BYTES)
    except AgentError as exc:
        if "nothing listens" in str(exc):
            return None
        raise _NoAnswer(f"the DevTools port of sandbox {box.id} did not answer /json/version: {exc}") from exc
    try:
        url = answer.json().get("webSocketDebuggerUrl") if answer.status == 200 else None
    except (ValueError, AttributeError):
        url = None
    if not isinstance(url, str) or len(url) > 512:
        raise BrowserError(f"the DevTools port of sandbox {box.id} answered /json/version with no webSocketDebuggerUrl")
    # the path only: the host always connects through the agent, whatever host the browser names
    path = urllib.parse.urlsplit(url).path
    if not (path.startswith("/devtools/browser/") and all(c.isalnum() or c in "-/_" for c in path)):
        raise BrowserError(f"the browser's DevTools URL has an unexpected path: {path[:100]!r}")
    return path


def _find_or_start_chromium(box: Sandbox, viewport: tuple[int, int], deadline: float) -> str:
    """The DevTools path of the sandbox's Chromium: the one running there, or one started now
    in the background once it listens. A port held but not answering (a browser starting or
    dying) is asked again until `deadline`; then `BrowserTimeout`, with the log's tail."""
    started = False
    while True:
        try:
            path = _devtools_path(box, timeout=min(2.0, _left(deadline)))
        except _NoAnswer as exc:
            trouble = str(exc)
        else:
            if path is not None:
                return path
            trouble = "nothing listens on its DevTools port"
            if not started:
                _start_chromium(box, viewport, deadline)
                started = True
                continue
        if time.monotonic() >= deadline:
            tail = box.exec(f"tail -c 1500 {LOG_FILE}", timeout=10).stdout.strip() if started else ""
            raise BrowserTimeout(
                f"Chromium in sandbox {box.id} did not come up in time ({trouble})"
                + (f"; its log ends: {tail}" if tail else "")
            )
        time.sleep(START_POLL)


def start_command(viewport: tuple[int, int], *, wait: float = START_WAIT) -> str:
    """The shell command that starts the sandbox's Chromium for `viewport` in the background (its
    output to `LOG_FILE`) and returns once it listens on `CDP_PORT`, waiting at most `wait`
    seconds; it starts nothing when something listens there already. It exits 1 when Chromium
    does not come up, with a line saying why and then the tail of Chromium's log.

    `Browser.launch` runs it when no browser answers; a browser task's sandboxes run it as their
    `init` (`BrowserTask.sandbox_init`), so a warm pool of them holds sandboxes whose Chromium
    runs already, and `launch` there only opens a fresh context."""
    flags = [*CHROMIUM_FLAGS, f"--window-size={viewport[0]},{viewport[1]}", "about:blank"]
    arguments = [LOG_FILE, str(CDP_PORT), f"{wait:g}", CHROMIUM, *flags]
    return f"{sandbox_python()} -c {shlex.quote(START_SCRIPT)} {shlex.join(arguments)}"


def _start_chromium(box: Sandbox, viewport: tuple[int, int], deadline: float) -> None:
    """Start Chromium in `box` and wait until it listens (`start_command`), until `deadline`;
    `BrowserTimeout` with the reason and its log's tail when it does not come up."""
    wait = max(0.5, deadline - time.monotonic())
    started = box.exec(start_command(viewport, wait=wait), timeout=wait + 10)
    if started.exit_code != 0:
        said = started.stdout.strip() or started.stderr.strip() or started.error or ""
        why, _, tail = said.partition("\n")
        raise BrowserTimeout(
            f"Chromium in sandbox {box.id} did not come up in time ({why[:200] or 'its start failed'})"
            + (f"; its log ends: {tail.strip()[-1500:]}" if tail.strip() else "")
        )


def _left(deadline: float) -> float:
    """Seconds left until `deadline` (a little at least, so a last call can still answer)."""
    return max(0.5, deadline - time.monotonic())


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequest(f"{what} must be a finite number, not {value!r}")
    return float(value)


def _key(name: str) -> tuple[str, str, int, str, int]:
    """A key's (key, code, key code, text, modifier bit) for `Input.dispatchKeyEvent`."""
    lowered = name.lower()
    if lowered in MODIFIERS:
        bit = MODIFIERS[lowered]
        key, code, key_code = MODIFIER_KEYS[bit]
        return key, code, key_code, "", bit
    lowered = KEY_ALIASES.get(lowered, lowered)
    if lowered in NAMED_KEYS:
        return (*NAMED_KEYS[lowered], 0)
    if len(name) == 1:
        if name.isascii() and name.isalpha():
            return name, f"Key{name.upper()}", ord(name.upper()), name, 0
        if name.isdigit() and name.isascii():
            return name, f"Digit{name}", ord(name), name, 0
        code, key_code = PUNCTUATION.get(name, ("", 0))
        return name, code, key_code, name, 0
    known = ", ".join([*(key for key, *_ in NAMED_KEYS.values()), "ctrl", "shift", "alt", "meta"])
    raise InvalidRequest(f"no key {name[:40]!r}: name one of {known}, or a single character")


def _element(item: Any) -> Element:
    """An `Element` from the page helper's record, every field checked."""
    if not isinstance(item, dict):
        raise BrowserError("the page's element record is not an object")
    bid, tag, role, name = (item.get(key) for key in ("bid", "tag", "role", "name"))
    box, value, options, checked = (item.get(key) for key in ("box", "value", "options", "checked"))
    if not (isinstance(bid, str) and bid.isdigit() and bid.isascii() and len(bid) <= 12):
        raise BrowserError(f"the page's element record has a bad bid: {str(bid)[:20]!r}")
    for what, text, bound in (("tag", tag, 64), ("role", role, 64), ("name", name, MAX_NAME)):
        if not isinstance(text, str) or len(text) > bound:
            raise BrowserError(f"the page's element record has a bad {what}")
    if not (
        isinstance(box, list)
        and len(box) == 4
        and all(isinstance(side, int | float) and not isinstance(side, bool) and math.isfinite(side) for side in box)
    ):
        raise BrowserError("the page's element record has a bad box")
    if not (value is None or (isinstance(value, str) and len(value) <= MAX_VALUE)):
        raise BrowserError("the page's element record has a bad value")
    if not (
        isinstance(options, list)
        and len(options) <= MAX_OPTIONS
        and all(isinstance(option, str) and len(option) <= MAX_NAME for option in options)
    ):
        raise BrowserError("the page's element record has bad options")
    if not (checked is None or isinstance(checked, bool)):
        raise BrowserError("the page's element record has a bad checked")
    x, y, width, height = (float(side) for side in box)
    return Element(bid, str(tag), str(role), str(name), (x, y, width, height), value, tuple(options), checked)


def _json_value(value: Any, depth: int = 0) -> bool:
    """Whether `value` is made of JSON types only (what `returnByValue` promises)."""
    if depth > 100:
        return False
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list):
        return all(_json_value(item, depth + 1) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _json_value(item, depth + 1) for key, item in value.items())
    return False


def _unserializable(text: Any) -> float | int | None:
    """`NaN`, `Infinity`, `-Infinity`, `-0` and bigints (`12n`), as Python numbers."""
    if not isinstance(text, str) or len(text) > 400:
        return None
    if text.endswith("n") and text[:-1].lstrip("-").isdigit():
        return int(text[:-1])
    return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf, "-0": -0.0}.get(text)


def _exception_text(details: Any) -> str:
    """A script's exception in a line, bounded."""
    if not isinstance(details, dict):
        return "an exception"
    exception = details.get("exception")
    description = exception.get("description") if isinstance(exception, dict) else None
    text = description if isinstance(description, str) else details.get("text")
    return str(text or "an exception").splitlines()[0][:300] if text else "an exception"


def _js_string(text: str) -> str:
    """`text` as a JavaScript string literal."""
    return json.dumps(text)


_SELECT_FOCUSED_JS = """(() => {
  const el = document.activeElement;
  if (!el || el === document.body || el === document.documentElement) return false;
  if (typeof el.select === 'function' && (el.tagName === 'INPUT' || el.tagName === 'TEXTAREA')) {
    try { el.select(); } catch (e) { return false; }
    return el.value !== '';
  }
  if (el.isContentEditable) {
    const range = document.createRange();
    range.selectNodeContents(el);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    return el.textContent !== '';
  }
  return false;
})()"""

# The page helper: `(mode, argument, viewport width, viewport height)`. Modes: 'elements' (the
# interactive elements in view), 'focused', 'at' ([x, y]), 'css' (a selector: its first match,
# scrolled into view), 'node' (an element, scrolled into view). Each element is described as the
# host's `Element`, its bid assigned: an element keeps a bid it has (its first holder in document
# order, when a page copied one), a new one counts up from the page's counter.
_PAGE_JS = r"""function (mode, arg, vw, vh) {
  const INTERACTIVE = 'a, button, input, textarea, select, [role=button], [role=link], [role=checkbox], '
    + '[role=tab], [role=menuitem], [role=option], [onclick], label, summary, '
    + '[contenteditable]:not([contenteditable=false])';
  const clean = (s, n) => String(s == null ? '' : s).replace(/\s+/g, ' ').trim().slice(0, n);
  const seen = new Set();
  const taken = (bid) => document.querySelector('[data-orchard-bid="' + bid + '"]');
  function bidOf(el, walking) {
    let bid = el.getAttribute('data-orchard-bid');
    const ok = bid && /^[0-9]{1,9}$/.test(bid)
      && (walking ? !seen.has(bid) : taken(bid) === el);
    if (!ok) {
      const last = window.__orchardBid;  // the page's to spoil: a bad one starts again from 0
      let next = Number.isSafeInteger(last) && last >= 0 && last < 1e8 ? last : 0;
      do { next += 1; } while (taken(String(next)));
      window.__orchardBid = next;
      bid = String(next);
      el.setAttribute('data-orchard-bid', bid);
    }
    seen.add(bid);
    return bid;
  }
  function roleOf(el, tag) {
    const explicit = el.getAttribute('role');
    if (explicit) return clean(explicit, 64);
    if (tag === 'a') return el.hasAttribute('href') ? 'link' : 'generic';
    if (tag === 'button' || tag === 'summary') return 'button';
    if (tag === 'textarea') return 'textbox';
    if (tag === 'select') return el.multiple ? 'listbox' : 'combobox';
    if (tag === 'label') return 'label';
    if (tag === 'input') {
      const type = (el.type || 'text').toLowerCase();
      return {checkbox: 'checkbox', radio: 'radio', submit: 'button', button: 'button', reset: 'button',
              image: 'button', range: 'slider', number: 'spinbutton', search: 'searchbox'}[type] || 'textbox';
    }
    if (el.isContentEditable) return 'textbox';
    return 'generic';
  }
  function nameOf(el, tag) {
    let name = el.getAttribute('aria-label') || '';
    const ids = el.getAttribute('aria-labelledby');
    if (!name && ids) name = ids.split(/\s+/).map((id) => {
      const e = document.getElementById(id); return e ? e.innerText || e.textContent : '';
    }).join(' ');
    if (!name && el.labels && el.labels.length) name = Array.from(el.labels).map((l) => l.innerText).join(' ');
    const field = tag === 'input' || tag === 'textarea' || tag === 'select';
    if (!name && tag === 'input' && ['submit', 'button', 'reset'].includes(el.type)) name = el.value;
    if (!name && !field) name = el.innerText;
    if (!clean(name, 1)) name = el.getAttribute('placeholder') || el.getAttribute('title')
      || el.getAttribute('alt') || (el.querySelector && el.querySelector('img[alt]')
      ? el.querySelector('img[alt]').getAttribute('alt') : '');
    return clean(name, 80);
  }
  function describe(el, walking) {
    const tag = el.tagName.toLowerCase();
    const r = el.getBoundingClientRect();
    const x = Math.max(0, r.left), y = Math.max(0, r.top);
    const w = Math.max(0, Math.min(vw, r.right) - x), h = Math.max(0, Math.min(vh, r.bottom) - y);
    let value = null, options = [], checked = null;
    if (tag === 'select') {
      const chosen = el.options[el.selectedIndex];
      value = chosen ? clean(chosen.text, 1000) : '';
      options = Array.from(el.options).slice(0, 100).map((o) => clean(o.text, 80));
    } else if (tag === 'input' && (el.type === 'checkbox' || el.type === 'radio')) {
      checked = !!el.checked;
    } else if (tag === 'input' || tag === 'textarea') {
      value = String(el.value).slice(0, 1000);
    } else if (el.isContentEditable) {
      value = String(el.innerText).slice(0, 1000);
    }
    if (checked === null && el.getAttribute('aria-checked')) checked = el.getAttribute('aria-checked') === 'true';
    const round = (v) => Math.round(v * 100) / 100;
    return {bid: bidOf(el, walking), tag: tag.slice(0, 64), role: roleOf(el, tag), name: nameOf(el, tag),
            box: [round(x), round(y), round(w), round(h)], value, options, checked};
  }
  function visible(el) {
    const r = el.getBoundingClientRect();
    if (r.width <= 0 || r.height <= 0 || r.bottom <= 0 || r.right <= 0 || r.top >= vh || r.left >= vw) return false;
    return el.checkVisibility ? el.checkVisibility({visibilityProperty: true, opacityProperty: true}) : true;
  }
  function inView(el) {
    const r = el.getBoundingClientRect();
    return r.top >= 0 && r.left >= 0 && r.bottom <= vh && r.right <= vw;
  }
  function shown(el) {
    if (!(el instanceof Element)) return null;
    if (!inView(el)) el.scrollIntoView({block: 'center', inline: 'center', behavior: 'instant'});
    return describe(el, false);
  }
  // an element a script listens on shows a pointer: the outermost of a run of them is one target
  const pointer = (el) => el instanceof Element && getComputedStyle(el).cursor === 'pointer';
  const pointerTarget = (el) => pointer(el) && !pointer(el.parentElement) && !el.closest(INTERACTIVE);
  if (mode === 'elements') {
    const out = [];
    for (const el of document.querySelectorAll(INTERACTIVE)) {
      if (out.length >= 500) break;
      if (visible(el)) out.push(describe(el, true));
    }
    const all = document.body ? document.body.getElementsByTagName('*') : [];
    for (let i = 0; i < all.length && i < 5000 && out.length < 500; i++) {
      if (pointerTarget(all[i]) && visible(all[i])) out.push(describe(all[i], true));
    }
    return out;
  }
  if (mode === 'focused') {
    let el = document.activeElement;
    while (el && el.shadowRoot && el.shadowRoot.activeElement) el = el.shadowRoot.activeElement;
    if (!el || el === document.body || el === document.documentElement) return null;
    return describe(el, false);
  }
  if (mode === 'at') {
    const el = document.elementFromPoint(arg[0], arg[1]);
    let hit = el && el.closest(INTERACTIVE);
    for (let up = el; !hit && up && up !== document.body; up = up.parentElement) if (pointerTarget(up)) hit = up;
    return hit ? describe(hit, false) : null;
  }
  if (mode === 'css') {
    let el;
    try { el = document.querySelector(arg); } catch (e) { return {error: 'selector'}; }
    return el ? shown(el) : null;
  }
  if (mode === 'node') return arg ? shown(arg) : null;
  return null;
}"""
