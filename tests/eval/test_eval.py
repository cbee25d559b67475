"""`orchard eval` end to end on the example tasks, and every way an attempt can go wrong."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sqlmodel import select
from typer.testing import CliRunner

from orchard.cli import app
from orchard.store import ResultRecord, RunRecord, Store, TrajectoryRecord, session
from orchard.tasks import load_tasks

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks" / "tasks.jsonl"


@pytest.fixture(scope="module")
def mirror(example_repos) -> Path:
    return example_repos


def eval_(*args: str):
    result = runner.invoke(app, ["eval", "--tasks", str(TASKS), *args])
    assert result.exit_code == 0, result.output
    return result


def test_gold_predictions_resolve_every_example_task_and_a_rerun_resumes(orchard_home, base_image, mirror, tmp_path):
    """Slow: every example task graded in its own sandbox."""
    report = tmp_path / "report.json"
    eval_("--predictions", "gold", "--repos", str(mirror), "--report", str(report))
    data = json.loads(report.read_text())
    total = len(load_tasks(TASKS))
    assert data["resolved_instances"] == data["total_instances"] == total and data["error_ids"] == []
    with session() as db:
        (run,) = db.exec(select(RunRecord)).all()
        assert run.status == "finished" and json.loads(run.summary)["harnesses"]["gold"]["resolve_rate"] == 1.0
        first = {r.id: r.created_at for r in db.exec(select(ResultRecord))}
    assert (orchard_home / "runs" / run.id / "report.json").is_file()
    eval_("--predictions", "gold", "--repos", str(mirror))  # the same evaluation: nothing is redone
    with session() as db:
        assert {r.id: r.created_at for r in db.exec(select(ResultRecord))} == first


def test_scripted_model_resolves_everything_under_every_harness_and_noop_nothing(
    orchard_home, base_image, mirror, tmp_path
):
    """Then `orchard runs compare` of the two runs.

    Slow: 90 episodes: every example task under three harnesses, by a perfect and a do-nothing agent, each graded in a fresh sandbox."""
    result = eval_(
        "--model", "scripted:gold", "--harness", "bash,tools,cli", "--repos", str(mirror), "--concurrency", "2"
    )
    total = len(load_tasks(TASKS))
    for harness in ("bash", "tools", "cli"):
        assert f"│ {harness:<7} │    {total}/{total} │ 100.0% │" in result.output
    eval_("--model", "noop", "--harness", "bash,tools,cli", "--repos", str(mirror))
    with session() as db:
        trajectories = db.exec(select(TrajectoryRecord)).all()
        assert len(trajectories) == 2 * 3 * total
        scripted = [t for t in trajectories if t.model == "scripted:gold"]
        assert all(t.resolved and t.status == "completed" and t.patch for t in scripted)
        noop = [t for t in trajectories if t.model == "noop"]
        assert all(t.outcome == "empty_patch" and not t.resolved for t in noop)
        messages = json.loads(scripted[0].messages)
        assert [m["role"] for m in messages[:2]] == ["system", "user"] and messages[2]["role"] == "assistant"
        runs = {run.name.split()[-1]: run.id for run in db.exec(select(RunRecord))}

    # the two runs side by side: rates with intervals, every task flipped, each task's outcome in each
    compared = runner.invoke(app, ["runs", "compare", runs["noop"], runs["scripted:gold"], "--out", str(tmp_path)])
    assert compared.exit_code == 0 and compared.stdout == f"report: {tmp_path / 'compare.md'}\n", compared.output
    text = (tmp_path / "compare.md").read_text()
    assert (tmp_path / "compare.png").stat().st_size > 0
    assert f"| {runs['noop']} | bash | 0/{total} | 0.0% (0.0%-" in text
    assert f"| {runs['scripted:gold']} | bash | {total}/{total} | 100.0% (" in text
    assert f"* {runs['scripted:gold']} bash against {runs['noop']} bash: +100.0% (" in text
    assert "less often: none" in text and text.count("| orchard-examples__textkit-1 | empty_patch |") == 1
    for argv, error in (
        ([runs["noop"]], "name two or more different runs to compare"),
        ([runs["noop"], "eval-nope"], "no run 'eval-nope'"),
    ):
        refused = runner.invoke(app, ["runs", "compare", *argv])
        assert refused.exit_code == 1 and refused.stderr.startswith(f"error: {error}"), refused.output


def test_user_mistakes_are_one_line(orchard_home, mirror):
    for args, message in [
        (["--harness", "bash"], "say what to evaluate"),
        (["--model", "gpt-9000"], "unknown model 'gpt-9000'"),
        (["--model", "noop", "--harness", "vim"], "unknown harness 'vim'"),
        (["--predictions", "nope.jsonl"], "no predictions file nope.jsonl"),
        (["--model", "noop", "--repos", "/nope"], "--repos /nope is not a folder"),
    ]:
        result = runner.invoke(app, ["eval", "--tasks", str(TASKS), *args])
        assert result.exit_code == 1 and result.stderr.startswith(f"error: {message}"), (args, result.output)
        assert result.stderr.count("\n") == 1
    many = ",".join(f"no-such-page-with-a-long-name-{n}" for n in range(20))  # no file name is that long
    for tasks, message in ((f"miniwob:{many}", "has no page 'no-such-page"), ("x" * 300, "no task file or dataset")):
        result = runner.invoke(app, ["eval", "--tasks", tasks, "--model", "noop"])
        assert result.exit_code == 1 and message in result.stderr and result.stderr.count("\n") == 1, result.output


def test_trajectories_round_trip_through_jsonl(orchard_home, base_image, mirror, tmp_path):
    eval_(
        "--model", "scripted:gold", "--harness", "tools", "--ids", "orchard-examples__textkit-1", "--repos", str(mirror)
    )
    out = tmp_path / "trajectories.jsonl"
    exported = runner.invoke(app, ["trajectories", "export", str(out)])
    assert exported.exit_code == 0 and exported.output == f"wrote 1 trajectories to {out}\n"
    piped = runner.invoke(app, ["trajectories", "export"])  # to stdout, the count on stderr
    assert piped.stdout == out.read_text() and piped.stderr == "wrote 1 trajectories to stdout\n"
    line = json.loads(out.read_text())
    assert set(line) == {"tools", "messages", "metadata"}
    metadata = json.loads(line["metadata"])
    assert metadata["verify_status"] == "resolved" and metadata["harness"] == "tools"
    assert [t["function"]["name"] for t in json.loads(line["tools"])] == [
        "execute_bash",
        "str_replace_editor",
        "finish",
    ]
    assert any(m.get("tool_calls") for m in line["messages"])

    from orchard.agents.trajectories import import_file

    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert import_file(out, store=Store.open(other)) == (1, 0)
    assert import_file(out, store=Store.open(other)) == (0, 1)  # already there: skipped, not doubled
    with session(other) as db:
        (copy,) = db.exec(select(TrajectoryRecord)).all()
        assert copy.resolved is True and copy.steps == 5 and json.loads(copy.messages) == line["messages"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": "hello"}\n')
    failed = runner.invoke(app, ["trajectories", "import", str(bad)])
    assert failed.exit_code == 1 and failed.stderr.startswith(f"error: {bad}:1: messages must be a list")


def test_a_custom_harness_and_the_model_x_harness_matrix(orchard_home, base_image, mirror):
    """Slow: every pair of two models and two harnesses on two example tasks, each episode in a sandbox, graded in another."""
    ids = "orchard-examples__inventory-1,orchard-examples__timecalc-2"
    custom = f"{ROOT / 'examples' / 'custom_harness.py'}:XmlHarness"
    result = eval_("--model", "scripted:gold,noop", "--harness", f"bash,{custom}", "--ids", ids, "--repos", str(mirror))
    assert "resolve rate, model x harness" in result.output
    rows = [line for line in result.output.splitlines() if line.startswith(("│ scripted:gold", "│ noop"))]
    assert any("100.0%" in r and r.count("100.0%") == 2 for r in rows), result.output
    assert any(r.startswith("│ noop") and r.count("0.0%") == 2 for r in rows), result.output


def test_an_interrupted_eval_continues_where_it_stopped(orchard_home, base_image, mirror, docker_client):
    """Slow: a real run of all the example tasks is killed part way and resumed to the end."""
    import os
    import signal
    import time

    args = ["--tasks", str(TASKS), "--model", "scripted:gold", "--harness", "bash", "--repos", str(mirror)]
    process = subprocess.Popen(
        [sys.executable, "-m", "orchard", "eval", *args, "--concurrency", "1"],
        env={**os.environ, "ORCHARD_HOME": str(orchard_home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    recorded: dict[str, float] = {}
    while time.monotonic() < deadline and len(recorded) < 3:
        time.sleep(0.2)
        try:
            with session() as db:
                recorded = {r.id: r.created_at for r in db.exec(select(ResultRecord))}
        except Exception:  # the store may not exist yet
            continue
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert 3 <= len(recorded) < len(load_tasks(TASKS))

    def orphans() -> list[str]:
        # one list call (no per-container inspect that races with other tests' deletions)
        managed = docker_client.api.containers(all=True, filters={"label": "org.orchard.managed=true"})
        return [c["Names"][0] for c in managed if f":{process.pid}:" in c["Labels"].get("org.orchard.owner", "")]

    killed_with = orphans()  # usually the sandbox it was working in
    eval_(*args[2:])
    with session() as db:
        (run,) = db.exec(select(RunRecord)).all()
        results = {r.id: r for r in db.exec(select(ResultRecord))}
    assert run.status == "finished" and len(results) == len(load_tasks(TASKS))
    assert all(results[i].created_at == at for i, at in recorded.items())  # kept, not redone
    assert all(r.resolved for r in results.values())
    assert orphans() == [], f"left behind by the killed run: {killed_with}"
