"""Two harnesses for browser tasks (the `gui` and `miniwob` kinds), with really different interfaces.

* `computer` (the published Orchard-GUI recipe's): the model sees screenshots of the viewport and
  acts with 13 function tools on a 0-1000 grid (`click(point_2d)`, `write(message)`,
  `press_keys`, `scroll`, `wait`, `done(response)`, `goto_url`, `go_back`, `drag`, `hover`,
  `new_tab`, `switch_tab`, `close_tab`). Each action answers a short feedback line (what was
  clicked, whether the page navigated, the field's value after `write`); after the turn's actions
  the model gets one screenshot, with the tabs and the active URL. Only the newest `keep_images`
  screenshots stay in the model's context (older ones are kept in the trajectory).
* `bid` (BrowserGym's way): no pixels; the page as text, each interactive element with its id
  (`[12] button "Add to cart"`), and tools that name elements by id: `click(bid)`,
  `fill(bid, text)`, `select_option(bid, value)`, `hover(bid)`, `press(keys)`, `scroll`,
  `goto(url)`, `go_back`, `wait`, `tab_focus`, `new_tab`, `tab_close`, `done(answer)`.

Both drive the browser the task's `start` launched in the sandbox (`orchard.recipes.gui.task.session_of`),
through the exec agent; both refuse a URL the task does not allow (`BrowserTask.allows`: never
`javascript:`, never another task's pages). The scripted model plays both from the same abstract
steps (`click`/`write`/`select` on a CSS selector or a `{"js": ...}` expression, `press`,
`goto`, `scroll`, `submit`): the harness resolves each target in the live page and writes the
action it would take, a point on the grid or an element id.
"""

from __future__ import annotations

import base64
import json
import math
import time
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin

from orchard.agents.base import Action, FormatError, Message, Reply, Step, ToolCall, ToolCalling, clip, json_arguments
from orchard.errors import ConfigError, InvalidRequest, OrchardError

if TYPE_CHECKING:
    from orchard.env.client import Sandbox
    from orchard.recipes.gui.browser import Browser, Element
    from orchard.recipes.gui.task import Session

TEXT_ROLES = ("textbox", "searchbox", "spinbutton", "combobox")
"""Roles of the fields `write` and `fill` type into (`Element.role`)."""
GRID = 1000
"""Coordinates are given on a GRID x GRID square mapped onto the viewport."""
MAX_WAIT = 10.0
MAX_PRESSES = 20
MAX_SCROLL = 20
SCROLL_PX = 100
"""Pixels of one scroll notch (`amount` counts notches)."""
MAX_TEXT = 2000
"""Characters one `write` or `fill` may type."""
OUTLINE_CHARS = 8000


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


POINT = {
    "type": "array",
    "items": {"type": "integer", "minimum": 0, "maximum": GRID},
    "minItems": 2,
    "maxItems": 2,
    "description": f"[x, y] on a 0-{GRID} grid over the screenshot: [0, 0] top left, [{GRID}, {GRID}] bottom right.",
}
DIRECTION = {"type": "string", "enum": ["up", "down", "left", "right"]}

COMPUTER_TOOLS = [
    _function(
        "click",
        "Click a point of the page.",
        {
            "point_2d": POINT,
            "clicks": {"type": "integer", "minimum": 1, "maximum": 3, "description": "1, or 2 for a double click."},
            "button": {"type": "string", "enum": ["left", "right", "middle"]},
        },
        ["point_2d"],
    ),
    _function(
        "write",
        "Type into the focused field, replacing what it holds (click the field first).",
        {"message": {"type": "string"}},
        ["message"],
    ),
    _function(
        "press_keys",
        "Press keys: `Enter`, `Tab`, `Escape`, `Backspace`, `ArrowDown`, a letter, ... With is_hotkey, "
        'hold the earlier keys while pressing the last (`["ctrl", "a"]`).',
        {
            "keys": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "is_hotkey": {"type": "boolean"},
            "presses": {"type": "integer", "minimum": 1, "maximum": MAX_PRESSES},
        },
        ["keys"],
    ),
    _function(
        "scroll",
        "Scroll the page (or the element at point_2d).",
        {
            "direction": DIRECTION,
            "amount": {"type": "integer", "minimum": 1, "maximum": MAX_SCROLL, "description": "Notches."},
            "point_2d": POINT,
        },
        ["direction"],
    ),
    _function("wait", "Wait for the page.", {"seconds": {"type": "number", "minimum": 0, "maximum": MAX_WAIT}}, []),
    _function(
        "done",
        "Finish the task; `response` is your answer to the user (what you found, or what you did).",
        {"response": {"type": "string"}},
        ["response"],
    ),
    _function("goto_url", "Open a URL in the current tab.", {"url": {"type": "string"}}, ["url"]),
    _function("go_back", "Go back to the previous page.", {}, []),
    _function(
        "drag",
        "Drag with the left button held, from one point to another.",
        {"start_point_2d": POINT, "end_point_2d": POINT, "steps": {"type": "integer", "minimum": 1, "maximum": 50}},
        ["start_point_2d", "end_point_2d"],
    ),
    _function("hover", "Move the mouse over a point.", {"point_2d": POINT}, ["point_2d"]),
    _function("new_tab", "Open a new blank tab and switch to it.", {}, []),
    _function("switch_tab", "Switch to a tab.", {"tab_index": {"type": "integer", "minimum": 0}}, ["tab_index"]),
    _function("close_tab", "Close the current tab.", {}, []),
]

COMPUTER_SYSTEM = """You use a web browser to do a task for a user. After each turn you see a
screenshot of the page, the open tabs and the current URL. Act with the tools: points are [x, y]
on a 0-{grid} grid over the screenshot ([0, 0] is the top left corner, [{grid}, {grid}] the
bottom right). To type into a field, click it first, then `write`. Make one action per turn and
look at the result. When the task is done, call `done` with your answer to the user."""

BID_SYSTEM = """You use a web browser to do a task for a user. After each turn you see the page as
text: its URL, the open tabs, and its content, where each element you can act on has an id in
brackets, e.g. [12] button "Add to cart". Act with the tools, naming elements by id. Make one
action per turn and look at the result. When the task is done, call `done` with your answer to the
user."""


class BrowserHarness(ToolCalling):
    """What both browser harnesses share: tool calls parsed and checked against their schemas,
    the browser of the sandbox found through the task's session, a view of the page after the
    turn (`after_actions`), and the abstract steps of scripts resolved in the live page."""

    name = ""
    system = ""
    schemas: list[dict[str, Any]] = []
    keep_images: int | None = None
    """The newest screenshots kept in the model's context (None: all)."""

    def __init__(self) -> None:
        self._box: Sandbox | None = None
        self._names = {t["function"]["name"] for t in self.schemas}

    def system_prompt(self, task: dict[str, Any]) -> str:
        return self.system.format(grid=GRID)

    def task_prompt(self, task: dict[str, Any]) -> str:
        return str(task.get("prompt") or task["problem_statement"])

    def tools(self) -> list[dict[str, Any]] | None:
        return self.schemas

    def opening(self, box: Sandbox) -> list[dict[str, Any]]:
        """The page as the model first sees it, added to the task's first user turn."""
        self._box = box
        return self.view(box)

    def parse(self, reply: Reply) -> list[Action]:
        if not reply.tool_calls:
            raise FormatError("call one of the tools; when the task is done, call `done` with your answer")
        actions = []
        for call in reply.tool_calls:
            if call.name not in self._names:
                raise FormatError(f"unknown tool {call.name!r}; the tools are {', '.join(sorted(self._names))}")
            arguments = json_arguments(call)
            self.check(call.name, arguments)
            if call.name == "done":
                answer = arguments.get("response", arguments.get("answer", ""))
                actions.append(Action("submit", {"answer": str(answer)}, call.id))
            else:
                actions.append(Action(call.name, arguments, call.id))
        return actions

    def check(self, name: str, arguments: dict[str, Any]) -> None:
        """FormatError naming what is wrong with a call's arguments."""
        schema = next(t["function"]["parameters"] for t in self.schemas if t["function"]["name"] == name)
        for field in schema["required"]:
            if field not in arguments:
                raise FormatError(f"{name} needs `{field}`")
        for field, value in arguments.items():
            spec = schema["properties"].get(field)
            if spec is None:
                raise FormatError(f"{name} takes no `{field}`; it takes {', '.join(schema['properties']) or 'nothing'}")
            _check_value(name, field, value, spec)

    def execute(self, action: Action, box: Sandbox, workdir: str) -> str:
        from orchard.recipes.gui.task import session_of

        self._box = box
        session = session_of(box)
        try:
            return self.act(session, action.name, action.arguments)
        except (_Refused, InvalidRequest) as refused:  # the action cannot be taken: the model is told why
            return f"Error: {refused}"

    def act(self, session: Session, name: str, arguments: dict[str, Any]) -> str:
        raise NotImplementedError

    def after_actions(self, box: Sandbox) -> list[Message]:
        """The page after the turn's actions, as one user message."""
        return [{"role": "user", "content": self.view(box)}]

    def view(self, box: Sandbox) -> list[dict[str, Any]]:
        raise NotImplementedError

    # actions both harnesses share ------------------------------------------------------------

    def goto(self, session: Session, url: str) -> str:
        browser = session.browser
        here = browser.url if session.task.allows(browser.url) else session.task.start_url()  # a new tab: about:blank
        target = urljoin(here, url.strip())
        if not session.task.allows(target):
            raise _Refused(f"{url!r} is not a page of this task; stay on its site")
        navigated = browser.goto(target)
        browser.settle()
        return f"opened {browser.url}" if navigated else f"could not open {target}"

    def wait(self, session: Session, arguments: dict[str, Any]) -> str:
        seconds = min(float(arguments.get("seconds", 1.0)), MAX_WAIT)
        time.sleep(seconds)
        session.browser.settle()
        return f"waited {seconds:g} s"

    def back(self, session: Session) -> str:
        went = session.browser.back()
        session.browser.settle()
        return f"went back to {session.browser.url}" if went else "there is no previous page"

    def scroll(self, session: Session, direction: str, amount: int, at: tuple[float, float] | None) -> str:
        dx, dy = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}[direction]
        before = session.browser.evaluate("[scrollX, scrollY]")
        session.browser.scroll(dx * amount * SCROLL_PX, dy * amount * SCROLL_PX, at=at)
        session.browser.settle()
        after = session.browser.evaluate("[scrollX, scrollY]")
        return (
            f"scrolled {direction}"
            if after != before or at is not None
            else f"scrolled {direction}: the page did not move"
        )

    def tabs(self, session: Session, name: str, index: int | None = None) -> str:
        browser = session.browser
        if name in ("new_tab",):
            browser.new_tab()
        elif name in ("switch_tab", "tab_focus"):
            tabs = browser.tabs()
            if index is None or not 0 <= index < len(tabs):
                raise _Refused(f"there is no tab {index}: the tabs are 0 to {len(tabs) - 1}")
            if tabs[index].url != "about:blank" and not session.task.allows(tabs[index].url):
                raise _Refused(f"tab {index} shows a page that is not this task's ({_short(tabs[index].url, 80)})")
            browser.switch_tab(index)
        else:
            if len(browser.tabs()) == 1:
                raise _Refused("this is the only tab: it cannot be closed")
            browser.close_tab()
        browser.settle()
        return f"the active tab is now {browser.url}"

    def select(self, session: Session, element: Element | None, value: str) -> str:
        """Choose the option of a <select> whose text (or value) is `value`."""
        if element is None or element.tag != "select":
            raise _Refused("that is not a drop-down list (a <select>)")
        selector = json.dumps(f'[data-orchard-bid="{element.bid}"]')
        chosen = session.browser.evaluate(
            f"(() => {{ const s = document.querySelector({selector}); if (!s) return null;"
            f" const want = {json.dumps(value.strip().lower())};"
            " const o = [...s.options].find(o => o.text.trim().toLowerCase() === want || o.value.toLowerCase() === want);"
            " if (!o) return null; s.value = o.value;"
            " s.dispatchEvent(new Event('input', {bubbles: true})); s.dispatchEvent(new Event('change', {bubbles: true}));"
            " return o.text.trim(); })()"
        )
        session.browser.settle()
        if not isinstance(chosen, str):
            options = ", ".join(repr(o) for o in element.options[:20])
            raise _Refused(f"the list has no option {value!r}; its options are {options}")
        return f"selected {chosen!r} in {_describe(element)}"

    def fill(self, session: Session, text: str) -> str:
        """Replace what the focused field holds with `text` (a <select>: choose that option)."""
        browser = session.browser
        focused = browser.focused()
        if focused is None:
            raise _Refused("no field has the focus: click one first")
        if focused.tag == "select":
            return self.select(session, focused, text)
        if focused.role not in TEXT_ROLES:
            raise _Refused(f"{_describe(focused)} has the focus, and it takes no text: click a field first")
        browser.clear_focused()
        browser.insert_text(text)
        browser.settle()
        after = browser.focused()
        value = after.value if after is not None else None
        return f"typed into {_describe(focused)}; it now holds {_short(value or '', 200)!r}"

    # the scripted model ----------------------------------------------------------------------

    def encode(self, step: Step, index: int) -> Reply:
        if step.kind in ("submit", "say"):
            said = step.content or step.thought or "Done."
            return self.call(index, "done", {"response" if self.name == "computer" else "answer": said}, step.thought)
        if step.kind != "call":
            raise ConfigError(f"the {self.name} harness has only a browser: it cannot play a {step.kind!r} step")
        arguments = dict(step.arguments)
        if step.tool == "goto":
            return self.call(index, "goto_url" if self.name == "computer" else "goto", {"url": arguments["url"]})
        if step.tool == "press":
            return self.press_call(index, list(arguments["keys"]), bool(arguments.get("hotkey", False)))
        if step.tool == "scroll":
            return self.call(
                index, "scroll", {"direction": arguments.get("direction", "down"), "amount": arguments.get("amount", 3)}
            )
        if step.tool == "wait":
            return self.call(index, "wait", {"seconds": arguments.get("seconds", 1)})
        if step.tool not in ("click", "write", "select", "hover"):
            raise ConfigError(f"a browser script has no step {step.tool!r}")
        from orchard.recipes.gui.task import session_of

        if self._box is None:
            raise ConfigError("the scripted model played before the page was shown")
        session = session_of(self._box)
        element = session.browser.locate(arguments["target"])
        if element is None:
            said = f"I could not find {arguments['target']!r} on the page."
            return self.call(index, "done", {"response" if self.name == "computer" else "answer": said})
        text = arguments.get("text", arguments.get("value", ""))
        if "text_js" in arguments:
            text = str(session.browser.evaluate(str(arguments["text_js"])))
        return self.target_call(index, step.tool, element, str(text), step.thought)

    def call(self, index: int, name: str, arguments: dict[str, Any], thought: str = "") -> Reply:
        return Reply(
            content=thought, tool_calls=[ToolCall(f"call_{index}_{uuid.uuid4().hex[:8]}", name, json.dumps(arguments))]
        )

    def press_call(self, index: int, keys: list[str], hotkey: bool) -> Reply:
        raise NotImplementedError

    def target_call(self, index: int, tool: str, element: Element, text: str, thought: str) -> Reply:
        raise NotImplementedError


class ComputerHarness(BrowserHarness):
    """Screenshots and the 13 tools on a 0-1000 grid."""

    name = "computer"
    system = COMPUTER_SYSTEM
    schemas = COMPUTER_TOOLS
    keep_images = 1

    def act(self, session: Session, name: str, arguments: dict[str, Any]) -> str:
        browser = session.browser
        if name in ("click", "hover"):
            x, y = self.pixel(browser, arguments["point_2d"])
            hit = browser.element_at(x, y)
            before = browser.navigations
            if name == "hover":
                browser.hover(x, y)
                browser.settle()
                return f"the mouse is over {_describe(hit)}"
            clicks, button = int(arguments.get("clicks", 1)), str(arguments.get("button", "left"))
            browser.click(x, y, clicks=clicks, button=button)
            browser.settle()
            what = {1: "clicked", 2: "double-clicked"}.get(clicks, f"clicked {clicks} times")
            moved = f"; the page navigated to {browser.url}" if browser.navigations != before else ""
            side = "" if button == "left" else f" with the {button} button"
            return f"{what} {_describe(hit)}{side}{moved}"
        if name == "write":
            return self.fill(session, _text(arguments["message"]))
        if name == "press_keys":
            return _press(session, arguments)
        if name == "scroll":
            at = self.pixel(browser, arguments["point_2d"]) if "point_2d" in arguments else None
            return self.scroll(session, arguments["direction"], int(arguments.get("amount", 3)), at)
        if name == "wait":
            return self.wait(session, arguments)
        if name == "goto_url":
            return self.goto(session, str(arguments["url"]))
        if name == "go_back":
            return self.back(session)
        if name == "drag":
            start = self.pixel(browser, arguments["start_point_2d"])
            end = self.pixel(browser, arguments["end_point_2d"])
            browser.drag(start, end, steps=int(arguments.get("steps", 10)))
            browser.settle()
            return f"dragged from {_describe(browser.element_at(*start))} to {list(arguments['end_point_2d'])}"
        return self.tabs(session, name, arguments.get("tab_index"))

    def pixel(self, browser: Browser, point: list[int]) -> tuple[float, float]:
        width, height = browser.viewport
        return (min(point[0], GRID) * (width - 1) / GRID, min(point[1], GRID) * (height - 1) / GRID)

    def view(self, box: Sandbox) -> list[dict[str, Any]]:
        from orchard.recipes.gui.task import session_of

        session = session_of(box)
        png = session.browser.screenshot()
        url = "data:image/png;base64," + base64.b64encode(png).decode()
        return [{"type": "text", "text": _tabs_line(session.browser)}, {"type": "image_url", "image_url": {"url": url}}]

    def press_call(self, index: int, keys: list[str], hotkey: bool) -> Reply:
        return self.call(index, "press_keys", {"keys": keys, "is_hotkey": hotkey})

    def target_call(self, index: int, tool: str, element: Element, text: str, thought: str) -> Reply:
        x, y, width, height = element.box
        assert self._box is not None
        from orchard.recipes.gui.task import session_of

        vw, vh = session_of(self._box).browser.viewport
        point = [round((x + width / 2) * GRID / (vw - 1)), round((y + height / 2) * GRID / (vh - 1))]
        point = [min(max(p, 0), GRID) for p in point]
        click = ToolCall(
            f"call_{index}_{uuid.uuid4().hex[:8]}",
            "hover" if tool == "hover" else "click",
            json.dumps({"point_2d": point}),
        )
        calls = [click]
        if tool in ("write", "select"):
            calls.append(ToolCall(f"call_{index}_{uuid.uuid4().hex[:8]}b", "write", json.dumps({"message": text})))
        return Reply(content=thought, tool_calls=calls)


BID = {"type": "string", "description": "The element's id, as the page text shows it in brackets."}

BID_TOOLS = [
    _function("click", "Click an element.", {"bid": BID}, ["bid"]),
    _function(
        "fill", "Type into a field, replacing what it holds.", {"bid": BID, "text": {"type": "string"}}, ["bid", "text"]
    ),
    _function(
        "select_option",
        "Choose an option of a drop-down list.",
        {"bid": BID, "value": {"type": "string", "description": "The option's text."}},
        ["bid", "value"],
    ),
    _function("hover", "Move the mouse over an element.", {"bid": BID}, ["bid"]),
    _function(
        "press",
        "Press keys on the focused element: `Enter`, `Tab`, `ctrl+a` (a `+` joins a hotkey).",
        {"keys": {"type": "string"}},
        ["keys"],
    ),
    _function(
        "scroll",
        "Scroll the page.",
        {"direction": DIRECTION, "amount": {"type": "integer", "minimum": 1, "maximum": MAX_SCROLL}},
        ["direction"],
    ),
    _function("goto", "Open a URL in the current tab.", {"url": {"type": "string"}}, ["url"]),
    _function("go_back", "Go back to the previous page.", {}, []),
    _function("wait", "Wait for the page.", {"seconds": {"type": "number", "minimum": 0, "maximum": MAX_WAIT}}, []),
    _function("new_tab", "Open a new blank tab and switch to it.", {}, []),
    _function("tab_focus", "Switch to a tab.", {"index": {"type": "integer", "minimum": 0}}, ["index"]),
    _function("tab_close", "Close the current tab.", {}, []),
    _function("done", "Finish the task with your answer to the user.", {"answer": {"type": "string"}}, ["answer"]),
]


class BidHarness(BrowserHarness):
    """The page as text with element ids, and tools that name elements by id."""

    name = "bid"
    system = BID_SYSTEM
    schemas = BID_TOOLS

    def act(self, session: Session, name: str, arguments: dict[str, Any]) -> str:
        browser = session.browser
        if name in ("click", "fill", "select_option", "hover"):
            element = self.element(session, str(arguments["bid"]))
            x, y, width, height = element.box
            center = (x + width / 2, y + height / 2)
            if name == "select_option":
                return self.select(session, element, str(arguments["value"]))
            before = browser.navigations
            if name == "hover":
                browser.hover(*center)
                browser.settle()
                return f"the mouse is over {_describe(element)}"
            browser.click(*center)
            browser.settle()
            if name == "fill":
                return self.fill(session, _text(arguments["text"]))
            moved = f"; the page navigated to {browser.url}" if browser.navigations != before else ""
            return f"clicked {_describe(element)}{moved}"
        if name == "press":
            keys = [k for k in str(arguments["keys"]).split("+") if k] or [str(arguments["keys"])]
            return _press(session, {"keys": keys, "is_hotkey": len(keys) > 1})
        if name == "scroll":
            return self.scroll(session, arguments["direction"], int(arguments.get("amount", 3)), None)
        if name == "goto":
            return self.goto(session, str(arguments["url"]))
        if name == "go_back":
            return self.back(session)
        if name == "wait":
            return self.wait(session, arguments)
        return self.tabs(session, name, arguments.get("index"))

    def element(self, session: Session, bid: str) -> Element:
        found = next((e for e in session.browser.elements() if e.bid == bid.strip("[] ")), None)
        if found is None:
            raise _Refused(f"no element [{bid}] is on the page now; use an id the page text shows")
        return found

    def view(self, box: Sandbox) -> list[dict[str, Any]]:
        from orchard.recipes.gui.task import session_of

        browser = session_of(box).browser
        elements = {e.bid: e for e in browser.elements()}  # assigns the ids the outline shows
        outline = browser.evaluate(OUTLINE_JS)
        text = _outline(outline if isinstance(outline, str) else "", elements)
        return [{"type": "text", "text": f"{_tabs_line(browser)}\n\n{clip(text, OUTLINE_CHARS) or '[an empty page]'}"}]

    def after_actions(self, box: Sandbox) -> list[Message]:
        return [{"role": "user", "content": self.view(box)[0]["text"]}]

    def opening(self, box: Sandbox) -> list[dict[str, Any]]:
        self._box = box
        return self.view(box)

    def press_call(self, index: int, keys: list[str], hotkey: bool) -> Reply:
        return self.call(index, "press", {"keys": "+".join(keys)})

    def target_call(self, index: int, tool: str, element: Element, text: str, thought: str) -> Reply:
        if tool == "write":
            return self.call(index, "fill", {"bid": element.bid, "text": text}, thought)
        if tool == "select":
            return self.call(index, "select_option", {"bid": element.bid, "value": text}, thought)
        return self.call(index, tool, {"bid": element.bid}, thought)


OUTLINE_JS = r"""(() => {
  const lines = [], seen = new Set(), vh = innerHeight, vw = innerWidth;
  const visible = (el) => { const r = el.getBoundingClientRect(); const s = getComputedStyle(el);
    return r.width > 0 && r.height > 0 && r.bottom > 0 && r.right > 0 && r.top < vh && r.left < vw
      && s.visibility !== 'hidden' && s.display !== 'none'; };
  const walk = (node, depth) => {
    if (lines.length > 600) return;
    if (node.nodeType === 3) { const t = node.textContent.replace(/\s+/g, ' ').trim();
      if (t && node.parentElement && visible(node.parentElement)) lines.push('  '.repeat(depth) + t.slice(0, 200)); return; }
    if (node.nodeType !== 1) return;
    const el = node, tag = el.tagName.toLowerCase();
    if (['script', 'style', 'noscript', 'template', 'head'].includes(tag)) return;
    const bid = el.getAttribute('data-orchard-bid');
    if (bid && /^[0-9]{1,9}$/.test(bid) && visible(el) && !seen.has(bid)) {
      seen.add(bid);
      lines.push('  '.repeat(depth) + '\u0000' + bid);
      if (['a', 'button', 'select', 'textarea', 'label', 'summary', 'input'].includes(tag)) return;
    }
    for (const child of el.childNodes) walk(child, depth + (bid ? 1 : 0));
  };
  walk(document.body || document.documentElement, 0);
  return lines.join('\n');
})()"""
"""The page's visible text in document order, each element `elements()` gave an id marked as a NUL
and its id (the host writes the element's line from its checked `Element`)."""


class _Refused(Exception):
    """An action the page cannot take (no such tab, a URL of another site): told to the model."""


def _check_value(tool: str, field: str, value: Any, spec: dict[str, Any]) -> None:
    kind = spec.get("type")
    where = f"{tool}: `{field}`"
    if kind == "array":
        if not (isinstance(value, list) and len(value) >= spec.get("minItems", 0)):
            raise FormatError(f"{where} must be a list" + (f" of {spec['minItems']}" if "minItems" in spec else ""))
        if "maxItems" in spec and len(value) > spec["maxItems"]:
            raise FormatError(f"{where} must be a list of at most {spec['maxItems']}")
        for item in value:
            _check_value(tool, field, item, spec["items"])
    elif kind == "integer":
        if isinstance(value, float) and _finite(value) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise FormatError(f"{where} must be a whole number, not {str(value)[:40]}")
    elif kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float) or not _finite(value):
            raise FormatError(f"{where} must be a number, not {str(value)[:40]}")
    elif kind == "string":
        if not isinstance(value, str):
            raise FormatError(f"{where} must be a string, not {value!r:.40}")
        if "enum" in spec and value not in spec["enum"]:
            raise FormatError(f"{where} must be one of {', '.join(spec['enum'])}, not {value!r:.40}")
    elif kind == "boolean" and not isinstance(value, bool):
        raise FormatError(f"{where} must be true or false")
    if kind in ("integer", "number"):
        low, high = spec.get("minimum"), spec.get("maximum")
        if (low is not None and value < low) or (high is not None and value > high):
            raise FormatError(f"{where} must be from {low} to {high}, not {value!r:.40}")


def _finite(value: int | float) -> bool:
    """A finite number a float can hold (a 400-digit JSON integer cannot)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _text(value: Any) -> str:
    text = str(value)
    if len(text) > MAX_TEXT:
        raise _Refused(f"at most {MAX_TEXT} characters can be typed at once")
    return text


def _press(session: Session, arguments: dict[str, Any]) -> str:
    keys = [str(k) for k in arguments["keys"]]
    presses = int(arguments.get("presses", 1))
    hotkey = bool(arguments.get("is_hotkey", False))
    before = session.browser.navigations
    session.browser.press(keys, hotkey=hotkey, presses=presses)  # a key it does not have: InvalidRequest, told
    session.browser.settle()
    pressed = "+".join(keys) if hotkey else " ".join(keys)
    moved = f"; the page navigated to {session.browser.url}" if session.browser.navigations != before else ""
    return f"pressed {pressed}" + (f" {presses} times" if presses > 1 else "") + moved


def _describe(element: Element | None) -> str:
    if element is None:
        return "nothing (an empty part of the page)"
    name = f' "{_short(element.name, 60)}"' if element.name else ""
    return f"the {element.role or element.tag}{name}"


def _outline(raw: str, elements: dict[str, Element]) -> str:
    """The page's outline: its text lines, and a line for each element with an id, written from
    the element as the host checked it (`[12] button "Add to cart"`)."""
    lines = []
    for line in raw[: OUTLINE_CHARS * 4].split("\n"):
        indent, _, bid = line.partition("\x00")
        if not _:
            lines.append(_short(line, 200) if line.strip() else "")
            continue
        element = elements.get(bid)
        if element is None:
            continue  # out of view, or not an element the host knows
        extra = ""
        if element.checked is not None:
            extra = " (checked)" if element.checked else " (not checked)"
        elif element.options:
            listed = ", ".join(repr(_short(o, 40)) for o in element.options[:20])
            extra = f" selected={_short(element.value or '', 80)!r} options=[{listed}]"
        elif element.value is not None:
            extra = f" value={_short(element.value, 80)!r}"
        lines.append(f'{indent[:40]}[{element.bid}] {element.role or element.tag} "{_short(element.name, 80)}"{extra}')
    return "\n".join(line for line in lines if line)


_CONTROLS = {code: " " for code in (*range(32), 127)}


def _short(text: str, limit: int) -> str:
    """One line of at most `limit` characters, with no control characters (a page's escape codes
    reach neither the model nor a terminal)."""
    flat = " ".join(str(text).translate(_CONTROLS).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _tabs_line(browser: Browser) -> str:
    try:
        tabs = browser.tabs()
    except OrchardError:
        tabs = []
    listed = "; ".join(
        f"{'*' if t.active else ''}[{t.index}] {_short(t.title, 40)!r} {_short(t.url, 120)}" for t in tabs
    )
    return f"URL: {browser.url}\nTabs: {listed}"
