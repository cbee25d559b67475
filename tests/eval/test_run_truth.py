"""Runs that tell the truth: each attempt's files in SWE-bench's layout with the whole log, a run id
that changes with what changes results, resume that retries what the machine failed and nothing
else, the model's own endings graded as the model's, and Ctrl-C that stops at once and keeps what
finished (against a real model server on loopback that never answers)."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from sqlmodel import select
from typer.testing import CliRunner

from orchard.agents.base import Reply
from orchard.agents.loop import Limits
from orchard.agents.models import ModelError, ModelServerError, ModelUnavailable
from orchard.cli import app
from orchard.eval.agent import agent_solver
from orchard.eval.config import EvalConfig
from orchard.eval.jobs import jobs
from orchard.eval.runner import LOG_TAIL, MAX_RETRIES, evaluate, run_config, run_id_for
from orchard.store import ResultRecord, RunRecord, StepRecord, Store, TrajectoryRecord, session
from orchard.store.runs import add_result
from orchard.tasks import Prepare, load_tasks

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks" / "tasks.jsonl"
TEXTKIT_1, TEXTKIT_2, TIMECALC_1 = (
    "orchard-examples__textkit-1",
    "orchard-examples__textkit-2",
    "orchard-examples__timecalc-1",
)
NOISE = "orchard-noise-" + "0123456789" * 1000 + "-end"
"""What a test prints: far more than the store keeps of a log."""
NOTES_PATCH = (
    "diff --git a/notes.txt b/notes.txt\nnew file mode 100644\n--- /dev/null\n+++ b/notes.txt\n@@ -0,0 +1 @@\n+notes\n"
)
"""A patch that applies and fixes nothing: unresolved."""


def rows() -> dict[str, dict]:
    return {row["instance_id"]: row for row in map(json.loads, TASKS.read_text().splitlines())}


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def noisy(row: dict) -> dict:
    """The task with one more PASS_TO_PASS test, which prints `NOISE` and passes."""
    test = f"def test_noisy():\n    print({NOISE!r})\n"
    lines = test.splitlines()
    addition = (
        "diff --git a/tests/test_noisy.py b/tests/test_noisy.py\nnew file mode 100644\n"
        f"--- /dev/null\n+++ b/tests/test_noisy.py\n@@ -0,0 +1,{len(lines)} @@\n"
        + "".join(f"+{line}\n" for line in lines)
    )
    return {
        **row,
        "test_patch": row["test_patch"] + addition,
        "PASS_TO_PASS": [*row["PASS_TO_PASS"], "tests/test_noisy.py::test_noisy"],
    }


def eval_(*args: str, code: int = 0):
    result = runner.invoke(app, ["eval", *args])
    assert result.exit_code == code, result.output
    return result


def recorded() -> tuple[list[RunRecord], dict[str, ResultRecord]]:
    with session() as db:
        return list(db.exec(select(RunRecord))), {r.instance_id: r for r in db.exec(select(ResultRecord))}


def test_each_attempt_leaves_its_files_with_the_whole_log_and_runs_show_lists_them(
    orchard_home, base_image, example_repos, tmp_path
):
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [noisy(rows()[TEXTKIT_1]), rows()[TEXTKIT_2], rows()[TIMECALC_1]])
    gold = rows()[TEXTKIT_1]["patch"]
    predictions = write_jsonl(
        tmp_path / "preds.jsonl",
        [
            {"instance_id": TEXTKIT_1, "model_patch": gold, "model_name_or_path": "mine"},
            {"instance_id": TEXTKIT_2, "model_patch": "", "model_name_or_path": "mine"},
            {"instance_id": TIMECALC_1, "model_patch": None, "model_name_or_path": "mine"},
        ],
    )
    eval_("--tasks", str(tasks), "--predictions", str(predictions), "--repos", str(example_repos))
    (run,), results = recorded()
    folder = orchard_home / "runs" / run.id
    assert results[TEXTKIT_1].outcome == "resolved" and results[TEXTKIT_2].outcome == "empty_patch"

    resolved = folder / "logs" / TEXTKIT_1
    log = (resolved / "test_output.txt").read_text()
    assert NOISE in log and len(log) > LOG_TAIL  # the whole log, where the store keeps a tail
    kept = json.loads(results[TEXTKIT_1].grade)["log"]
    assert len(kept) <= LOG_TAIL and NOISE not in kept
    assert (resolved / "patch.diff").read_text() == gold
    report = json.loads((resolved / "report.json").read_text())
    task = load_tasks(tasks, ids=[TEXTKIT_1])[0]
    assert report == {
        TEXTKIT_1: {
            "patch_is_None": False,
            "patch_exists": True,
            "patch_successfully_applied": True,
            "resolved": True,
            "tests_status": {
                "FAIL_TO_PASS": {"success": task.fail_to_pass, "failure": []},
                "PASS_TO_PASS": {"success": task.pass_to_pass, "failure": []},
                "FAIL_TO_FAIL": {"success": [], "failure": []},
                "PASS_TO_FAIL": {"success": [], "failure": []},
            },
        }
    }
    empty = folder / "logs" / TEXTKIT_2
    assert json.loads((empty / "report.json").read_text()) == {
        TEXTKIT_2: {
            "patch_is_None": False,
            "patch_exists": False,
            "patch_successfully_applied": False,
            "resolved": False,
        }
    }
    assert json.loads((folder / "logs" / TIMECALC_1 / "report.json").read_text())[TIMECALC_1] == {
        "patch_is_None": True,  # null in the predictions, as SWE-bench reports it
        "patch_exists": False,
        "patch_successfully_applied": False,
        "resolved": False,
    }
    assert (empty / "patch.diff").read_text() == "" and "outcome: empty_patch" in (
        empty / "run_instance.log"
    ).read_text()
    assert not [p for p in folder.rglob("*") if p.name.startswith(".")]  # no temporary file left

    shown = runner.invoke(app, ["runs", "show", run.id])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert f"folder   {folder}" in lines
    assert [line for line in lines if line.startswith("attempt")] == [
        f"attempt  {TEXTKIT_1}   mine/0  resolved     logs/{TEXTKIT_1}",
        f"attempt  {TEXTKIT_2}   mine/0  empty_patch  logs/{TEXTKIT_2}",
        f"attempt  {TIMECALC_1}  mine/0  empty_patch  logs/{TIMECALC_1}",
    ]


def test_the_run_id_covers_the_tasks_the_model_and_every_setting_that_changes_results(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [rows()[TEXTKIT_1], rows()[TEXTKIT_2]])
    moved = tmp_path / "elsewhere" / "tasks.jsonl"
    moved.parent.mkdir()
    moved.write_text(tasks.read_text())
    edited = write_jsonl(
        tmp_path / "edited.jsonl", [{**rows()[TEXTKIT_1], "problem_statement": "Something else."}, rows()[TEXTKIT_2]]
    )
    elsewhere = tmp_path / "repos"
    elsewhere.mkdir()

    def run_id(**settings) -> str:
        (job,) = jobs(EvalConfig(**{"tasks": str(tasks), "models": ["noop"], **settings}))[1]
        return run_id_for("eval", run_config(job.config, job.tasks))

    same = run_id()
    assert run_id() == same
    assert run_id(concurrency=7, repos=str(elsewhere), request_timeout=5.0, report=str(tmp_path / "r.json")) == same
    assert run_id(tasks=str(moved)) == same  # the same tasks from elsewhere
    assert run_id(max_tokens=100, temperature=0.5) == same  # noop takes neither
    assert run_id(ids=[TEXTKIT_1, TEXTKIT_2]) == run_id(ids=[TEXTKIT_2, TEXTKIT_1])
    changed = [
        run_id(tasks=str(edited)),
        run_id(models=["scripted:gold"]),
        run_id(harnesses=["tools"]),
        run_id(k=2),
        run_id(episode_steps=3),
        run_id(ids=[TEXTKIT_1]),
        run_id(models=None, predictions="gold"),
    ]
    with StubServer() as server:  # a model that takes the options: named by what it makes of them
        served = {"models": ["openai:x"], "base_url": server.url}
        defaults = run_id(**served)
        assert run_id(**served, max_tokens=2048, temperature=0.0) == defaults
        changed += [defaults, run_id(**served, max_tokens=100), run_id(**served, temperature=0.5)]
    assert len({same, *changed}) == len(changed) + 1

    gold = run_id(models=None, predictions="gold")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    options = {"episode_steps": 3, "k": 2, "temperature": 0.5, "max_tokens": 9, "harnesses": ["tools"]}
    assert run_id(models=None, predictions="gold", **options) == gold  # grading takes none of them
    assert run_id(models=None, predictions="gold", tasks=str(moved)) == gold
    assert run_id(models=None, predictions="gold", ids=[TEXTKIT_1]) != gold


def test_rerun_starts_the_run_afresh(orchard_home, base_image, example_repos):
    args = ("--tasks", str(TASKS), "--ids", TEXTKIT_1, "--predictions", "gold", "--repos", str(example_repos))
    eval_(*args)
    (run,), first = recorded()
    tasks = load_tasks(TASKS, ids=[TEXTKIT_1])
    (job,) = jobs(EvalConfig(tasks=str(TASKS), ids=[TEXTKIT_1], predictions="gold"))[1]
    assert run.id == run_id_for("eval", run_config(job.config, tasks))  # what `evaluate` names it
    eval_(*args)
    assert recorded()[1][TEXTKIT_1].created_at == first[TEXTKIT_1].created_at  # resumed: nothing redone
    stale = orchard_home / "runs" / run.id / "stale.txt"
    stale.write_text("from before")
    eval_(*args, "--rerun")
    (again,), second = recorded()
    assert again.id == run.id and again.status == "finished" and not stale.exists()
    assert (orchard_home / "runs" / run.id / "logs" / TEXTKIT_1 / "report.json").is_file()
    assert second[TEXTKIT_1].created_at > first[TEXTKIT_1].created_at and second[TEXTKIT_1].resolved


def test_resume_retries_what_the_machine_failed_and_keeps_every_verdict(
    orchard_home, base_image, example_repos, example_task, docker_client, tmp_path
):
    later = f"orchard-test/later:{secrets.token_hex(4)}"  # an image that is not there yet
    tasks = write_jsonl(tmp_path / "tasks.jsonl", [{**rows()[TEXTKIT_2], "image": later}, rows()[TIMECALC_1]])
    predictions = write_jsonl(
        tmp_path / "preds.jsonl",
        [
            {"instance_id": TEXTKIT_2, "model_patch": rows()[TEXTKIT_2]["patch"]},
            {"instance_id": TIMECALC_1, "model_patch": NOTES_PATCH},
        ],
    )
    args = ("--tasks", str(tasks), "--predictions", str(predictions), "--repos", str(example_repos))
    failed = eval_(*args, code=1)  # a machine error: no verdict on that attempt, said, and the run failed
    assert "machine error: 1 attempt: the task's image could not be built" in failed.stderr
    (run,), first = recorded()
    assert run.status == "failed"
    assert first[TEXTKIT_2].outcome == "error" and later in json.loads(first[TEXTKIT_2].grade)["error"]
    assert first[TIMECALC_1].outcome == "unresolved"
    _, image = example_task(TEXTKIT_2)
    docker_client.images.get(image).tag(later)
    try:
        eval_(*args)
    finally:
        docker_client.images.remove(later)
    (run,), second = recorded()
    assert run.status == "finished" and second[TEXTKIT_2].outcome == "resolved"
    assert second[TIMECALC_1].created_at == first[TIMECALC_1].created_at  # a verdict: not redone


def test_a_result_replaces_every_other_trajectory_of_its_attempt(tmp_path):
    """A worker abandoned at Ctrl-C can save its trajectory and never its result: when the resumed
    run records the attempt, that one goes (SFT would count it), and only that attempt's; a retry's
    result replaces the earlier result's trajectory as well."""
    store = Store.open(f"sqlite:///{tmp_path / 'store.db'}")

    def saved(trajectory: str, run: str = "r", sample: int = 0) -> None:
        with session(store) as db:
            db.add(
                TrajectoryRecord(
                    id=trajectory,
                    run_id=run,
                    instance_id=TEXTKIT_1,
                    harness="bash",
                    model="m",
                    sample=sample,
                    status="aborted",
                    messages="[]",
                    created_at=0.0,
                )
            )
            db.add(StepRecord(id=f"{trajectory}/0", trajectory_id=trajectory, index=0, reply="hi"))

    def recorded(outcome: str, trajectory: str) -> None:
        result = ResultRecord(
            id=f"r/{TEXTKIT_1}/bash/0",
            run_id="r",
            instance_id=TEXTKIT_1,
            harness="bash",
            sample=0,
            outcome=outcome,
            resolved=False,
            trajectory_id=trajectory,
            created_at=0.0,
        )
        add_result(result, store=store)

    def kept() -> tuple[list[str], list[str]]:
        with session(store) as db:
            return sorted(t.id for t in db.exec(select(TrajectoryRecord))), sorted(
                s.trajectory_id for s in db.exec(select(StepRecord))
            )

    for trajectory, run, sample in (("abandoned", "r", 0), ("sample-1", "r", 1), ("other-run", "q", 0)):
        saved(trajectory, run, sample)
    saved("resumed")
    recorded("error", "resumed")
    assert kept() == (["other-run", "resumed", "sample-1"],) * 2
    saved("retried")
    recorded("empty_patch", "retried")
    assert kept() == (["other-run", "retried", "sample-1"],) * 2


def test_resume_tries_a_machine_fault_twice_more_and_a_task_fault_never(client, example_task, example_repos, tmp_path):
    """A fault of the task (here, a solver that fails the same way every time) is no reason to try
    again; the machine's is, but not for ever: after `MAX_RETRIES` its error stands."""
    store = Store.open(f"sqlite:///{tmp_path / 'store.db'}")
    _, image = example_task(TEXTKIT_2)
    missing = {**rows()[TEXTKIT_1], "image": f"orchard-test/never:{secrets.token_hex(4)}"}  # built by nobody
    tasks = load_tasks(write_jsonl(tmp_path / "tasks.jsonl", [missing, {**rows()[TEXTKIT_2], "image": image}]))
    solved = []

    def solve(attempt, image, client, run_id):
        solved.append(attempt.task.instance_id)
        raise TypeError("a bug in the solver")

    def run() -> dict[str, ResultRecord]:
        result = evaluate(
            tasks, ["bash"], 1, solve, client=client, prepare=Prepare(example_repos), config={"test": "faults"},
            name="faults", concurrency=1, store=store,
        )  # fmt: skip
        return {r.instance_id: r for r in result.results}

    runs = [run() for _ in range(MAX_RETRIES + 2)]
    machine = [json.loads(r[TEXTKIT_1].grade) for r in runs]
    assert [(d["fault"], d.get("retries")) for d in machine] == [
        ("machine", None),
        ("machine", 1),
        ("machine", 2),
        ("machine", 2),
    ]
    assert runs[-1][TEXTKIT_1].created_at == runs[-2][TEXTKIT_1].created_at  # it stands
    bug = json.loads(runs[-1][TEXTKIT_2].grade)
    assert (bug["fault"], runs[-1][TEXTKIT_2].outcome) == ("task", "error") and "a bug in the solver" in bug["error"]
    assert solved == [TEXTKIT_2]  # tried once


def test_a_run_stopped_by_a_failure_waits_for_the_work_under_way_and_ctrl_c_gives_it_seconds(monkeypatch):
    """After a failure that stops the run, the attempts under way finish (and are recorded) before
    the client that holds their sandboxes closes; after Ctrl-C they get `INTERRUPT_GRACE`."""
    from orchard.eval import runner

    underway, finished, never = threading.Event(), [], threading.Event()

    def work(item: str) -> str:
        if item == "fails":
            underway.wait(10)
            raise ModelUnavailable("the model server is gone")
        underway.set()
        time.sleep(0.3)  # still under way when the other fails
        finished.append(item)
        return item

    with pytest.raises(ModelUnavailable):
        list(runner.in_threads(work, ["slow", "fails"], 2))
    assert finished == ["slow"]

    monkeypatch.setattr(runner, "INTERRUPT_GRACE", 0.2)
    hanging = runner.in_threads(lambda item: item == "quick" or never.wait(), ["quick", "hangs"], 2)
    with pytest.raises(KeyboardInterrupt), runner._finished(hanging) as results:
        assert next(results) is True  # the other waits on a request that never returns
        raise KeyboardInterrupt  # returns once the grace is over: not for ever
    never.set()


class Behaviours:
    """A model whose episodes each behave as the next of `behaviours` does (one attempt at a time)."""

    name = "behaviours"

    def __init__(self, *behaviours):
        self.behaviours = list(behaviours)

    def session(self, task, harness):
        return self.behaviours.pop(0)


class Babbles:
    """Never follows the format."""

    def complete(self, messages, tools):
        return Reply(content="I would rather talk about the weather.")


class Lists:
    """Looks around until the steps run out."""

    def complete(self, messages, tools):
        return Reply(content="```bash\nls\n```")


class Scribbles:
    """Writes a file that fixes nothing, then looks around until the steps run out."""

    def __init__(self):
        self.turns = 0

    def complete(self, messages, tools):
        self.turns += 1
        return Reply(content="```bash\necho notes > notes.txt\n```" if self.turns == 1 else "```bash\nls\n```")


class Fails:
    """A model server's failure: `error` is raised at the first request."""

    def __init__(self, error: Exception):
        self.error = error

    def complete(self, messages, tools):
        raise self.error


class KillsItsSandbox:
    """Kills the sandbox it works in (the one live sandbox this process owns), then asks for a command."""

    def __init__(self, docker_client):
        self.docker = docker_client

    def complete(self, messages, tools):
        mine = f":{os.getpid()}:"
        for container in self.docker.containers.list(filters={"label": "org.orchard.managed=true"}):
            if mine in container.labels.get("org.orchard.owner", ""):
                container.kill()
        return Reply(content="```bash\nls\n```")


class Submits:
    def complete(self, messages, tools):
        return Reply(content="```bash\nsubmit\n```")


def test_the_models_own_endings_are_its_outcome_and_only_the_machines_are_errors(
    client, example_task, example_repos, docker_client, tmp_path
):
    """Slow: one real episode in a sandbox for each way a model can end one."""
    task, _ = example_task(TEXTKIT_1)
    store = Store.open(f"sqlite:///{tmp_path / 'store.db'}")
    behaviours = [
        Babbles(),
        Lists(),
        Scribbles(),
        Fails(ModelError("the model server failed: BadRequestError: the context is longer than the model takes")),
        Fails(ModelServerError("the model server failed: APIConnectionError: connection refused")),
        KillsItsSandbox(docker_client),
    ]

    def run(model) -> dict[int, ResultRecord]:
        result = evaluate(
            [task],
            ["bash"],
            len(behaviours),
            agent_solver(model, Limits(episode_steps=3, max_format_errors=2), store=store),
            client=client,
            prepare=Prepare(example_repos),
            config={"test": "endings"},
            name="endings",
            concurrency=1,
            store=store,
        )
        assert result.summary["harnesses"]["bash"]["attempts"] == len(behaviours)
        return {r.sample: r for r in result.results}

    first = run(Behaviours(*behaviours))
    outcomes = [first[s].outcome for s in range(len(behaviours))]
    assert outcomes == ["empty_patch", "empty_patch", "unresolved", "empty_patch", "error", "error"]
    assert json.loads(first[0].grade)["episode"] == "aborted: 2 format errors in a row"
    assert json.loads(first[1].grade)["episode"] == "truncated"
    assert "context is longer" in json.loads(first[3].grade)["episode"]
    assert "connection refused" in json.loads(first[4].grade)["solver_error"]

    second = run(Behaviours(Submits(), Submits()))  # a resume: only the machine's failures again
    assert [second[s].created_at == first[s].created_at for s in range(len(behaviours))] == [True] * 4 + [False] * 2
    assert [second[s].outcome for s in (4, 5)] == ["empty_patch", "empty_patch"]
    with session(store) as db:
        trajectories = {t.id for t in db.exec(select(TrajectoryRecord))}
    assert trajectories == {r.trajectory_id for r in second.values()}  # the failed attempts' went with them


class StubServer:
    """A real OpenAI-compatible HTTP server on loopback: it lists model `x`, answers a chat request
    with `submit`, and never answers one about a task whose statement holds `hang_on` (a server
    that hangs); with `gone`, it answers every chat request 503 (a proxy whose model went away);
    with `dies_after` N, it stops listening once it has answered N chat requests (a server killed
    mid-run: connections are refused). Not emulated: tool calls, streaming, usage beyond a count."""

    def __init__(self, hang_on: str = "", gone: bool = False, dies_after: int = 0):
        self.hang_on, self.hanging, self.release = hang_on, threading.Event(), threading.Event()
        self.gone, self.dies_after, self.answered = gone, dies_after, 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._answer({"object": "list", "data": [{"id": "x", "object": "model", "owned_by": "test"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = " ".join(str(m.get("content") or "") for m in body["messages"])
                if stub.gone:
                    self._answer({"error": {"message": "no backend", "type": "unavailable"}}, status=503)
                    return
                if stub.hang_on and stub.hang_on in text:
                    stub.hanging.set()
                    stub.release.wait()
                    return
                message = {"role": "assistant", "content": "Done.\n\n```bash\nsubmit\n```"}
                choice = {"index": 0, "message": message, "finish_reason": "stop"}
                usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
                self._answer(
                    {
                        "id": "c1",
                        "object": "chat.completion",
                        "created": 0,
                        "model": "x",
                        "choices": [choice],
                        "usage": usage,
                    }
                )
                stub.answered += 1
                if stub.answered == stub.dies_after:
                    threading.Thread(target=stub.stop, daemon=True).start()

            def _answer(self, data, status=200):
                payload = json.dumps(data).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.stopping, self.stopped = threading.Lock(), False
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> StubServer:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.stop()

    def stop(self) -> None:
        with self.stopping:
            if not self.stopped:
                self.stopped = True
                self.server.shutdown()
                self.server.server_close()


@pytest.fixture
def hanging_server() -> Iterator[StubServer]:
    with StubServer(hang_on=rows()[TEXTKIT_2]["problem_statement"].splitlines()[0]) as server:
        yield server


def test_ctrl_c_stops_a_run_waiting_on_a_hung_model_server_and_keeps_what_finished(
    orchard_home, base_image, example_repos, docker_client, hanging_server, tmp_path
):
    """The same command started again meanwhile is refused in one line, writing nothing.

    Slow: a real `orchard eval` process (its imports are seconds) runs one episode, then hangs on the model server until Ctrl-C."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")} | {"ORCHARD_HOME": str(orchard_home)}
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchard",
                "eval",
                "--tasks",
                str(TASKS),
                "--ids",
                f"{TEXTKIT_1},{TEXTKIT_2}",
                "--model",
                "openai:x",
                "--base-url",
                hanging_server.url,
                "--repos",
                str(example_repos),
                "--concurrency",
                "1",
            ],
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
        try:
            deadline = time.monotonic() + 600
            while not hanging_server.hanging.wait(0.5):  # the second episode waits on the server
                assert process.poll() is None and time.monotonic() < deadline, err.read_text()
            flags = ["--ids", f"{TEXTKIT_1},{TEXTKIT_2}", "--model", "openai:x", "--base-url", hanging_server.url]
            again = runner.invoke(
                app, ["eval", "--tasks", str(TASKS), *flags, "--repos", str(example_repos), "--concurrency", "1"]
            )
            assert again.exit_code == 1, again.output
            refused = again.stderr.strip()
            assert refused.startswith("error: run eval-") and f"is already running (process {process.pid})" in refused
            os.kill(process.pid, signal.SIGINT)
            code = process.wait(timeout=60)  # a request hangs for minutes (120 s x 3 tries) before it fails
        finally:
            process.kill()
            process.wait()
    assert code == 130, err.read_text()
    assert err.read_text().splitlines()[-1].startswith("interrupted: run eval-"), err.read_text()
    (run,), results = recorded()
    assert run.status == "interrupted" and list(results) == [TEXTKIT_1] and results[TEXTKIT_1].outcome == "empty_patch"
    with session() as db:
        (trajectory,) = db.exec(select(TrajectoryRecord)).all()
    assert trajectory.instance_id == TEXTKIT_1 and trajectory.status == "completed"
    managed = docker_client.api.containers(all=True, filters={"label": "org.orchard.managed=true"})
    assert [c["Names"] for c in managed if f":{process.pid}:" in c["Labels"].get("org.orchard.owner", "")] == []


def test_a_model_server_killed_mid_run_is_a_machine_error_said_everywhere(orchard_home, base_image, example_repos):
    """Two attempts, the server killed after answering the first: too few failures in a row to
    stop the run, but the second attempt is no verdict on the model. It is said as it happens and
    at the end (one line: the cause, the count, what to check), left out of the rate, and the
    run is `failed` with exit code 1; the report and the TUI's view of the run say the same."""
    from orchard.store.runs import headline
    from orchard.store.views import run_view

    ids = [TEXTKIT_1, TEXTKIT_2]
    with StubServer(dies_after=1) as server:
        flags = ["--ids", ",".join(ids), "--model", "openai:x", "--base-url", server.url, "--concurrency", "1"]
        result = runner.invoke(app, ["eval", "--tasks", str(TASKS), *flags, "--repos", str(example_repos)])
    assert result.exit_code == 1, result.output
    live = [line for line in result.stderr.splitlines() if line.startswith("machine error: orchard-examples")]
    assert len(live) == 1 and "the model server failed: APIConnectionError" in live[0], result.stderr
    assert result.stderr.endswith(
        "machine error: 1 attempt: the model server failed (is it up at --base-url, serving the model? After "
        "timeouts, raise --request-timeout); not counted in the rates, and the same command tries them again\n"
    ), result.stderr
    assert re.search(r"│ bash +│ +0/1 │ +0\.0% │ +1 │", result.stdout), result.stdout  # machine errors beside
    (run,), results = recorded()
    assert run.status == "failed" and run.error == "1 of 2 attempts ended by machine errors: the model server failed"
    assert json.loads(run.config)["total_attempts"] == 2  # what a live view's progress counts to
    assert {r.outcome for r in results.values()} == {"empty_patch", "error"}
    summary = json.loads(run.summary)
    row = summary["harnesses"]["bash"]
    assert (row["attempts"], row["graded"], row["machine_errors"], row["resolve_rate"]) == (2, 1, 1, 0.0)
    assert headline(run) == "resolved bash 0% (1 machine error, not counted)"
    view = run_view(run.id)
    assert view is not None
    (shown,) = view.harnesses
    assert (shown.graded, shown.machine_errors) == (1, 1)
    report = (orchard_home / "runs" / run.id / "report.md").read_text()
    assert "| bash | 0/1 | 0.0% |" in report and "* 1 attempt: the model server failed" in report
    assert f"| {TEXTKIT_1} | empty_patch |\n| {TEXTKIT_2} | error |" in report  # the per-task table


def test_a_model_server_that_goes_away_stops_the_run_with_one_line(orchard_home, base_image, example_repos):
    ids = [f"orchard-examples__textkit-{n}" for n in (1, 2, 3, 4)]
    with StubServer(gone=True) as server:
        result = runner.invoke(
            app,
            [
                "eval",
                "--tasks",
                str(TASKS),
                "--ids",
                ",".join(ids),
                "--model",
                "openai:x",
                "--base-url",
                server.url,
                "--repos",
                str(example_repos),
                "--concurrency",
                "1",
            ],
        )
    assert result.exit_code == 1, result.output
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error")]  # below the progress bar
    assert line.startswith(f"error: the model server at {server.url} did not answer 3 requests in a row"), line
    (run,), results = recorded()
    assert run.status == "failed" and "did not answer 3 requests" in run.error
    assert sorted(results) == ids[:3] and {r.outcome for r in results.values()} == {"error"}  # no fourth attempt


class Peeks:
    """Runs `ls` then `ls -a`, reading every run's `live.json` before each answer: what a live view
    sees while the episode runs."""

    def __init__(self, runs: Path):
        self.runs, self.seen, self.turns = runs, [], 0

    def complete(self, messages, tools):
        from orchard.eval import live

        self.seen.append([entry for folder in self.runs.iterdir() for entry in live.read(folder)])
        self.turns += 1
        return Reply(content="```bash\nls\n```" if self.turns == 1 else "```bash\nls -a\n```")


def test_a_running_evaluation_lists_its_attempts_in_flight_with_their_steps_until_it_ends(
    client, example_task, example_repos, tmp_path
):
    """The store records an attempt once it ends; meanwhile the run's folder lists it (`live.json`):
    its task, harness and sample, solving, its steps so far and its last action. Once the run
    ends, the file is gone."""
    task, _ = example_task(TEXTKIT_1)
    store = Store.open(f"sqlite:///{tmp_path / 'store.db'}")
    peeks = Peeks(store.runs)
    result = evaluate(
        [task], ["bash"], 1, agent_solver(Behaviours(peeks), Limits(episode_steps=3), store=store), client=client,
        prepare=Prepare(example_repos), config={"test": "live"}, name="live", concurrency=1, store=store,
    )  # fmt: skip
    steps = [[(e["task"], e["harness"], e["sample"], e["phase"], e["steps"], e["last"]) for e in s] for s in peeks.seen]
    assert steps == [
        [(TEXTKIT_1, "bash", 0, "solving", 0, "")],
        [(TEXTKIT_1, "bash", 0, "solving", 1, "bash: ls")],
        [(TEXTKIT_1, "bash", 0, "solving", 2, "bash: ls -a")],
    ]
    assert not (result.folder / "live.json").exists()
