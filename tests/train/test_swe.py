"""`orchard train swe` end to end on the example tasks with scripted teachers and the tiny student."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from sqlmodel import select
from typer.testing import CliRunner

from orchard.cli import app
from orchard.store import RunRecord, StepRecord, session

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_the_whole_recipe_then_a_rerun_that_skips_every_stage(orchard_home, base_image, example_repos, tmp_path):
    """Slow: every stage of the recipe, then all of it again to show each is skipped."""
    import torch
    from transformers import AutoModelForCausalLM

    repos = example_repos
    config = yaml.safe_load((ROOT / "examples/configs/swe-tiny.yaml").read_text())
    config.update(
        tasks=str(ROOT / "examples/tasks/tasks.jsonl"),
        repos=str(repos),
        ids=["orchard-examples__textkit-1", "orchard-examples__timecalc-2"],
        work_dir=str(tmp_path / "work"),
    )
    config["eval"] = {"enabled": True, "harnesses": ["bash", "cli"], "samples": 2, "episode_steps": 2}
    path = tmp_path / "swe.yaml"
    path.write_text(yaml.safe_dump(config))

    result = runner.invoke(app, ["train", "swe", "--config", str(path)])
    assert result.exit_code == 0, result.output
    with session() as db:
        runs = {r.kind: r for r in db.exec(select(RunRecord))}
        credited = [s for s in db.exec(select(StepRecord)) if s.credit is not None]
    assert {"collect", "credit", "sft", "rl", "value", "eval"} <= set(runs)
    assert all(r.status == "finished" for r in runs.values())
    credit = json.loads(runs["credit"].summary)
    assert credit["unresolved"] == 4 and credit["rise_segments"] == 4  # each regressing episode: its fix
    assert max(s.credit for s in credited) == 1.0 and min(s.credit for s in credited) == -1.0  # the fix, the revert
    sft = json.loads(runs["sft"].summary)
    assert sft["resolved_examples"] == 4 and sft["partial_examples"] == 4 and len(sft["losses"]) == 10
    assert sft["by_harness"] == {"bash": 4, "tools": 4}
    rl = json.loads(runs["rl"].summary)
    assert rl["steps"] == 1 and rl["rollouts_per_group"] == 4 and rl["bar"][0]["rollouts_saved"] == 0
    value = json.loads(runs["value"].summary)
    assert value["trajectories"] == 8 + 4 and value["resolved"] == 4  # collection and the RL rollouts
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "work" / "student-base").state_dict()
    tuned = AutoModelForCausalLM.from_pretrained(tmp_path / "work" / "sft").state_dict()
    assert any(not torch.equal(base[k], tuned[k]) for k in base)
    assert "policy: " in result.stdout and "value model: " in result.stdout
    from orchard.store.runs import metrics_of

    assert [step for step, _ in metrics_of("swe-tiny-sft")["loss"]] == list(range(1, 11))  # TRL's logs, per step
    rl_metrics = metrics_of("swe-tiny-rl")
    assert {"loss", "reward", "bar/reward_mean", "bar/informative_share", "bar/rollouts_saved"} <= set(rl_metrics)
    assert len(metrics_of("swe-tiny-value")["loss"]) == 20
    with session() as db:
        stage = db.get(RunRecord, "swe-tiny-eval")
    evaluated = json.loads(stage.summary)
    assert set(evaluated["matrix"]) == {"before", "sft", "after"} and evaluated["held_out"] == ["cli"]
    assert set(evaluated["matrix"]["after"]) == {"bash", "cli"} and set(evaluated["rerank"]) <= {"bash", "cli"}
    assert re.search(r"\[eval\] before: bash 0% \[0%, \d+%\], cli \(held out\) 0% \[0%, \d+%\]", result.stderr)

    again = runner.invoke(app, ["train", "swe", "--config", str(path)])
    assert again.exit_code == 0, again.output
    for done in ("credit", "sft", "rl", "value", "eval"):
        assert f"[{done}] done before" in again.stderr

    reranked = runner.invoke(
        app,
        [
            "eval", "--tasks", config["tasks"], "--ids", ",".join(config["ids"]), "--repos", str(repos),
            "--model", "scripted:gold", "--k", "2", "--rerank", str(tmp_path / "work" / "value"),
        ],
    )  # fmt: skip
    assert reranked.exit_code == 0, reranked.output
    assert (
        "rerank bash: one sample 100.0%, non-empty 100.0%, value-model pick 100.0%, oracle pass@2 100.0%"
        in reranked.stdout
    )


def test_a_recipe_run_from_another_folder_takes_its_paths_from_the_file(
    orchard_home, base_image, example_repos, tmp_path
):
    """The shipped swe-tiny, shortened, run from an unrelated folder with an empty $HOME: its tasks and
    repos are found next to the file, models go under $ORCHARD_HOME/train/NAME, and nothing of Orchard's
    lands in $HOME or the working folder (before: the tasks were looked for in the working folder, after the
    work folder had been made under ~/.orchard).

    Slow: a real recipe run in a separate process.
    """
    import os
    import subprocess
    import sys

    from orchard.config import settings
    from orchard.store.runs import get_run

    recipe = tmp_path / "recipe"
    (recipe / "configs").mkdir(parents=True)
    (recipe / "tasks").symlink_to(ROOT / "examples/tasks")
    (recipe / "repos").symlink_to(example_repos)
    config = yaml.safe_load((ROOT / "examples/configs/swe-tiny.yaml").read_text())
    assert config["tasks"] == "../tasks/tasks.jsonl" and "work_dir" not in config  # as shipped
    config.update(name="elsewhere", repos="../repos", ids=["orchard-examples__textkit-1"])
    config["collect"]["harnesses"] = ["bash"]
    config["sft"]["max_steps"] = config["value"]["max_steps"] = 1
    config["rl"] = {"enabled": False}
    path = recipe / "configs" / "swe.yaml"
    path.write_text(yaml.safe_dump(config))
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    env = {**os.environ, "HOME": str(home), "ORCHARD_CACHE_DIR": str(settings().cache_dir)}  # the built agent
    done = subprocess.run(
        [sys.executable, "-m", "orchard", "train", "swe", "--config", str(path)],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"policy: {orchard_home / 'train' / 'elsewhere' / 'sft'}" in done.stdout
    assert (orchard_home / "train" / "elsewhere" / "value" / "config.json").is_file()
    assert all(get_run(f"elsewhere-{stage}").status == "finished" for stage in ("credit", "sft", "value"))
    assert not (home / ".orchard").exists() and not (home / ".cache" / "orchard").exists()  # matplotlib's: there
    assert list(elsewhere.iterdir()) == []


def two_processes(config: dict, tmp_path: Path):
    """`orchard train swe` under `torchrun --nproc_per_node 2` (gloo on CPU), on a free port."""
    import subprocess
    import sys

    path = tmp_path / "swe.yaml"
    path.write_text(yaml.safe_dump(config))
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return subprocess.run(
        [*torchrun, "-m", "orchard", "train", "swe", "--config", str(path)], capture_output=True, text=True, timeout=600
    )


def test_a_two_process_launch_collects_once_and_trains_data_parallel(orchard_home, base_image, example_repos, tmp_path):
    """`torchrun --nproc_per_node 2` on CPU (gloo), as a multi-GPU launch would run: sandbox work and
    run records happen once, every process trains, and each rolls out its own BAR groups.

    Slow: two real training processes (torch.distributed on gloo) run the recipe together.
    """
    from orchard.store import SandboxRecord, TrajectoryRecord
    from orchard.store.runs import metrics_of

    config = {
        "name": "swe-ddp",
        "tasks": str(ROOT / "examples/tasks/tasks.jsonl"),
        "repos": str(example_repos),
        "ids": ["orchard-examples__textkit-1", "orchard-examples__timecalc-2"],
        "work_dir": str(tmp_path / "work"),
        "collect": {"teachers": ["scripted:gold", "scripted:regress"], "harnesses": ["bash"]},
        "sft": {"max_steps": 3, "learning_rate": 1e-3, "max_length": 2048},
        "rl": {
            "max_steps": 1, "group_size": 2, "max_rollouts": 2, "stride": 2, "harnesses": ["bash"],
            "episode_steps": 2, "max_new_tokens": 8, "max_completion_length": 2048,
        },
        "value": {"max_steps": 2, "max_length": 1024},
    }  # fmt: skip
    done = two_processes(config, tmp_path)
    assert done.returncode == 0, "\n".join(line for line in done.stderr.splitlines() if "Error" in line)[-3000:]
    assert done.stdout.count("policy: ") == 1 and done.stderr.count("[sft] running") == 1  # one voice
    with session() as db:
        runs = {r.id: r for r in db.exec(select(RunRecord))}
        trajectories = list(db.exec(select(TrajectoryRecord)))
        sandboxes = list(db.exec(select(SandboxRecord)))
    assert sorted(r.kind for r in runs.values()) == ["collect", "collect", "credit", "rl", "sft", "value"]
    assert all(r.status == "finished" for r in runs.values())
    collected = [t for t in trajectories if t.run_id != "swe-ddp-rl"]
    assert len(collected) == 4  # two teachers x two tasks, collected by one process
    sft = json.loads(runs["swe-ddp-sft"].summary)
    assert sft["processes"] == 2 and sft["steps"] == 3
    assert [step for step, _ in metrics_of("swe-ddp-sft")["loss"]] == [1, 2, 3]  # recorded once, not per process
    bar = metrics_of("swe-ddp-rl")
    assert bar["bar/groups"] == [(0, 2.0)] and bar["bar/rollouts_per_group"] == [(0, 2.0)]  # both processes' groups
    rolled = [t for t in trajectories if t.run_id == "swe-ddp-rl"]
    assert len(rolled) == 4 and {t.instance_id for t in rolled} == set(config["ids"])  # a group per process
    assert json.loads(runs["swe-ddp-value"].summary)["trajectories"] == 8
    assert sandboxes and all(box.status == "deleted" for box in sandboxes)


def test_a_failure_on_the_main_process_stops_every_process(orchard_home, base_image, example_repos, tmp_path):
    """The others wait for the main process's collection; when it fails they stop too, instead of hanging.

    Slow: two training processes (each imports torch and TRL) are started and must both stop.
    """
    config = {
        "name": "swe-ddp-bad",
        "tasks": str(ROOT / "examples/tasks/tasks.jsonl"),
        "repos": str(example_repos),
        "ids": ["orchard-examples__textkit-1"],
        "work_dir": str(tmp_path / "work"),
        "collect": {"teachers": ["oracle:gold"]},
    }
    done = two_processes(config, tmp_path)
    assert done.returncode != 0
    assert done.stderr.count("error: unknown model 'oracle:gold'") == 1  # the main process says why
    assert "error: stopped: the main process failed (ConfigError: unknown model 'oracle:gold'" in done.stderr


@pytest.mark.parametrize(("raised", "status"), [(SystemExit(143), "interrupted"), (ValueError("bad"), "failed")])
def test_a_stage_stopped_by_a_signal_is_interrupted_and_a_crash_failed(orchard_home, raised, status):
    """SIGTERM (a launcher stopping the processes, `kill`) arrives as SystemExit; an error is a failure."""
    from orchard.store.runs import get_run
    from orchard.train.config import RecipeConfig
    from orchard.train.launch import Launch
    from orchard.train.pipeline import _stage

    config = RecipeConfig(name="p", tasks="t.jsonl", work_dir=str(orchard_home / "w"))

    def body(_run: str) -> dict:
        raise raised

    with pytest.raises(type(raised)):
        _stage(config, Launch(processes=1), None, print, "sft", body)
    run = get_run("p-sft")
    assert run is not None and run.status == status
    assert run.error == ("stopped by a signal" if status == "interrupted" else "bad")


def test_config_mistakes_are_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntasks: t.jsonl\nwork_dir: /tmp/x\nrl: {group_sise: 4}\n")
    result = runner.invoke(app, ["train", "swe", "--config", str(bad)])
    assert result.exit_code == 1 and result.stderr.startswith(
        f"error: {bad}: rl.group_sise: unknown key (did you mean group_size?)"
    )
    missing = runner.invoke(app, ["train", "swe", "--config", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 1 and "no config file" in missing.stderr


def test_every_mistake_of_a_recipe_is_on_one_line_the_unknown_key_first(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\ntasks: t.jsonl\nsft: {learning_rate: fast}\nrl: {max_steps: many, group_sise: 4}\n"
        "value: {max_steps: 0}\nevals: {}\n"
    )
    result = runner.invoke(app, ["train", "swe", "--config", str(bad)])
    assert result.exit_code == 1 and result.stdout == "" and result.stderr.count("\n") == 1
    line = result.stderr.removeprefix(f"error: {bad}: ").rstrip("\n").split("; ")
    assert set(line[:2]) == {
        "evals: unknown key (did you mean eval?)",
        "rl.group_sise: unknown key (did you mean group_size?)",
    }
    assert [mistake.split(": ")[0] for mistake in line[2:]] == ["sft.learning_rate", "rl.max_steps", "value.max_steps"]
    assert "valid number" in line[2] and "valid integer" in line[3] and "-1 to train for `epochs`" in line[4]


def test_an_impossible_bar_config_is_one_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntasks: t.jsonl\nwork_dir: /tmp/x\nrl: {group_size: 20}\n")
    result = runner.invoke(app, ["train", "swe", "--config", str(bad)])
    assert result.exit_code == 1 and "group_size <= max_rollouts" in result.stderr and result.stderr.count("\n") == 1


def test_the_cli_recipe_collects_under_two_agent_clis_and_trains_on_what_they_sent(
    orchard_home, base_image, example_repos, tmp_path
):
    """The shipped swe-clis (pi and mini-swe-agent, unmodified, from the tools bundle), shortened to
    one task: collected, credited by replaying the CLIs' own runs, and the student trained on their
    conversations.

    Slow: 4 CLI episodes, 2 replays, SFT and the value model."""
    from orchard.env.tools import build_tools
    from orchard.store import TrajectoryRecord

    build_tools()
    config = yaml.safe_load((ROOT / "examples/configs/swe-clis.yaml").read_text())
    assert config["collect"]["harnesses"] == ["pi", "mini"]  # as shipped
    config.update(
        tasks=str(ROOT / "examples/tasks/tasks.jsonl"),
        repos=str(example_repos),
        ids=["orchard-examples__textkit-1"],
        work_dir=str(tmp_path / "work"),
    )
    config["sft"]["max_steps"], config["value"]["max_steps"] = 2, 1
    config["rl"] = {"enabled": False}
    path = tmp_path / "swe.yaml"
    path.write_text(yaml.safe_dump(config))
    result = runner.invoke(app, ["train", "swe", "--config", str(path)])
    assert result.exit_code == 0, result.output
    with session() as db:
        runs = {r.kind: r for r in db.exec(select(RunRecord))}
        collected = db.exec(select(TrajectoryRecord)).all()
    assert {t.harness for t in collected} == {"pi", "mini"}
    assert all(runs[kind].status == "finished" for kind in ("collect", "credit", "sft", "value"))
    sft = json.loads(runs["sft"].summary)
    assert sft["examples"] >= 2, sft  # the gold runs of both CLIs, and the regress runs' rise segments
    assert (tmp_path / "work" / "sft" / "config.json").is_file()
