"""The dashboard driven with Textual's Pilot, and SVG snapshots of each screen at 80x24."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable, Static

from orchard.store import Store
from orchard.tui.app import OrchardApp, RunScreen, SandboxesScreen, TrajectoryScreen

NOW = 1_796_000_000.0  # the fixture store's clock (tests/tui/conftest.py)


def app_for(db_url: str, deleted: list[str] | None = None) -> OrchardApp:
    """The app on a fixed clock; deletions are recorded instead of reaching an engine (the real
    deletion is tested in test_deleting_a_real_sandbox)."""
    return OrchardApp(
        Store.open(db_url),
        refresh_seconds=3600,
        now=lambda: NOW,
        delete_sandbox=(deleted.append if deleted is not None else None),
    )


async def test_runs_filters_detail_and_trajectory(filled_store):
    app = app_for(filled_store)
    async with app.run_test(size=(80, 24)) as pilot:
        runs = app.screen.query_one("#runs", DataTable)
        assert runs.row_count == 3
        await pilot.press("k")  # kind: eval
        assert app.screen.query_one("#runs", DataTable).row_count == 1
        await pilot.press("k", "k", "k")  # ... credit, sft
        assert [app.screen.query_one("#runs", DataTable).get_row_at(0)[0]] == ["swe-sft"]
        await pilot.press("enter")
        assert isinstance(app.screen, RunScreen)
        assert "loss: 1.25 (step 5, 5 points)" in str(app.screen.query("Label").nodes[0].render())
        await pilot.press("escape", "k", "k", "k", "t", "t")  # kind: rl, value, back to all; status: running, finished
        assert app.screen.query_one("#runs", DataTable).row_count == 2
        await pilot.press("t", "t")  # status: failed, interrupted
        assert app.screen.query_one("#runs", DataTable).get_row_at(0)[0] == "swe-rl"


async def test_a_trajectory_shows_values_credits_and_the_rise(filled_store):
    app = app_for(filled_store)
    async with app.run_test(size=(80, 24)) as pilot:
        app.push_screen(RunScreen("eval-1"))
        await pilot.pause()
        matrix = app.screen.query_one("#matrix", DataTable)
        assert [matrix.get_row_at(i)[:3] for i in range(2)] == [["bash", "1/2", "50%"], ["tools", "2/2", "100%"]]
        await pilot.press("enter")  # the trajectories table has the focus
        assert isinstance(app.screen, TrajectoryScreen)
        steps = app.screen.query_one("#steps", DataTable)
        assert [steps.get_row_at(i)[1:3] for i in range(4)] == [
            ["+0.00", ""],
            ["+0.00", ""],
            ["+1.00", "▲"],
            ["-1.00", ""],
        ]
        text = str(app.screen.query_one("#patch", Static).render())
        assert "(empty patch)" in text and "FAILED   tests/test_wrap.py::test_exact_fit" in text


async def test_rise_steps_follow_the_epsilon_the_run_was_configured_with(filled_store):
    """A run storing its recipe's `credit.epsilon` marks only credits at least that high (here none)."""
    import json

    from orchard.store import RunRecord, session

    with session(filled_store) as db:
        run = db.get(RunRecord, "eval-1")
        run.config = json.dumps({"credit": {"epsilon": 1.5}})
        db.add(run)
    app = app_for(filled_store)
    async with app.run_test(size=(80, 24)) as pilot:
        app.push_screen(TrajectoryScreen("traj-1"))
        await pilot.pause()
        steps = app.screen.query_one("#steps", DataTable)
        assert [steps.get_row_at(i)[1:3] for i in range(4)] == [
            ["+0.00", ""],
            ["+0.00", ""],
            ["+1.00", ""],
            ["-1.00", ""],
        ]


async def test_sandboxes_list_and_delete(filled_store):
    deleted: list[str] = []
    app = app_for(filled_store, deleted)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("s")
        assert isinstance(app.screen, SandboxesScreen)
        table = app.screen.query_one(DataTable)
        assert table.row_count == 2  # the deleted one is not live
        assert table.get_row_at(0) == ["0f9e8d7c6b5a", "orchard/busybox:static", "open", "67m", "0", ""]
        assert table.get_row_at(1)[3:] == ["95s", "2", "python3 -m pytest -q"]
        await pilot.press("d")
        assert deleted == ["0f9e8d7c6b5a"]


@pytest.mark.parametrize(
    ("name", "keys"),
    [("runs", []), ("run_detail", ["k", "k", "k", "k", "enter"]), ("sandboxes", ["s"])],
)
def test_snapshots(filled_store, snap_compare, name, keys):
    assert snap_compare(app_for(filled_store), terminal_size=(80, 24), press=keys)


def test_snapshot_trajectory(filled_store, snap_compare):
    async def open_trajectory(pilot):
        pilot.app.push_screen(TrajectoryScreen("traj-1"))
        await pilot.pause()

    assert snap_compare(app_for(filled_store), terminal_size=(80, 24), run_before=open_trajectory)


async def test_deleting_a_real_sandbox(docker_client, busybox_image, tmp_path):
    from orchard.env import Client
    from orchard.store import SandboxRecord, session

    db_url = f"sqlite:///{tmp_path / 'live.db'}"
    with Client(store=Store.open(db_url)) as client:
        box = client.create(busybox_image)
        app = OrchardApp(Store.open(db_url), refresh_seconds=3600)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.press("s")
            assert app.screen.query_one(DataTable).get_row_at(0)[0] == box.id
            await pilot.press("d")
            await pilot.pause()
            assert app.screen.query_one(DataTable).row_count == 0
        assert docker_client.api.containers(all=True, filters={"name": f"orchard-{box.id}"}) == []
        with session(Store.open(db_url)) as db:
            assert db.get(SandboxRecord, box.id).status == "deleted"


async def test_deleting_a_service_sandbox_goes_through_the_service(start_service, busybox_image, tmp_path, monkeypatch):
    """The service lets go of it too: deleted behind its back, it would still list it."""
    from orchard.env import Client
    from orchard.store import SandboxRecord, session

    db = tmp_path / "service.db"
    with start_service(db) as (url, key):
        monkeypatch.setenv("ORCHARD_URL", url)
        monkeypatch.setenv("ORCHARD_API_KEY", key)
        with Client(url=url) as client:
            box = client.create(busybox_image)
            app = OrchardApp(Store.open(f"sqlite:///{db}"), refresh_seconds=3600)
            async with app.run_test(size=(80, 24)) as pilot:
                await pilot.press("s")
                assert app.screen.query_one(DataTable).get_row_at(0)[0] == box.id
                await pilot.press("d")
                await pilot.pause()
                assert app.screen.query_one(DataTable).row_count == 0
            assert client.list() == []
        with session(f"sqlite:///{db}") as db_session:
            assert db_session.get(SandboxRecord, box.id).status == "deleted"


def _browser_trajectory(db_url: str, tmp_path) -> str:
    """A stored browser trajectory of two steps, each leaving a screenshot (a real PNG, kept as a file
    the way the loop stores them): red over blue after step 0, green after step 1."""
    import io
    import json

    from PIL import Image

    from orchard.agents.loop import store_images
    from orchard.store import StepRecord, TrajectoryRecord, session

    def png(top: tuple[int, int, int], bottom: tuple[int, int, int]) -> str:
        image = Image.new("RGB", (64, 40), top)
        image.paste(bottom, (0, 20, 64, 40))
        out = io.BytesIO()
        image.save(out, "PNG")
        import base64

        return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()

    def shot(url: str) -> dict:
        return {
            "role": "user",
            "content": [{"type": "text", "text": "URL: x"}, {"type": "image_url", "image_url": {"url": url}}],
        }

    call = {"id": "c", "type": "function", "function": {"name": "click", "arguments": "{}"}}
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "buy a lamp"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "clicked"},
        shot(png((255, 0, 0), (0, 0, 255))),
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "clicked"},
        shot(png((0, 255, 0), (0, 255, 0))),
    ]
    stored = store_images(messages, tmp_path / "images")
    with session(Store.open(db_url)) as db:
        db.add(
            TrajectoryRecord(
                id="gui-1",
                run_id=None,
                instance_id="gui-shop",
                harness="computer",
                model="m",
                sample=0,
                status="completed",
                messages=json.dumps(stored),
                tools="[]",
                patch="",
                steps=2,
                prompt_tokens=0,
                completion_tokens=0,
                format_errors=0,
                duration=1.0,
                created_at=NOW,
            )
        )
        for index in range(2):
            db.add(
                StepRecord(
                    id=f"gui-1/{index}",
                    trajectory_id="gui-1",
                    index=index,
                    reply="",
                    actions=json.dumps([{"name": "click", "arguments": {"point_2d": [10, 10]}}]),
                    observation="clicked",
                    prompt_tokens=0,
                    completion_tokens=0,
                    duration=0.1,
                )
            )
    return str(tmp_path / "images")


async def test_a_browser_trajectory_shows_each_steps_screenshot_as_a_picture(tmp_path):
    """Each step's screenshot, drawn in half blocks (two pixels a cell: the top one the foreground,
    the bottom one the background) under its file's path; moving to another step shows its own."""
    from orchard.tui.picture import half_blocks

    db_url = f"sqlite:///{tmp_path / 'gui.db'}"
    folder = _browser_trajectory(db_url, tmp_path)
    app = app_for(db_url)
    async with app.run_test(size=(80, 40)) as pilot:
        app.push_screen(TrajectoryScreen("gui-1"))
        await pilot.pause()
        shown = app.screen.query_one("#screenshot", Static)
        first = str(shown.render())
        assert shown.display and f"screenshot after step 0: {folder}/" in first and "▀" * 20 in first
        path = first.split(": ", 1)[1].split("\n", 1)[0]
        picture = half_blocks(path, 8)
        top, bottom = picture.spans[0].style, picture.spans[-1].style  # the image: red over blue
        assert (top.color.triplet, bottom.bgcolor.triplet) == ((255, 0, 0), (0, 0, 255))
        steps = app.screen.query_one("#steps", DataTable)
        steps.focus()
        await pilot.press("down")  # step 1: its own screenshot
        await pilot.pause()
        second = str(app.screen.query_one("#screenshot", Static).render())
        assert "screenshot after step 1" in second and path not in second


async def test_an_empty_home_says_how_to_make_a_run_and_a_filter_that_hides_all_says_so(tmp_path, filled_store):
    empty = OrchardApp(Store.open(f"sqlite:///{tmp_path / 'empty.db'}"), refresh_seconds=3600, now=lambda: NOW)
    async with empty.run_test(size=(80, 24)):
        hint = empty.screen.query_one("#hint", Static)
        assert hint.display and "no runs yet: `orchard eval --tasks" in str(hint.render())
    app = app_for(filled_store)
    async with app.run_test(size=(80, 24)) as pilot:
        assert not app.screen.query_one("#hint", Static).display  # runs to show: no hint
        await pilot.press("k", "k")  # kind: collect, of which the store has none
        hint = app.screen.query_one("#hint", Static)
        assert hint.display and str(hint.render()) == "no runs match these filters: k and t change them"


async def test_a_trajectory_without_values_draws_no_chart(filled_store):
    from orchard.store import TrajectoryRecord, session

    store = Store.open(filled_store)
    with session(store) as db:
        db.add(
            TrajectoryRecord(
                id="traj-bare", run_id="eval-1", instance_id="orchard-examples__textkit-2", harness="bash",
                model="noop", status="completed", messages="[]", patch="", outcome="empty_patch", resolved=False,
                steps=0, created_at=NOW,
            )
        )  # fmt: skip
        db.commit()
    app = app_for(filled_store)
    async with app.run_test(size=(80, 24)) as pilot:
        app.push_screen(TrajectoryScreen("traj-1"))
        await pilot.pause()
        assert app.screen.query_one("#values").display  # values after each step: charted
        app.push_screen(TrajectoryScreen("traj-bare"))
        await pilot.pause()
        assert not app.screen.query_one("#values").display  # none: no chart of a made-up zero


def test_a_running_evaluation_shows_its_total_and_an_eta():
    from orchard.store.views import RunRow
    from orchard.tui.app import _progress

    running = RunRow("eval-x", "eval", "running", NOW - 60, "", 3, None, total=10)
    assert _progress(running, NOW) == "3/10 graded, ETA 2m"  # 20 s an attempt, 7 left
    assert _progress(RunRow("eval-x", "eval", "running", NOW - 5, "", 0, None, total=10), NOW) == "0/10 graded"
    assert _progress(RunRow("eval-x", "eval", "finished", NOW - 60, "", 10, None, total=10), NOW) == "10/10 graded"
    assert _progress(RunRow("swe-sft", "sft", "running", NOW - 60, "", 0, 5), NOW) == "step 5"


async def test_a_step_opens_in_full_and_a_patch_is_coloured(filled_store):
    from orchard.tui.app import StepScreen, _diff

    app = app_for(filled_store)
    async with app.run_test(size=(200, 50)) as pilot:
        app.push_screen(TrajectoryScreen("traj-1"))
        await pilot.pause()
        app.screen.query_one("#steps", DataTable).focus()
        await pilot.press("down", "enter")  # the second step, in full
        assert isinstance(app.screen, StepScreen) and app.screen.step.index == 1
        shown = str(app.screen.query_one("#step", Static).render())
        step = app.screen.step
        assert "model reply" in shown and step.reply.strip().splitlines()[0] in shown
        assert f"tool calls ({len(step.actions)})" in shown and step.observation.strip()[-30:] in shown
        await pilot.press("escape")
        assert isinstance(app.screen, TrajectoryScreen)
    coloured = _diff("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old\n+new\n")
    styles = {coloured.plain[span.start : span.end].strip(): str(span.style) for span in coloured.spans}
    assert (styles["-old"], styles["+new"], styles["@@ -1 +1 @@"], styles["+++ b/x"]) == (
        "red",
        "green",
        "cyan",
        "bold",
    )
