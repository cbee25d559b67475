"""What the sealed pytest runner costs a grade: the example tasks' gold patches, graded.

    .venv/bin/python bench/grading.py [--tasks 15] [--runs 5]

For each task, in one sandbox with the gold patch and the test patch applied, the test command
runs `--runs` times each way, alternating: as the grader runs it now (`RUNNER`: the channel, the
audit hook, the checks at every record, the key file written first, the channel read), and as it
ran before the seal (the same start, a JUnit report written by pytest and read back). Then one
whole `grade_patch` of the gold patch gives the grade's time. Prints per task the medians, and the
seal's cost as a share of the grade (target, issue 29: at most 10 %).
"""

from __future__ import annotations

import argparse
import secrets
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchard.env.client import Client  # noqa: E402
from orchard.env.images import build_base  # noqa: E402
from orchard.recipes.swe import grading, specs  # noqa: E402
from orchard.recipes.swe.environments import RepoMirror, task_image  # noqa: E402
from orchard.tasks import load_tasks  # noqa: E402

BEFORE = (
    "import os, sys; cwd = os.getcwd(); "
    "sys.path[:] = [p for p in sys.path if p not in ('', '.', cwd)] + [cwd]; "
    "import pytest, pdb, cmd, code, codeop, doctest, faulthandler; sys.exit(pytest.main())"
)
"""The runner before the seal (its JUnit report the grade's source), for the baseline."""


def before(box, task) -> float:
    """The test run as the grader ran it before: the report written by pytest, then read back."""
    env = task.environment()
    command = specs.PYTEST.sub(lambda m: f"{m['lead']}python3 -c {shlex.quote(BEFORE)}", env.test_cmd)
    directives = " ".join(shlex.quote(d) for d in task.directives)
    folder = f"/tmp/orchard-grade-{secrets.token_hex(8)}"
    prelude = "\n".join([specs.CONDA_ACTIVATE, *env.eval_commands])
    started = time.perf_counter()
    run = box.exec(
        f"mkdir -m 700 {folder} && {grading.FORGET_COMPILED} && {{\n{prelude}\n"
        f"{command} --junitxml={folder}/report.xml -o junit_prefix= {directives}\n}} 2>&1",
        cwd=task.workdir,
    )
    box.read_file(f"{folder}/report.xml")
    elapsed = time.perf_counter() - started
    assert run.exit_code == 0, run.stdout[-2000:]
    return elapsed


def sealed(box, task) -> float:
    """The test run as the grader runs it now: `grading._run_tests` itself."""
    grade = grading.Grade(task.instance_id, "unresolved")
    started = time.perf_counter()
    grading._run_tests(box, task, grading.DEFAULT_TEST_TIMEOUT, grade)
    elapsed = time.perf_counter() - started
    assert grade.outcome == "resolved", (grade.error, grade.suspicious)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=15, help="how many example tasks (default: all 15)")
    parser.add_argument("--runs", type=int, default=5, help="test runs each way per task")
    args = parser.parse_args()
    build_base()
    repos = Path(tempfile.mkdtemp(prefix="orchard-bench-repos-"))
    subprocess.run(
        [sys.executable, str(ROOT / "examples/tasks/make_repos.py"), str(repos)], check=True, capture_output=True
    )
    mirror = RepoMirror(repos)
    tasks = load_tasks(ROOT / "examples/tasks/tasks.jsonl")[: args.tasks]
    client = Client()
    print(f"{'task':34} {'before s':>9} {'sealed s':>9} {'grade s':>8} {'cost':>7}")
    shares = []
    for task in tasks:
        image = task_image(task, mirror)
        with client.create(image, network=grading.GRADING_NETWORK) as box:
            grade = grading.Grade(task.instance_id, "unresolved")
            box.write_file(grading.PATCH_FILE, task.patch)
            assert box.exec(grading.APPLY, cwd=task.workdir).exit_code == 0
            assert grading._setup_tests(box, task, grade), grade.log
            times: dict[str, list[float]] = {"before": [], "sealed": []}
            for _ in range(args.runs):
                times["before"].append(before(box, task))
                times["sealed"].append(sealed(box, task))
        whole = grading.grade_patch(client, task, task.patch, image)
        assert whole.resolved, whole.error
        old, new = statistics.median(times["before"]), statistics.median(times["sealed"])
        share = (new - old) / (whole.duration - (new - old))
        shares.append(share)
        print(f"{task.instance_id:34} {old:9.3f} {new:9.3f} {whole.duration:8.2f} {share:+7.1%}")
    print(f"median cost of the seal per grade: {statistics.median(shares):+.1%} (target: at most +10 %)")


if __name__ == "__main__":
    main()
