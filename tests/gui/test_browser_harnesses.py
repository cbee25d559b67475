"""The two browser harnesses on a real page: the grid maps onto the viewport, each action answers
what it did, mistakes are told to the model (never a crash), and the screenshots of an episode
stay in the model's context only as long as the harness says while the trajectory keeps them all.
The parsing and the context rules run on the host alone; the rest in real Chromium, in a real
`blocked` sandbox, through the whole agent loop."""

from __future__ import annotations

import base64
import json

import pytest

from orchard.agents.base import FormatError, Reply, ToolCall
from orchard.agents.loop import IMAGE_URL, in_context, load_images, run_episode, store_images
from orchard.agents.models import ScriptedSession
from orchard.recipes.gui.harnesses import BidHarness, ComputerHarness
from orchard.recipes.gui.task import BrowserTask
from orchard.tasks.base import Step

PAGE = """<!doctype html><html><body style="margin:0">
<button id="center" style="position:absolute;left:600px;top:460px;width:80px;height:80px">Center</button>
<input id="name" aria-label="Your name" style="position:absolute;left:20px;top:20px">
<a id="away" href="http://127.0.0.1:8000/elsewhere" style="position:absolute;left:20px;top:80px">elsewhere</a>
<p id="said" style="position:absolute;left:20px;top:140px"></p>
<script>document.getElementById('center').onclick = () => document.getElementById('said').textContent = 'pressed';</script>
</body></html>"""


class Page(BrowserTask):
    """A browser task on one file page, written into the sandbox: its `finish` says what the page shows."""

    kind: str = "page"

    def sandbox_image(self, prepare):
        return "orchard/browser:bookworm"

    def start_url(self) -> str:
        return "file:///tmp/page/index.html"

    def serve(self, box) -> None:
        box.write_file("/tmp/page/index.html", PAGE)

    def finish(self, box, browser, answer, screenshots):
        said = browser.evaluate("document.getElementById('said').textContent") if browser else None
        return json.dumps({"said": said, "answer": answer})


def call(name: str, **arguments) -> Reply:
    return Reply(tool_calls=[ToolCall("c1", name, json.dumps(arguments))])


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (Reply(content="I clicked it"), "call one of the tools"),
        (call("tap", point_2d=[1, 2]), "unknown tool 'tap'"),
        (call("click"), "click needs `point_2d`"),
        (call("click", point_2d=[500, 1001]), "`point_2d` must be from 0 to 1000, not 1001"),
        (call("click", point_2d=[500]), "`point_2d` must be a list of 2"),
        (call("click", point_2d=[1, 2], button="side"), "`button` must be one of left, right, middle"),
        (call("click", point_2d=[1, 2], where="here"), "click takes no `where`"),
        (call("press_keys", keys="Enter"), "`keys` must be a list"),
        (call("wait", seconds=float("inf")), "`seconds` must be a number"),
    ],
)
def test_a_call_the_harness_cannot_take_is_a_format_error_naming_it(reply, message):
    with pytest.raises(FormatError, match=message.replace("(", r"\(")):
        ComputerHarness().parse(reply)


def test_done_ends_the_turn_with_the_answer_in_both_harnesses():
    (done,) = ComputerHarness().parse(call("done", response="ordered"))
    assert done.is_submit and done.arguments == {"answer": "ordered"}
    (done,) = BidHarness().parse(call("done", answer="ordered"))
    assert done.is_submit and done.arguments == {"answer": "ordered"}


def png(colour: int) -> str:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (4, 4), (colour, 0, 0)).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def test_only_the_newest_screenshots_stay_in_context_and_the_trajectory_keeps_them_all(tmp_path):
    messages = [{"role": "system", "content": "s"}] + [
        {
            "role": "user",
            "content": [{"type": "text", "text": f"step {i}"}, {"type": "image_url", "image_url": {"url": png(i)}}],
        }
        for i in range(3)
    ]
    shown = in_context(messages, 1)
    images = [p for m in shown if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image_url"]
    assert [p["image_url"]["url"] for p in images] == [png(2)]  # the newest only
    assert "[an earlier screenshot, no longer shown]" in json.dumps(shown)
    assert in_context(messages, None) is messages
    stored = store_images(messages, tmp_path / "images")
    refs = [p for m in stored if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image_url"]
    assert len(refs) == 3 and all(r["image_url"]["url"].startswith(IMAGE_URL) for r in refs)
    assert len(list((tmp_path / "images").glob("*.png"))) == 3
    assert load_images(stored) == messages  # each file checked against its hash, inlined again
    (tmp_path / "images" / (refs[0]["image_url"]["url"].removeprefix(IMAGE_URL) + ".png")).write_bytes(b"changed")
    assert load_images(stored)[1]["content"][1] == refs[0]  # a changed file is not taken for the image


@pytest.fixture(scope="module")
def page_box(client, browser_image):
    with client.create(browser_image, network="blocked", memory="4Gi") as box:
        yield box


def episode(box, harness, steps: list[Step]):
    task = Page(instance_id="page", problem_statement="Press the button in the middle.")
    return run_episode(task, harness, ScriptedSession(steps, harness), box, model_name="scripted")


def test_the_grid_maps_onto_the_viewport_and_each_action_says_what_it_did(page_box):
    harness = ComputerHarness()
    steps = [
        Step("call", tool="click", arguments={"target": "#name"}),  # the scripted model's point on the grid
        Step("submit", content="done"),
    ]
    done = episode(page_box, harness, steps)
    assert done.status == "completed", done.error
    assert done.steps[0].observation == 'clicked the textbox "Your name"'
    first = done.messages[1]["content"]  # the task, then the page as it started: its tabs, a screenshot
    assert [p["type"] for p in first] == ["text", "text", "image_url"]
    assert "URL: file:///tmp/page/index.html" in first[1]["text"]

    class Center(ComputerHarness):
        """Plays the grid's center point, [500, 500], then text into the button it focused, a tab
        that does not exist and a page of another site."""

        def encode(self, step, index):
            return [
                call("click", point_2d=[500, 500]),
                call("write", message="x"),
                call("switch_tab", tab_index=3),
                call("goto_url", url="http://127.0.0.1:8000/elsewhere"),
                call("done", response="pressed"),
            ][index - 1]

    done = episode(page_box, Center(), [Step("submit")] * 5)
    assert done.status == "completed", done.error
    assert [s.observation for s in done.steps[:4]] == [
        'clicked the button "Center"',
        'Error: the button "Center" has the focus, and it takes no text: click a field first',
        "Error: there is no tab 3: the tabs are 0 to 0",
        "Error: 'http://127.0.0.1:8000/elsewhere' is not a page of this task; stay on its site",
    ]
    assert json.loads(done.submission) == {"said": "pressed", "answer": "pressed"}
    screenshots = [m for m in done.messages if m["role"] == "user" and isinstance(m["content"], list)]
    assert len(screenshots) == 5  # the opening page and one after each turn that acted


def test_the_bid_harness_shows_the_page_as_text_with_ids_and_acts_on_them(page_box):
    harness = BidHarness()
    steps = [
        Step("call", tool="write", arguments={"target": "#name", "text": "Ada"}),
        Step("call", tool="click", arguments={"target": "#center"}),
        Step("submit", content="pressed"),
    ]
    done = episode(page_box, harness, steps)
    assert done.status == "completed", done.error
    opening = done.messages[1]["content"][1]["text"]
    assert '"Center"' in opening and "Your name" in opening and "[" in opening
    assert done.steps[0].observation == "typed into the textbox \"Your name\"; it now holds 'Ada'"
    assert done.steps[1].observation == 'clicked the button "Center"'
    assert json.loads(done.submission)["said"] == "pressed"
    assert not any(isinstance(m["content"], list) and len(m["content"]) > 2 for m in done.messages)  # no pixels
