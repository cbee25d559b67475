"""The seam is real: a fourth recipe from one folder (`tests/toy_recipe/toy/`) and one line in the
recipes' table, with its own task kind, harness and image, is built, evaluated and trained by the
shared commands, which know nothing of it. It follows `docs/architecture.md`'s checklist."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOY = Path(__file__).resolve().parent / "toy_recipe"


def orchard(*args: str, cwd: Path = TOY) -> subprocess.CompletedProcess[str]:
    """`orchard ARGS` with the toy recipe's line in the table (`orchard_with_toy.py`)."""
    return subprocess.run(
        [sys.executable, str(TOY / "orchard_with_toy.py"), *args], cwd=cwd, capture_output=True, text=True, timeout=900
    )


def test_a_recipe_of_one_folder_builds_evaluates_and_trains(docker_client, busybox_image, orchard_home, tmp_path):
    """`orchard image build toy`, `orchard eval` and `orchard train toy` on the toy's tasks, each a
    process as a user runs it; `orchard train swe` refuses them.

    Slow: the whole pipeline (a tiny student built, SFT, RL, value model, eval before and after),
    about 20 s alone, is what proves that training takes a recipe it was never told of."""
    listed = orchard("image", "build", "--help")
    assert "toy" in listed.stdout
    built = orchard("image", "build", "toy")
    assert built.returncode == 0, built.stderr
    assert built.stdout.splitlines()[-1] == "orchard/toy:words"

    evaluated = orchard("eval", "--tasks", "tasks.json", "--model", "scripted:gold")
    assert evaluated.returncode == 0, evaluated.stderr
    assert "│ line    │      3/3 │ 100.0% │" in evaluated.stdout  # the kind's own harness, by default

    refused = orchard("train", "swe", "--config", "toy.yaml")
    assert refused.returncode == 1
    assert refused.stderr == (
        f"error: the tasks {TOY / 'tasks.json'} holds toy tasks, not swe ones: train them with "
        "`orchard train toy`, or name tasks of the swe recipe\n"
    )

    config = tmp_path / "toy.yaml"
    config.write_text((TOY / "toy.yaml").read_text().replace("tasks: tasks.json", f"tasks: {TOY / 'tasks.json'}"))
    trained = orchard("train", "toy", "--config", str(config), cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "policy: " in trained.stdout and "value model: " in trained.stdout
    for stage in ("collect", "credit", "sft", "rl", "value", "eval"):
        assert f"[{stage}]" in trained.stderr, stage
    assert "[collect] scripted:gold: 3 trajectories, resolved {'line': '100%'}" in trained.stderr
