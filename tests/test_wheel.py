"""Orchard as a user installs it: the wheel built from this checkout, installed in a fresh venv,
run from a folder outside any checkout. `orchard demo` (shortened to one task) runs the whole loop
from the example files the wheel ships, and the GUI example tasks grade, their sites found in the
wheel or beside a copied task file. No sandbox is left behind.

The fresh venv gets its third-party packages from the test environment's site-packages (a path in
a `.pth` file; that folder's own `.pth` files, this checkout's editable install among them, are not
run), so the install needs no network: pip installs only the wheel, and checks its declared
dependencies against those packages (`--no-index`: a dependency not there fails the install)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The `bin/` of a fresh venv holding the wheel of this checkout (and nothing else of ours)."""
    from orchard.deploy import build_wheel

    tmp = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(tmp / "dist")  # `pip wheel --no-deps` of a copy of this checkout
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(purelib, "test-environment.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run(
        [*pip, "--python", str(python), "install", "--no-index", str(wheel)], check=True, capture_output=True
    )
    return venv / "bin"


def run(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_installed_package_is_the_wheel_and_carries_the_examples(installed, tmp_path):
    """The venv imports Orchard from the wheel, not this checkout, and the tiny model's vocabulary
    reads the same example files as here (not fewer)."""
    from orchard.train.tiny import default_corpus

    probe = "import json, orchard; from orchard.train.tiny import default_corpus; print(json.dumps([orchard.__file__, len(default_corpus())]))"
    result = run(installed, "python", "-c", probe, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    where, texts = json.loads(result.stdout)
    assert Path(where).is_relative_to(installed.parent) and not Path(where).is_relative_to(ROOT)
    assert texts == len(default_corpus()) > 10


def test_the_wheel_runs_the_demo_and_the_gui_examples_outside_a_checkout(installed, orchard_home, base_image, tmp_path):
    """Slow: `orchard demo` from the installed wheel (every stage: real sandboxes, real TRL trainers),
    then GUI example tasks in real Chromium sandboxes, each a separate `orchard` process."""
    from orchard.process import owner_alive
    from orchard.recipes.gui.image import build_image

    build_image()
    before = sandboxes()
    work = tmp_path / "elsewhere"
    work.mkdir()
    result = run(installed, "orchard", "demo", "--tasks", "1", "--work-dir", str(tmp_path / "demo"), cwd=work)
    assert result.returncode == 0, result.stderr[-3000:]
    for row in ("collect", "credit", "sft", "rl (BAR)", "value", "eval before", "eval after", "rerank bash"):
        assert f"│ {row}" in result.stdout, row
    assert "scripted:gold: resolved bash 100%, tools 100%" in result.stdout

    result = run(installed, "orchard", "examples", "ex", cwd=work)
    assert result.returncode == 0 and (work / "ex" / "gui" / "sites" / "shop.py").is_file(), result.stderr
    tasks = {t["instance_id"]: t for t in json.loads((work / "ex" / "gui" / "tasks.json").read_text())}
    alone = work / "one-task" / "tasks.json"  # a task file copied on its own: its site is the wheel's
    alone.parent.mkdir()
    alone.write_text(json.dumps([tasks["gui-shop-cheapest-light"]]))
    for task_file, ids in ((alone, "gui-shop-cheapest-light"), (work / "ex/gui/tasks.json", "gui-wiki-on-call")):
        result = run(
            installed,
            "orchard",
            "eval",
            "--tasks",
            str(task_file),
            "--ids",
            ids,
            "--model",
            "scripted:solution",
            cwd=work,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert "│ computer │      1/1 │ 100.0%" in result.stdout and "│ bid      │      1/1 │ 100.0%" in result.stdout

    assert [c for c in sandboxes() - before if not owner_alive(c[1])] == []  # the runs' processes are gone


def sandboxes() -> set[tuple[str, str]]:
    """Every Orchard sandbox on the engine, as (container id, owner): other tests' included."""
    import docker

    client = docker.from_env()
    try:
        found = client.api.containers(all=True, filters={"label": "org.orchard.managed=true"})
    finally:
        client.close()
    return {(c["Id"], c["Labels"].get("org.orchard.owner", "")) for c in found}
