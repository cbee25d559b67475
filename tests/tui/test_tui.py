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


@pytest.mark.docker
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


@pytest.mark.docker
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
