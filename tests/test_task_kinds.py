"""A new task kind is one file: the example checksum kind (`examples/kinds/checksum.py`) through
loading, eval with per-kind metrics, collection, credit by replay, and a trajectory with images."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlmodel import col, select
from typer.testing import CliRunner

from orchard.cli import app
from orchard.errors import ConfigError
from orchard.store import ResultRecord, RunRecord, TrajectoryRecord, session
from orchard.tasks import load_tasks

ROOT = Path(__file__).resolve().parents[1]
KIND_TASKS = ROOT / "examples" / "kinds" / "tasks.jsonl"
runner = CliRunner()


def test_a_task_file_picks_its_kind_and_the_kind_hides_its_solution(tmp_path):
    tasks = load_tasks(KIND_TASKS)
    assert {type(t).__name__ for t in tasks} == {"ChecksumTask"} and type(tasks[0]).metric == "score"
    public = tasks[0].public()
    assert "solution" not in public and set(public["files"]) == {"greeting.txt"}
    bad = tmp_path / "tasks.jsonl"
    first = {
        **json.loads(KIND_TASKS.read_text().splitlines()[0]),
        "kind": str(KIND_TASKS.parent / "checksum.py:ChecksumTask"),
    }
    bad.write_text(json.dumps(first) + "\n" + json.dumps({"instance_id": "x", "kind": "nosuch"}))
    with pytest.raises(ConfigError, match=r"tasks.jsonl, line 2: unknown task kind 'nosuch': use swe, "):
        load_tasks(bad)
    missing = tmp_path / "kinds.jsonl"
    missing.write_text(json.dumps({"instance_id": "x", "kind": "nope.py:Task", "problem_statement": "p"}))
    with pytest.raises(ConfigError, match=r"kinds.jsonl, line 1: task kind 'nope.py:Task': no file .*nope.py"):
        load_tasks(missing)


def test_the_kind_grades_the_submitted_bytes_never_a_claimed_checksum():
    (task,) = [t for t in load_tasks(KIND_TASKS) if t.instance_id == "checksum-pair"]
    assert task.grade(None, task.gold(), "unused").score == 1.0  # the grader needs no sandbox here
    forged = json.dumps(task.files)  # a predictions file claiming the wanted checksums
    assert task.grade(None, forged, "unused").score == 0.0
    assert task.grade(None, "not json", "unused").outcome == "unresolved"


def test_only_a_local_task_file_may_name_a_kind_by_path(tmp_path):
    folder = tmp_path / "dataset"
    folder.mkdir()
    row = {
        **json.loads(KIND_TASKS.read_text().splitlines()[0]),
        "kind": str(KIND_TASKS.parent / "checksum.py:ChecksumTask"),
    }
    (folder / "test.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(
        ConfigError, match=r"row 0: task kind '.*checksum.py:ChecksumTask': a dataset's rows may only name swe"
    ):
        load_tasks(folder)


def test_eval_grades_a_scored_kind_with_scores_and_credit_finds_its_rise(orchard_home, base_image, client, tmp_path):
    """Slow: eval and credit of a new kind with real sandboxes."""
    from orchard.train.credit import ReplayEstimator, assess

    half = tmp_path / "half.json"  # writes a.txt of checksum-pair, not b.txt: half its score
    half.write_text(json.dumps({"checksum-pair": [{"kind": "write", "path": "a.txt", "content": "1\n"}]}))
    models = f"scripted:gold,noop,scripted:{half}"
    ran = runner.invoke(
        app, ["eval", "--tasks", str(KIND_TASKS), "--model", models, "--harness", "bash,tools", "--k", "2"]
    )
    assert ran.exit_code == 0, ran.output
    assert "score" in ran.output and "pass@2" in ran.output
    with session() as db:
        runs = {json.loads(r.config)["model"]: json.loads(r.summary) for r in db.exec(select(RunRecord))}
    for harness in ("bash", "tools"):
        gold, noop = runs["scripted:gold"]["harnesses"][harness], runs["noop"]["harnesses"][harness]
        partial = runs[f"scripted:{half}"]["harnesses"][harness]
        assert gold["mean_score"] == 1.0 and gold["pass_at_k"]["2"] == gold["pass_hat_k"]["2"] == 1.0
        assert noop["mean_score"] == 0.0 and noop["resolved"] == 0
        assert partial["mean_score"] == 0.25 and partial["resolve_rate"] == 0.0 and partial["pass_at_k"]["2"] == 0.0
    assert runs["noop"]["metric"] == "score"

    # the same evaluation as a file: the same run, resumed, nothing redone
    with session() as db:
        before = len(db.exec(select(ResultRecord)).all())
    spec = tmp_path / "eval.yaml"
    spec.write_text(f"tasks: {KIND_TASKS}\nmodels: [noop]\nharnesses: [bash, tools]\nk: 2\n")
    again = runner.invoke(app, ["eval", "--config", str(spec)])
    assert again.exit_code == 0, again.output
    with session() as db:
        assert len(db.exec(select(ResultRecord)).all()) == before and len(db.exec(select(RunRecord)).all()) == 3

    # the kind's known solution as predictions; a kind whose grader breaks costs its attempts, not the run
    gold = runner.invoke(app, ["eval", "--tasks", str(KIND_TASKS), "--predictions", "gold"])
    assert gold.exit_code == 0 and "│ gold    │      2/2 │ 100.0% │ 1.000 │" in gold.output, gold.output
    broken = tmp_path / "broken.py"
    broken.write_text(
        f"import sys\nsys.path.insert(0, {str(KIND_TASKS.parent)!r})\nfrom checksum import ChecksumTask\n\n\n"
        "class Broken(ChecksumTask):\n    def grade(self, client, submission, image):\n        raise RuntimeError('oops')\n"
    )
    lines = [{**json.loads(line), "kind": "broken.py:Broken"} for line in KIND_TASKS.read_text().splitlines()]
    (tmp_path / "broken.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    failed = runner.invoke(app, ["eval", "--tasks", str(tmp_path / "broken.jsonl"), "--predictions", "gold"])
    assert failed.exit_code == 0 and "error 2" in failed.output, failed.output

    # a collection whose teacher writes the files and then undoes them: unresolved, one rise
    collected = runner.invoke(
        app, ["collect", "--tasks", str(KIND_TASKS), "--model", "scripted:regress", "--harness", "tools"]
    )
    assert collected.exit_code == 0, collected.output
    (task,) = [t for t in load_tasks(KIND_TASKS) if t.instance_id == "checksum-pair"]
    with session() as db:
        query = select(TrajectoryRecord).where(
            TrajectoryRecord.model == "scripted:regress", TrajectoryRecord.instance_id == task.instance_id
        )
        (trajectory,) = db.exec(query).all()
        (result,) = db.exec(select(ResultRecord).where(col(ResultRecord.trajectory_id) == trajectory.id)).all()
    assert trajectory.resolved is False and json.loads(result.grade)["score"] == 0.0
    assessed = assess(trajectory, task, ReplayEstimator(client, base_image))
    # ls, write a, write b, undo a, undo b, submit
    assert assessed.values == pytest.approx([0, 0, 0.5, 1.0, 0.5, 0, 0])
    assert assessed.segments == [(1, 3)]


PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
"""A 1x1 PNG: what a browser harness's screenshot is, in miniature."""


def test_observations_with_images_travel_through_the_loop_store_and_export(orchard_home, base_image, client, tmp_path):
    from orchard.agents.bash import BashHarness
    from orchard.agents.loop import run_episode, save_episode
    from orchard.agents.models import ScriptedModel
    from orchard.agents.trajectories import export_lines, import_file

    class Screenshots(BashHarness):
        """The bash harness, with a screenshot after every command (as content parts)."""

        name = "screenshots"

        def execute(self, action, box, workdir):
            text = super().execute(action, box, workdir)
            return [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            ]

        def observation_messages(self, action, observation):
            return [{"role": "user", "content": observation}]

    (task,) = [t for t in load_tasks(KIND_TASKS) if t.instance_id == "checksum-greeting"]
    harness = Screenshots()
    with client.create(base_image) as box:
        episode = run_episode(task, harness, ScriptedModel("gold").session(task, harness), box, model_name="gold")
    assert episode.status == "completed" and json.loads(episode.submission) == json.loads(task.gold())
    save_episode(episode, run_id=None, sample=0)
    (line,) = [json.loads(each) for each in export_lines()]
    shown = [m for m in line["messages"] if m["role"] == "user" and isinstance(m["content"], list)]
    assert len(shown) == 2 and shown[0]["content"][1]["image_url"]["url"].endswith(PNG)
    copy = {**line, "metadata": json.dumps({**json.loads(line["metadata"]), "trajectory_id": "copy"})}
    out = tmp_path / "t.jsonl"
    out.write_text(json.dumps(copy) + "\n")
    assert import_file(out) == (1, 0)
    with session() as db:
        again = db.get(TrajectoryRecord, "copy")
    assert again is not None and json.loads(again.messages) == line["messages"]


def test_the_training_recipe_runs_a_new_kind_unchanged(orchard_home, base_image, tmp_path):
    """Collect, credit by replay, SFT, BAR RL, the value model and eval on the checksum kind: the
    recipe that trains SWE agents, given another kind's task file and nothing else.

    Slow: every stage of the training recipe on a new kind.
    """
    import yaml

    config = yaml.safe_load((ROOT / "examples/configs/swe-tiny.yaml").read_text())
    config.update(name="checksum-tiny", tasks=str(KIND_TASKS), work_dir=str(tmp_path / "work"))
    for key in ("repos", "ids"):
        config.pop(key)
    config["eval"] = {"enabled": True, "harnesses": ["bash", "cli"], "samples": 1, "episode_steps": 2}
    path = tmp_path / "checksum.yaml"
    path.write_text(yaml.safe_dump(config))
    result = runner.invoke(app, ["train", "swe", "--config", str(path)])
    assert result.exit_code == 0, result.output
    with session() as db:
        runs = {r.kind: r for r in db.exec(select(RunRecord))}
    assert {"collect", "credit", "sft", "rl", "value", "eval"} <= set(runs)
    assert all(r.status == "finished" for r in runs.values())
    credit = json.loads(runs["credit"].summary)
    assert credit["unresolved"] == 4 and credit["rise_segments"] == 4  # each regressing episode: its writes
    sft = json.loads(runs["sft"].summary)
    assert sft["resolved_examples"] == 4 and sft["partial_examples"] == 4
    rl = json.loads(runs["rl"].summary)
    assert rl["steps"] == 1 and rl["rollouts_per_group"] == 4
    value = json.loads(runs["value"].summary)
    assert value["trajectories"] == 8 + 4 and value["resolved"] >= 4


def test_a_bad_prediction_is_named_by_its_line_as_in_a_task_file(tmp_path):
    from orchard.eval.predictions import load_predictions

    predictions = tmp_path / "preds.jsonl"
    predictions.write_text('{"instance_id": "checksum-pair", "model_patch": "{}"}\n\n{"model_patch": ""}\n')
    with pytest.raises(ConfigError, match=r"preds.jsonl, line 3: needs a string instance_id"):
        load_predictions(str(predictions), load_tasks(KIND_TASKS))
