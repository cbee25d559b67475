"""Run tracking: concurrent writers lose nothing, a killed run shows as interrupted, `orchard runs`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ProcessPoolExecutor

from sqlmodel import func, select
from typer.testing import CliRunner

from orchard.cli import app
from orchard.store import MetricRecord, ResultRecord, Store, session
from orchard.store.runs import add_result, finish_run, metrics_of, record_metrics, start_run

runner = CliRunner()


def _write_metrics(db_url: str, writer: int, count: int) -> int:
    for step in range(count):
        record_metrics("shared", step, {f"loss/{writer}": step * 0.5, "skipped": "text"}, store=Store.open(db_url))
    return count


def test_concurrent_writers_lose_nothing(orchard_home, tmp_path):
    import time

    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    start_run("shared", "rl", "shared", {}, store=Store.open(db_url))
    with ProcessPoolExecutor(max_workers=4) as pool:  # separate processes, each its own connections
        done = list(pool.map(_write_metrics, [db_url] * 4, range(4), [100] * 4))

    def results(writer: int) -> None:
        for index in range(50):
            add_result(
                ResultRecord(
                    id=f"shared/t{writer}-{index}/bash/0", run_id="shared", instance_id=f"t{writer}-{index}",
                    harness="bash", sample=0, outcome="resolved", resolved=True, created_at=time.time(),
                ),
                store=Store.open(db_url),
            )  # fmt: skip

    threads = [threading.Thread(target=results, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with session(Store.open(db_url)) as db:
        assert db.exec(select(func.count()).select_from(MetricRecord)).one() == sum(done) == 400
        assert db.exec(select(func.count()).select_from(ResultRecord)).one() == 200
    series = metrics_of("shared", store=Store.open(db_url))
    assert sorted(series) == [f"loss/{w}" for w in range(4)] and series["loss/2"][-1] == (99, 49.5)


def test_a_killed_run_is_interrupted_with_its_records_intact(orchard_home):
    code = (
        "import os, signal\n"
        "from orchard.store.runs import record_metrics, start_run\n"
        "start_run('doomed', 'sft', 'doomed', {'lr': 1e-4})\n"
        "record_metrics('doomed', 1, {'loss': 2.5})\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    killed = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ORCHARD_HOME": str(orchard_home)})
    assert killed.returncode == -signal.SIGKILL
    listed = runner.invoke(app, ["runs", "ls"])
    assert listed.exit_code == 0 and "doomed" in listed.stdout and "interrupted" in listed.stdout
    shown = runner.invoke(app, ["runs", "show", "doomed"])
    assert "status   interrupted" in shown.stdout and "metric   loss: 2.5 at step 1 (1 points)" in shown.stdout


def test_runs_ls_show_rm(orchard_home):
    start_run("eval-a", "eval", "an eval", {"k": 1})
    add_result(
        ResultRecord(
            id="eval-a/t/bash/0",
            run_id="eval-a",
            instance_id="t",
            harness="bash",
            sample=0,
            outcome="resolved",
            resolved=True,
            created_at=0.0,
        )
    )
    finish_run("eval-a", "finished", {"harnesses": {"bash": {"resolve_rate": 1.0}}})
    start_run("sft-b", "sft", "a stage", {})
    finish_run("sft-b", "failed", {}, error="no SFT examples")
    listed = runner.invoke(app, ["runs", "ls", "--kind", "eval"])
    assert "eval-a" in listed.stdout and "resolved bash 100%" in listed.stdout and "sft-b" not in listed.stdout
    assert "error    no SFT examples" in runner.invoke(app, ["runs", "show", "sft-b"]).stdout
    assert "results  1 graded, 1 resolved" in runner.invoke(app, ["runs", "show", "eval-a"]).stdout
    removed = runner.invoke(app, ["runs", "rm", "eval-a"])
    assert removed.exit_code == 0 and removed.stdout == "deleted eval-a\n"
    with session() as db:
        assert db.exec(select(func.count()).select_from(ResultRecord)).one() == 0
    missing = runner.invoke(app, ["runs", "show", "eval-a"])
    assert missing.exit_code == 1 and missing.stderr == "error: no run 'eval-a' (`orchard runs ls` lists them)\n"
    assert runner.invoke(app, ["runs", "rm", "nope"]).stderr == "error: no run 'nope'\n"
