"""The dashboard driven with Textual's Pilot, and SVG snapshots of each screen at 80x24."""

from __future__ import annotations

import json

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
        assert [app.screen.query_one("#runs", DataTable).get_row_at(0)[1]] == ["swe-sft"]
        await pilot.press("enter")
        assert isinstance(app.screen, RunScreen)
        assert "loss: 1.25 (step 5, 5 points)" in str(app.screen.query("Label").nodes[0].render())
        await pilot.press("escape", "k", "k", "k", "t", "t")  # kind: rl, value, back to all; status: running, finished
        assert app.screen.query_one("#runs", DataTable).row_count == 2
        await pilot.press("t", "t")  # status: failed, interrupted
        assert app.screen.query_one("#runs", DataTable).get_row_at(0)[1] == "swe-rl"


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


def test_snapshot_compare(two_evals, snap_compare):
    assert snap_compare(
        app_for(two_evals), terminal_size=(80, 24), press=["space", "down", "down", "down", "space", "c"]
    )


def test_snapshot_a_running_run(running_eval, snap_compare):
    async def open_run(pilot):
        pilot.app.push_screen(RunScreen("eval-live"))
        await pilot.pause()

    assert snap_compare(app_for(running_eval), terminal_size=(80, 24), run_before=open_run)


def test_snapshot_a_search_in_a_run(filled_store, snap_compare):
    async def search(pilot):
        pilot.app.push_screen(RunScreen("eval-1"))
        await pilot.pause()
        await pilot.press("slash", *"output")
        await pilot.app.workers.wait_for_complete()
        await pilot.press("enter")  # no trajectory holds it: to the steps found
        await pilot.pause()

    assert snap_compare(app_for(filled_store), terminal_size=(80, 24), run_before=search)


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
        assert hint.display and str(hint.render()).startswith("no runs match these filters: k, t and / change them")


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
    from orchard.tui.run import progress

    assert progress("running", NOW - 60, 3, 10, None, NOW) == "3/10 graded, ETA 2m"  # 20 s an attempt, 7 left
    assert progress("running", NOW - 5, 0, 10, None, NOW) == "0/10 graded"
    assert progress("finished", NOW - 60, 10, 10, None, NOW) == "10/10 graded"
    assert progress("running", NOW - 60, 0, None, 5, NOW) == "step 5"


async def test_a_step_opens_in_full_and_a_patch_is_coloured(filled_store):
    from orchard.tui.app import StepScreen
    from orchard.tui.trajectory import diff_text

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
    coloured = diff_text("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old\n+new\n")
    styles = {coloured.plain[span.start : span.end].strip(): str(span.style) for span in coloured.spans}
    assert (styles["-old"], styles["+new"], styles["@@ -1 +1 @@"], styles["+++ b/x"]) == (
        "red",
        "green",
        "cyan",
        "bold",
    )


async def test_charts_are_labelled_with_their_range(filled_store):
    """A sparkline says what it draws, the values at its top and bottom, the steps it spans and
    its first and last value: without them a reader cannot tell 3 -> 1.25 from 0.3 -> 0.29."""
    from orchard.tui.widgets import Chart

    app = app_for(filled_store)
    async with app.run_test(size=(80, 24)) as pilot:
        app.push_screen(RunScreen("swe-sft"))
        await pilot.pause()
        chart = app.screen.query_one(Chart)
        assert str(chart.query_one(".chart-title").render()) == "loss: 1.25 (step 5, 5 points)"
        assert str(chart.query_one(".chart-scale").render()).split("\n") == ["max 3   ", "min 1.25"]
        assert str(chart.query_one(".chart-span").render()) == "steps 1-5\nfirst 3, last 1.25"
        app.push_screen(TrajectoryScreen("traj-1"))
        await pilot.pause()
        values = app.screen.query_one("#values", Chart)
        assert str(values.query_one(".chart-title").render()) == "value after each step: 0 (step 3, 4 points)"
        assert str(values.query_one(".chart-scale").render()).split("\n") == ["max 1", "min 0"]
        assert str(values.query_one(".chart-span").render()) == "steps 0-3\nfirst 0, last 0"


async def test_slash_searches_the_runs_and_esc_clears_it(filled_store):
    """What is typed filters at once (the store asked, not the list), keys typed are text, not
    commands (`k`, `t`, `s`), and esc brings every run back."""
    app = app_for(filled_store)
    async with app.run_test(size=(80, 24)) as pilot:
        runs = app.screen.query_one("#runs", DataTable)
        await pilot.press("slash", *"tasks")  # eval-1's name: `eval tasks.jsonl scripted:gold`
        assert [runs.get_row_at(i)[1] for i in range(runs.row_count)] == ["eval-1"]
        assert str(app.screen.query_one("#filters").render()).startswith("kind: all   status: all   search: tasks")
        await pilot.press("enter", "escape")
        assert runs.row_count == 3 and not app.screen.query_one("#search").display
        await pilot.press("slash", *"INTERRUPTED")  # a status, the case ignored
        assert [runs.get_row_at(i)[1] for i in range(runs.row_count)] == ["swe-rl"]
        await pilot.press("escape", "slash", "%")  # a LIKE wildcard is itself: no run holds one
        assert runs.row_count == 0 and app.screen.query_one("#hint").display


async def test_slash_in_a_run_filters_its_trajectories_and_finds_steps(filled_store):
    """Trajectories filter as one types; steps whose action or observation holds the text are
    listed, and open in full."""
    from orchard.store import StepRecord, TrajectoryRecord, session
    from orchard.tui.app import StepScreen

    with session(filled_store) as db:
        db.add(
            TrajectoryRecord(
                id="traj-2", run_id="eval-1", instance_id="orchard-examples__textkit-2", harness="tools",
                model="scripted:gold", status="completed", messages="[]", patch="", outcome="resolved",
                resolved=True, steps=1, created_at=NOW,
            )
        )  # fmt: skip
        db.add(
            StepRecord(
                id="traj-2/0", trajectory_id="traj-2", index=0, reply="", observation="3 passed in 0.1s",
                actions=json.dumps([{"name": "bash", "arguments": {"command": "python -m pytest -q"}}]),
            )
        )  # fmt: skip
    app = app_for(filled_store)
    async with app.run_test(size=(100, 40)) as pilot:
        app.push_screen(RunScreen("eval-1"))
        await pilot.pause()
        trajectories = app.screen.query_one("#trajectories", DataTable)
        assert trajectories.row_count == 2
        await pilot.press("slash", *"RESOLVED")  # a verdict
        assert [trajectories.get_row_at(i)[0] for i in range(trajectories.row_count)] == ["orchard-examples__textkit-2"]
        await pilot.press("escape", "slash", *"textkit/wrap.py")  # in traj-1's action of step 1 only; `/` is text
        await app.workers.wait_for_complete()
        await pilot.pause()
        hits = app.screen.query_one("#hits", DataTable)
        assert trajectories.row_count == 0
        assert [hits.get_row_at(i)[:4] for i in range(hits.row_count)] == [
            ["orchard-examples__textkit-1", "bash", "1", "action"]
        ]
        await pilot.press("enter", "enter")  # to the steps found (no trajectory kept), and the first in full
        assert isinstance(app.screen, StepScreen) and app.screen.step.index == 1
        await pilot.press("escape", "slash", *["backspace"] * 15, *"PASSED")  # traj-2's observation
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert [hits.get_row_at(i)[:4] for i in range(hits.row_count)] == [
            ["orchard-examples__textkit-2", "tools", "0", "observation"]
        ]
        await pilot.press("escape")  # the search cleared, not the screen left
        assert isinstance(app.screen, RunScreen) and trajectories.row_count == 2 and not hits.display
        await pilot.press("escape")
        assert not isinstance(app.screen, RunScreen)


async def test_two_marked_runs_compare_side_by_side(two_evals):
    """space marks, c compares: the rates of both per harness with the flips and a totals line,
    each task's outcome in both; the figures are `orchard runs compare`'s (machine errors out)."""
    from orchard.tui.compare import CompareScreen

    app = app_for(two_evals)
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("c")  # nothing marked: told how
        assert not isinstance(app.screen, CompareScreen)
        runs = app.screen.query_one("#runs", DataTable)
        order = [runs.get_row_at(i)[1] for i in range(runs.row_count)]
        await pilot.press(*["down"] * order.index("eval-2"), "space")
        assert runs.get_row_at(order.index("eval-2"))[0] == "●"
        await pilot.press(*["down"] * (order.index("eval-1") - order.index("eval-2")), "space", "c")
        assert isinstance(app.screen, CompareScreen)
        about = str(app.screen.query_one("#about").render())
        assert about.startswith("A  eval-1") and "\nB  eval-2" in about  # A started first
        assert "machine errors left out of the rates: B 1" in about
        rates = app.screen.query_one("#rates", DataTable)
        assert [[str(cell) for cell in rates.get_row_at(i)] for i in range(rates.row_count)] == [
            ["bash", "0/1 0%", "1/2 50%", "+100% (-100% to +100%)", "1", "0"],
            ["tools", "-", "1/1 100%", "-", "-", "-"],
            ["all", "0/1 0%", "2/3 67%", "+100% (-100% to +100%)", "1", "0"],
        ]
        tasks = app.screen.query_one("#tasks", DataTable)
        assert [[str(cell) for cell in tasks.get_row_at(i)] for i in range(tasks.row_count)] == [
            ["orchard-examples__textkit-1", "bash", "empty_patch", "resolved", "▲ gained"],
            ["orchard-examples__textkit-2", "bash", "-", "unresolved", ""],
            ["orchard-examples__textkit-1", "tools", "-", "resolved", ""],
        ]
        await pilot.press("f")
        assert tasks.row_count == 1
        await pilot.press("escape", "up", "up", "space", "c")  # a training stage does not compare
        assert not isinstance(app.screen, CompareScreen)


async def test_a_running_evaluation_shows_what_is_under_way(running_eval):
    """Its progress, and the live sandboxes of its process with their commands (the store records
    an attempt only once it ends); read again while it runs, and gone once it has ended."""
    from orchard.store import ExecRecord, session
    from orchard.store.runs import finish_run

    app = app_for(running_eval)
    async with app.run_test(size=(100, 40)) as pilot:
        app.push_screen(RunScreen("eval-live"))
        await pilot.pause()
        screen = app.screen
        about = str(screen.query_one("#inflight-about").render())
        assert about.startswith("1/4 graded, ETA 6m. Attempts are recorded as they end; meanwhile, the live sandboxes")
        table = screen.query_one("#inflight", DataTable)
        assert [table.get_row_at(i) for i in range(table.row_count)] == [
            ["cafe00000001", "45s", "2", "sed -n '1,40p' textkit/wrap.py", "orchard/swe:orchard-examples__textkit-2"]
        ]  # neither the deleted one nor the service's
        with session(running_eval) as db:
            db.add(
                ExecRecord(
                    id="live-2", sandbox_id="cafe00000001", command="python -m pytest -q", status="running",
                    created_at=NOW - 1,
                )
            )  # fmt: skip
        screen.refresh_running()
        assert table.get_row_at(0)[2:4] == ["3", "python -m pytest -q"]
        finish_run("eval-live", "finished", {}, store=Store.open(running_eval))
        screen.refresh_running()
        assert not screen.query_one("#inflight").display and screen.status == "finished"


async def test_a_running_evaluation_shows_each_attempt_in_flight_with_its_steps(running_eval):
    """What the runner lists in the run's folder (`orchard.eval.live`): each attempt in flight, for
    how long, solving or grading, its steps and last action; the sandboxes give way to it."""
    from types import SimpleNamespace

    from orchard.agents.loop import StepLog
    from orchard.eval import live

    listed = live.Live(Store.open(running_eval).run_folder("eval-live"))
    step = StepLog(
        0, "", [{"name": "bash", "arguments": {"command": "pytest -q tests/test_wrap.py"}}], "", None, 0, 0, 0.0
    )
    app = app_for(running_eval)
    with listed.attempt("eval-live/orchard-examples__textkit-2/bash/0", "orchard-examples__textkit-2", "bash", 0):
        live.on_step(0, None, SimpleNamespace(steps=[step, step]))
        async with app.run_test(size=(120, 40)) as pilot:
            app.push_screen(RunScreen("eval-live"))
            await pilot.pause()
            screen = app.screen
            assert str(screen.query_one("#inflight-about").render()) == "1/4 graded, ETA 6m. In flight:"
            table = screen.query_one("#inflight", DataTable)
            row = table.get_row_at(0)
            assert (row[:3], row[4:]) == (
                ["orchard-examples__textkit-2", "bash", "0"],
                ["solving", "2", "bash: pytest -q tests/test_wrap.py"],
            )
    assert live.read(Store.open(running_eval).runs / "eval-live") == []  # the attempt ended


def test_a_step_found_shows_the_text_around_the_match():
    """A long observation is cut around what was found, so the match is in sight."""
    from orchard.tui.widgets import around

    before, after = "a" * 100, "b" * 100
    assert around(f"{before} Needle {after}", "needle", 40) == "…" + "a" * 12 + " Needle " + "b" * 18 + "…"
    assert around(f"{before} NEEDLE", "needle", 40) == "…" + "a" * 32 + " NEEDLE"
    assert around(f"needle {after}", "needle", 40) == "needle " + "b" * 32 + "…"
    assert around("short\n  needle", "needle", 40) == "short needle"


async def test_keys_typed_right_after_slash_are_the_search(filled_store):
    """Keys that arrive together with `/` (a fast typist, a paste) go into the search, not to the
    list `/` was pressed on."""
    from textual import events
    from textual.widgets import Input

    app = app_for(filled_store)
    async with app.run_test(size=(80, 24)) as pilot:
        for character in "/swe-/":
            app.post_message(events.Key("slash" if character == "/" else character, character))
        await pilot.pause()
        runs = app.screen.query_one("#runs", DataTable)
        assert app.screen.query_one("#search Input", Input).value == "swe-/"  # the second `/` is text
        await pilot.press("backspace")
        assert [runs.get_row_at(i)[1] for i in range(runs.row_count)] == ["swe-rl", "swe-sft"]
