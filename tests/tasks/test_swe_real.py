"""Real SWE-bench Lite rows graded on their real repositories, as a new user grades them.

Slow and large: each repository's image is built with its dependencies (resolved on this host
into the shared wheelhouse, installed with no network), and the tests run as SWE-bench runs them.
It needs the repositories, which are not in this project: the development set's archives
(`repos/<owner>__<name>-<sha7>.tar.gz`, each a one-commit git repository at the row's
`base_commit`). Not part of `./dev test`; run it with

    ./dev swe-real DIR        # DIR holds tasks.jsonl and repos/ (the shared swe-real folder)

The rows are DIR's `tasks.jsonl` (the shared folder's 13: django 3.0-5.0, sphinx 3.4-5.0, flask,
sympy, pytest, requests, pylint), exactly as published, with no field added.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchard.tasks.loading import load_tasks

pytestmark = pytest.mark.swe_real

SOURCE = Path(os.environ.get("ORCHARD_SWE_REAL", "")).expanduser()
ROWS = SOURCE / "tasks.jsonl"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory) -> Path:
    """The archives unpacked into `DIR/owner/name` by the example script, as the README does."""
    source = SOURCE
    if not (source / "repos").is_dir() or not ROWS.is_file():
        pytest.fail("set ORCHARD_SWE_REAL to the folder holding tasks.jsonl and repos/*.tar.gz (./dev swe-real DIR)")
    root = tmp_path_factory.mktemp("mirror")
    script = Path(__file__).parents[2] / "examples" / "tasks" / "unpack_mirror.py"
    subprocess.run([sys.executable, str(script), str(source / "repos"), str(root)], check=True, capture_output=True)
    return root


def eval_cli(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ORCHARD_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "orchard", "eval", "--tasks", str(ROWS), *args],
        capture_output=True, text=True, env=env, timeout=3 * 3600, check=False,
    )  # fmt: skip


def report_of(path: Path) -> dict:
    return json.loads(path.read_text())


UNDONE = {"sphinx-doc__sphinx-10325": 1}
"""Rows whose broken patch undoes another hunk than the main one, because the rest of the fix
still passes without it: sphinx 5.0's second hunk alone makes `inherited_members` match by `in`,
which on the option's plain string is a substring test, and the row's test names one class."""


def without_main_hunk(patch: str, undone: int | None = None) -> str:
    """The patch with its main hunk (the one changing most lines; or hunk number `undone`) undone:
    its removed lines kept, its added lines gone, one comment line added so the patch still changes
    something. A fix that misses its point, applied and tested like any other."""
    lines = patch.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.startswith("@@ ")]
    ends = [*starts[1:], len(lines)]
    ends = [
        next((j for j in range(i + 1, end) if lines[j].startswith("diff --git ")), end)
        for i, end in zip(starts, ends, strict=True)
    ]
    changed = [sum(line[:1] in "+-" for line in lines[i + 1 : end]) for i, end in zip(starts, ends, strict=True)]
    main = max(range(len(starts)), key=changed.__getitem__) if undone is None else undone
    start, end = starts[main], ends[main]
    body = [
        " " + line[1:] if line.startswith("-") else line for line in lines[start + 1 : end] if not line.startswith("+")
    ]
    head = re.match(r"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,\d+)? @@(.*)", lines[start], re.DOTALL)
    old, count, new, rest = int(head[1]), int(head[2] or 1), int(head[3]), head[4]
    comment = "+# the fix is missing\n"
    hunk = [f"@@ -{old},{count} +{new},{count + 1} @@{rest}", *body[:1], comment, *body[1:]]
    return "".join([*lines[:start], *hunk, *lines[end:]])


def test_gold_resolves_every_instance_and_broken_patches_none(mirror: Path, tmp_path: Path, docker_client):
    """Every row's gold patch resolves (pytest's rows through the sealed runner, sphinx's through
    tox-current-env, Django 3.x's on Python 3.9 made to describe tests as the 3.6 they ask for),
    and the same patch without its main hunk resolves none.

    Slow: thirteen real repositories' test runs, twice (about 10 minutes with their images cached)."""
    tasks = load_tasks(ROWS)
    gold = eval_cli(
        "--predictions", "gold", "--repos", str(mirror), "--report", str(tmp_path / "gold.json"), home=tmp_path
    )
    assert gold.returncode == 0, gold.stdout + gold.stderr
    resolved = set(report_of(tmp_path / "gold.json")["resolved_ids"])
    assert resolved == {task.instance_id for task in tasks}, gold.stdout  # requests' connect timeouts too
    for task in tasks:  # the run says which rows ran on another Python than they ask for
        python = task.environment().python
        if python in ("3.6", "3.7", "3.8"):
            assert f"{task.instance_id} asks for Python {python} and ran on 3.9" in gold.stdout, gold.stdout

    broken = tmp_path / "broken.jsonl"
    broken.write_text(
        "".join(
            json.dumps(
                {
                    "instance_id": t.instance_id,
                    "model_name_or_path": "broken",
                    "model_patch": without_main_hunk(t.patch, UNDONE.get(t.instance_id)),
                }
            )
            + "\n"
            for t in tasks
        )
    )
    wrong = eval_cli(
        "--predictions", str(broken), "--repos", str(mirror), "--report", str(tmp_path / "broken.json"), home=tmp_path
    )
    assert wrong.returncode == 0, wrong.stdout + wrong.stderr
    report = report_of(tmp_path / "broken.json")
    assert report["resolved_ids"] == [] and not report.get("error_ids"), wrong.stdout
