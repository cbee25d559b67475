"""The `miniwob` kind: MiniWoB++'s pages from the PyPI wheel, in the browser image, started and
graded by their own core. Task sets and grades on the host; then scripted agents work the pages
for real (a `blocked` sandbox of the image, Chromium inside) under both harnesses, directly and
through `orchard eval`; the page's one episode, its timer, a reload and a forged grade attacked."""

from __future__ import annotations

import io
import json
import time
import zipfile

import pytest
from sqlmodel import select
from typer.testing import CliRunner

from orchard.agents.models import ScriptedModel
from orchard.cli import app
from orchard.errors import ConfigError
from orchard.eval.attempt import attempt
from orchard.recipes.gui import miniwob
from orchard.recipes.gui.miniwob import HTML, IMAGE, SCRIPTS, MiniWobTask, build_image, read_spec
from orchard.recipes.gui.task import session_of
from orchard.store import ResultRecord, RunRecord, session
from orchard.tasks.base import task_sandbox
from orchard.tasks.loading import load_tasks

runner = CliRunner()
HARNESSES = ("computer", "bid")


@pytest.fixture(scope="session")
def image(docker_client, browser_image) -> str:
    """`orchard/gui-miniwob:1.1.0`, built once (the wheel fetched with pip the first time)."""
    return build_image()


def task(name: str, seed: int = 0, **fields) -> MiniWobTask:
    return MiniWobTask(instance_id=f"miniwob/{name}/{seed}", env=name, seed=seed, **fields)


# -- task sets ---------------------------------------------------------------------------------


def test_a_spec_names_pages_and_their_seeds():
    records = read_spec(" click-button , enter-text@3")
    assert [r["instance_id"] for _, r in records] == [
        "miniwob/click-button/0",
        "miniwob/enter-text/0",
        "miniwob/enter-text/1",
        "miniwob/enter-text/2",
    ]
    assert all(r["kind"] == "miniwob" for _, r in records)
    every = read_spec("all")
    assert len(every) == len(miniwob.pages()) == 130 and len({r["env"] for _, r in every}) == 130
    assert "click-button" in miniwob.pages() and not any(p.startswith("book-flight/") for p in miniwob.pages())
    assert len(read_spec("all,click-button@2")) == 131  # a page named after `all` gets its seeds


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("click-buton", "no page 'click-buton' (did you mean click-button"),
        ("enter-text,entertext@2", "no page 'entertext' (did you mean enter-text"),
        ("click-button@0", "ask for 1 to 1000 seeds"),
        ("click-button@x", "not a whole number"),
        ("click-button,,enter-text", "name a page"),
        ("click-button,click-button@2", "click-button is named twice"),
    ],
)
def test_a_wrong_spec_is_one_clear_error(spec, message):
    with pytest.raises(ConfigError) as raised:
        load_tasks(f"miniwob:{spec}")
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_the_scheme_loads_tasks_and_a_task_file_may_name_pages_too(tmp_path):
    loaded = load_tasks("miniwob:choose-list@2")
    assert [t.instance_id for t in loaded] == ["miniwob/choose-list/0", "miniwob/choose-list/1"]
    assert isinstance(loaded[1], MiniWobTask) and loaded[1].seed == 1 and loaded[1].episode_seconds == 600
    assert loaded[0].start_url() == f"file://{HTML}/miniwob/choose-list.html"
    assert "yellow box" in loaded[0].prompt() and type(loaded[0]).harnesses == HARNESSES
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"instance_id": "mine", "kind": "miniwob", "env": "login-user", "seed": 7}) + "\n")
    assert load_tasks(path)[0].env == "login-user"
    path.write_text(json.dumps({"instance_id": "mine", "kind": "miniwob", "env": "login-users"}) + "\n")
    with pytest.raises(ConfigError, match=r"line 1: env: .*no page 'login-users' \(did you mean login-user"):
        load_tasks(path)


def test_the_agent_may_open_the_page_itself_only():
    one = task("click-tab")
    assert one.allows(one.start_url()) and one.allows(one.start_url() + "#tabs-2")
    for url in (
        f"file://{HTML}/miniwob/click-button.html",  # another page of the same folder
        f"file://{HTML}/core/core.js",
        "file:///etc/passwd",
        "javascript:WOB_RAW_REWARD_GLOBAL=1",
        "http://127.0.0.1:9222/json",
        "about:blank",
    ):
        assert not one.allows(url), url


# -- grades, from untrusted submissions --------------------------------------------------------


def page(**fields) -> dict:
    record = {"env": "click-button", "seed": 0, "done": True, "reward": 0.98, "raw_reward": 1.0, "reason": None}
    return {**record, "episodes": 1, "utterance": 'Click on the "ok" button.', **fields}


def submitted(**fields) -> str:
    return json.dumps({"env": "click-button", "seed": 0, "answer": "", "page": page(), **fields})


def test_the_grade_follows_the_pages_reward_globals():
    one = task("click-button")
    resolved = one.grade(None, submitted())
    assert resolved.outcome == "resolved" and resolved.score == 1.0 and resolved.checks["raw_reward"] == 1.0
    partial = one.grade(None, submitted(page=page(raw_reward=0.6, reward=0.5)))
    assert partial.resolved and partial.score == 0.6  # MiniWoB's success is a reward above 0
    failed = one.grade(None, submitted(page=page(raw_reward=-1.0, reward=-1.0)))
    assert failed.outcome == "failed" and failed.score == 0.0
    timeout = one.grade(None, submitted(page=page(raw_reward=-1.0, reward=-1.0, reason="timed out")))
    assert timeout.outcome == "timeout" and timeout.score == 0.0
    running = one.grade(None, submitted(page=page(done=False, raw_reward=0, reward=0, episodes=0)))
    assert running.outcome == "not_done" and running.score == 0.0
    gone = one.grade(None, submitted(page=None))
    assert gone.outcome == "not_done" and "reloaded" in gone.checks["why"]
    died = one.grade(None, submitted(page=None, error="the browser had died"))
    assert died.outcome == "error" and died.error == "the browser had died"


@pytest.mark.parametrize(
    ("submission", "message"),
    [
        ("", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ("[" * 100_000, "at most 64 KiB"),
        ("[" * 5000 + "]" * 5000, "not JSON"),
        (submitted(env="enter-text"), "of page 'enter-text', seed 0, not this task's"),
        (submitted(seed=True), "not this task's"),
        (submitted(page="solved"), "page is not a JSON object"),
        (submitted(page=page(seed=3)), "started for another task"),
        (submitted(page=page(done="yes")), "`done` is not true or false"),
        (submitted(page=page(raw_reward="1")), "`raw_reward` is not a number"),
        (submitted(page=page(raw_reward=True)), "`raw_reward` is not a number"),
        (submitted(page=page(raw_reward=5)), "outside [-1, 1]"),
        (submitted(page=page(episodes=2)), "ran 2 episodes"),
        (submitted(page=page(episodes=0)), "disagree"),
        (submitted(page=page(reason=["timed out"])), "`reason` is not text"),
    ],
)
def test_a_malformed_submission_is_an_error_grade_naming_it(submission, message):
    grade = task("click-button").grade(None, submission)
    assert grade.outcome == "error" and not grade.resolved and grade.score == 0.0
    assert grade.error is not None and message in grade.error, grade.error


def test_a_well_formed_claim_is_taken_as_the_page_made_it():
    """What is not protected, said in the docstring: the page computes its reward in the
    sandbox, so a well-formed record that claims success grades as resolved."""
    forged = submitted(page=page(utterance="anything", reward=1.0))
    assert task("click-button").grade(None, forged).resolved


# -- the wheel ----------------------------------------------------------------------------------


def hostile_wheel(name: str, *, link: bool = False, size: int = 10) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("miniwob/html/miniwob/click-button.html", "<html></html>")
        info = zipfile.ZipInfo(name)
        if link:
            info.external_attr = 0o120777 << 16
        archive.writestr(info, "x" * size)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("member", "options", "message"),
    [
        ("miniwob/html/core/../../../../etc/cron.d/x", {}, "would leave its folder"),
        ("/etc/cron.d/x", {}, "would leave its folder"),
        ("miniwob/html/core/link.js", {"link": True}, "not a plain file"),
        ("miniwob/html/common/big.js", {"size": miniwob.MAX_TREE_BYTES + 1}, "more than 64 MiB"),
    ],
)
def test_a_wheel_member_that_would_leave_the_tree_is_refused(member, options, message):
    archive = zipfile.ZipFile(io.BytesIO(hostile_wheel(member, **options)))
    with pytest.raises(ConfigError, match=message):
        miniwob._members(archive)


def test_only_the_pages_trees_are_unpacked():
    archive = zipfile.ZipFile(io.BytesIO(hostile_wheel("miniwob/environment.py")))
    assert [str(path) for _, path in miniwob._members(archive)] == ["miniwob/click-button.html"]


def test_the_wheel_is_fetched_once_and_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("ORCHARD_CACHE_DIR", str(tmp_path))
    cached = tmp_path / "miniwob" / miniwob.WHEEL
    cached.parent.mkdir()
    cached.write_bytes(b"not the wheel")  # a damaged cache is fetched again
    assert miniwob.wheel() == cached and miniwob._sha256(cached) == miniwob.WHEEL_SHA256
    monkeypatch.setattr(miniwob, "WHEEL_SHA256", "0" * 64)
    cached.unlink()
    with pytest.raises(ConfigError, match=r"has sha256 297006e8\w+, not 0{64}: refused"):
        miniwob.wheel()
    assert not cached.exists()


# -- in sandboxes --------------------------------------------------------------------------------


def test_the_image_holds_the_pages_and_is_reused(client, image):
    assert image == IMAGE
    started = time.monotonic()
    assert build_image() == IMAGE and time.monotonic() - started < 10  # its labels match: not rebuilt
    with client.create(image, network="blocked") as box:
        listed = box.exec(f"ls {HTML}/miniwob | wc -l; ls {HTML}; test -s {HTML}/core/core.js && echo core")
        assert listed.stdout.split() == ["130", "common", "core", "miniwob", "core"], listed.stdout


@pytest.mark.parametrize("harness", HARNESSES)
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_solution_earns_the_reward_and_the_wrong_script_none(client, image, name, harness):
    one = task(name)
    episode, grade = attempt(one, harness, ScriptedModel("solution"), client, image)
    assert episode.status == "completed", episode.error
    assert grade.outcome == "resolved" and grade.score == 1.0, (grade.checks, grade.error)
    assert grade.checks["episodes"] == 1 and grade.checks["utterance"]
    _, wrong = attempt(one, harness, ScriptedModel("wrong"), client, image)
    assert not wrong.resolved and wrong.score == 0.0 and wrong.outcome in ("failed", "not_done"), wrong.checks


def test_checkboxes_of_several_seeds(client, image):
    """Two to six boxes, some to tick: the script works each drawing of the page."""
    for seed in (2, 3, 5):
        _, grade = attempt(task("click-checkboxes", seed), "computer", ScriptedModel("solution"), client, image)
        assert grade.resolved and grade.score == 1.0, (seed, grade.checks)


def test_the_seed_fixes_the_problem_and_the_limit_is_raised(client, image):
    utterances = []
    for seed in (0, 0, 1):
        one = task("enter-password", seed)
        with task_sandbox(client, one, image) as box:
            one.start(box)
            browser = session_of(box).browser
            utterances.append(browser.evaluate("core.getUtterance()"))
            assert browser.evaluate("core.EPISODE_MAX_TIME") == 600_000  # the page's own says 15 s
            one.conclude(box, [], [])
    assert utterances[0] == utterances[1] != utterances[2]
    assert utterances[0].startswith("Enter the password")


def test_the_page_runs_one_episode_and_its_timer_ends_it(client, image):
    """The START cover that comes back when the episode ends starts no other (an agent would roll
    the page again until it drew a problem it could solve); the page's own timer ends an episode
    that takes too long, graded `timeout`."""
    one = task("click-button", episode_seconds=600)
    with task_sandbox(client, one, image) as box:
        one.start(box)
        browser = session_of(box).browser
        wrong = browser.locate(SCRIPTS["click-button"]["wrong"][0]["arguments"]["target"])
        assert wrong is not None
        browser.click(*wrong.center)
        for _ in range(3):
            browser.click(80, 105)  # the START cover, over the task's area
            browser.settle()
        assert browser.evaluate("[WOB_EPISODE_ID, document.getElementById('sync-task-cover').style.display]") == [
            1,
            "block",
        ]
        grade = one.grade(client, one.conclude(box, [], []), image)
    assert grade.outcome in ("failed", "not_done") and grade.checks["episodes"] in (0, 1) and not grade.resolved
    short = task("focus-text", episode_seconds=1)
    with task_sandbox(client, short, image) as box:
        short.start(box)
        time.sleep(1.5)
        grade = short.grade(client, short.conclude(box, [], []), image)
    assert grade.outcome == "timeout" and grade.checks["reason"] == "timed out" and grade.checks["raw_reward"] == -1


def test_a_reloaded_page_is_not_the_tasks_episode(client, image):
    one = task("focus-text")
    with task_sandbox(client, one, image) as box:
        one.start(box)
        browser = session_of(box).browser
        assert browser.goto(one.start_url())  # allowed: the page itself, drawn afresh
        browser.settle()
        browser.click(80, 105)  # its own START cover: an episode unseeded and on the page's 10 s
        focus = browser.locate("#tt")
        assert focus is not None
        browser.click(*focus.center)
        assert browser.evaluate("WOB_RAW_REWARD_GLOBAL") == 1  # solved, but not the task's episode
        grade = one.grade(client, one.conclude(box, [], []), image)
    assert grade.outcome == "not_done" and "reloaded" in grade.checks["why"]


def test_the_episode_is_read_from_its_own_tab(client, image):
    one = task("focus-text")
    with task_sandbox(client, one, image) as box:
        one.start(box)
        browser = session_of(box).browser
        field = browser.locate("#tt")
        assert field is not None
        browser.click(*field.center)
        browser.new_tab(one.start_url())  # the same page again, in a tab the agent left active
        grade = one.grade(client, one.conclude(box, [], []), image)
    assert grade.resolved, grade.checks


def test_orchard_eval_runs_miniwob_pages(orchard_home, image):
    """Slow: MiniWoB++ episodes in real Chromium sandboxes through the CLI."""
    names = "click-button,enter-text,click-checkboxes"
    models = "scripted:solution,scripted:wrong"
    result = runner.invoke(app, ["eval", "--tasks", f"miniwob:{names}", "--model", models, "--harness", "computer"])
    assert result.exit_code == 0, result.output
    with session() as db:
        runs = {json.loads(run.config)["model"]: run for run in db.exec(select(RunRecord))}
        assert sorted(runs) == ["scripted:solution", "scripted:wrong"]
        scores = {
            model: {
                r.instance_id: json.loads(r.grade)["score"]
                for r in db.exec(select(ResultRecord).where(ResultRecord.run_id == run.id))
            }
            for model, run in runs.items()
        }
    ids = [f"miniwob/{name}/0" for name in names.split(",")]
    assert scores["scripted:solution"] == dict.fromkeys(ids, 1.0)
    assert scores["scripted:wrong"] == dict.fromkeys(ids, 0.0)
    assert json.loads(runs["scripted:solution"].summary)["harnesses"]["computer"]["resolve_rate"] == 1.0
