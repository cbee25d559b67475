"""Warm pools of started browsers: a browser task's sandboxes run `start_command` as their init
(`BrowserTask.sandbox_init`), so a pool of the task's image holds sandboxes whose Chromium runs
already, and `Browser.launch` there only opens a fresh context; a run's pools (`TaskPools`) are
sized to the attempts that can use them and drained at its end.

Real Chromium in real `blocked` sandboxes. The times are measured and printed (`-s` shows them),
never asserted: what is asserted is that the pooled sandbox's Chromium was running before
`launch` and is the one `launch` used, and that a run leaves no sandbox behind.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest
from sqlmodel import select

from orchard import store
from orchard.eval.attempt import TaskPools
from orchard.recipes.gui.browser import Browser, start_command
from orchard.store import Store
from orchard.tasks.base import TaskBase, sandbox_args, task_sandbox

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "gui" / "tasks.json"
PAGE = "data:text/html,<title>Pool</title><h1 style='font: 40px sans-serif'>A page</h1>"
ROUNDS = 5


@pytest.fixture
def fresh(tmp_path, docker_client):
    """An embedded client of its own (its pools and store are this test's alone)."""
    from orchard.env import Client

    with Client(store=Store.open(f"sqlite:///{tmp_path}/o.db")) as client:
        yield client


def gui_tasks(*ids: str) -> list:
    from orchard.tasks import load_tasks

    return load_tasks(TASKS, ids=list(ids))


def chromium(box) -> str:
    """The pid of the sandbox's oldest Chromium process, or "" when none runs."""
    return box.exec("pgrep -o -x chromium").stdout.strip()


def first_screenshot(box) -> float:
    """Seconds from `Browser.launch` to the first screenshot of a page."""
    started = time.perf_counter()
    with Browser.launch(box) as browser:
        assert browser.goto(PAGE)
        assert browser.screenshot()[:8] == b"\x89PNG\r\n\x1a\n"
    return time.perf_counter() - started


def wait_for(condition, what: str, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {seconds:g} s"
        time.sleep(0.05)


def pools_ready(manager) -> list[int]:
    return [ready for _spec, _size, ready in manager.pools.sizes()]


def test_a_pooled_browser_sandbox_has_chromium_running_before_launch(fresh, browser_image):
    """Slow: it starts Chromium in pooled sandboxes and waits for each to listen."""
    (task,) = gui_tasks("gui-shop-rain-jacket")
    assert task.sandbox_init() == start_command(task.viewport)
    manager = fresh._manager
    limits = {key: value for key, value in sandbox_args(task).items() if key != "init"}

    started = time.perf_counter()
    with fresh.create(browser_image, **limits) as box:  # cold: no init, no pool
        created = time.perf_counter() - started
        assert chromium(box) == ""  # `launch` starts it
        cold = created + first_screenshot(box)
        assert chromium(box) != ""
        environ = box.exec(f"tr '\\0' '\\n' < /proc/{chromium(box)}/environ").stdout
        assert "PATH=" in environ and "PYTHONHOME=" not in environ  # the start script's interpreter keeps its own

    fresh.warm(browser_image, 1, **sandbox_args(task))
    warm = []
    for _ in range(ROUNDS):
        wait_for(lambda: pools_ready(manager) == [1], "the pool had a browser ready")
        pooled = {info.sandbox_id for info in manager.list()}
        started = time.perf_counter()
        with task_sandbox(fresh, task, browser_image) as box:
            taken = time.perf_counter() - started
            assert box.id in pooled  # handed over by the pool
            running = chromium(box)
            assert running != ""  # Chromium ran before `launch` was called
            warm.append(taken + first_screenshot(box))
            assert chromium(box) == running  # and `launch` used it, starting none
    fresh.warm(browser_image, 0, drain=True, **sandbox_args(task))
    print(
        f"\ncold sandbox + browser to first screenshot: {cold * 1000:.0f} ms; "
        f"from a warm pool: p50 {statistics.median(warm) * 1000:.0f} ms "
        f"(min {min(warm) * 1000:.0f}, max {max(warm) * 1000:.0f}, {len(warm)} rounds)"
    )


class Tiny(TaskBase):
    """A kind whose sandboxes have an init, on the base image (cheap to start)."""

    kind: str = "tiny"

    def sandbox_init(self) -> str | None:
        return "true"


def test_a_runs_pools_hold_only_what_later_attempts_take(fresh, base_image):
    """The first `size` attempts start at once, before a pool could help them: the pool is sized
    to the attempts after those, shrinks as they take theirs, and is drained at the end."""
    manager = fresh._manager
    tasks = [Tiny(instance_id=f"t{i}", problem_statement="x") for i in range(5)]

    def sizes() -> list[int]:
        return [size for spec, size, _ready in manager.pools.sizes() if spec.init == "true"]

    with TaskPools(fresh, 2).warm([(t, base_image) for t in tasks[:2]]) as pools:
        assert sizes() == [0]  # two attempts, two at once: nothing for a pool to do
        for task in tasks[:2]:
            pools.taking(task, base_image)
            assert sizes() == [0]
    with TaskPools(fresh, 2).warm([(t, base_image) for t in tasks]) as pools:
        seen = [sizes()[0]]
        for task in tasks:
            pools.taking(task, base_image)
            seen.append(sizes()[0])
        assert seen == [2, 2, 2, 2, 1, 0]
    assert sizes() == [0]
    wait_for(lambda: manager.pools.starting() == 0 and manager.list() == [], "the drained pool held nothing")
    untouched = TaskBase.model_construct(instance_id="swe", kind="swe", problem_statement="x")
    with TaskPools(fresh, 2).warm([(untouched, base_image)] * 5):  # a kind without an init: no pool
        assert sizes() == [0] and len(manager.pools.sizes()) == 1


def test_an_eval_of_two_gui_tasks_takes_a_pooled_browser_and_leaks_nothing(
    fresh, browser_image, docker_client, orchard_home
):
    """One attempt at a time: the second attempt's sandbox comes from the pool, warmed while the
    first ran, and nothing else was started; once the run is over, no sandbox is left.

    Slow: an eval of browser tasks with a warm pool of Chromium sandboxes.
    """
    from orchard.agents.models import model_from_spec
    from orchard.eval.agent import agent_solver
    from orchard.eval.runner import evaluate
    from orchard.tasks.base import Prepare

    manager = fresh._manager
    tasks = gui_tasks("gui-shop-rain-jacket", "gui-wiki-release-channel")
    solve = agent_solver(model_from_spec("scripted:solution"), store=manager.store)
    result = evaluate(
        tasks,
        ["bid"],
        1,
        solve,
        client=fresh,
        prepare=Prepare(),
        config={"test": "pools"},
        name="pools",
        concurrency=1,
        store=manager.store,
    )
    assert result.summary["harnesses"]["bid"]["resolve_rate"] == 1.0
    wait_for(lambda: manager.pools.starting() == 0 and manager.list() == [], "the run left no sandbox")
    ((spec, size, ready),) = manager.pools.sizes()
    assert (spec.image, spec.init, size, ready) == (browser_image, tasks[0].sandbox_init(), 0, 0)
    with store.session(manager.store) as db:
        made = db.exec(select(store.SandboxRecord)).all()
    assert len(made) == 2 and {r.status for r in made} == {"deleted"}  # the attempts' two, the second pooled
    found = docker_client.api.containers(all=True, filters={"label": f"org.orchard.owner={manager.owner}"})
    assert found == []
    details = [json.loads(r.grade) for r in result.results]
    assert [d["outcome"] for d in details] == ["resolved", "resolved"]
