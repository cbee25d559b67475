"""The `orchard` command through typer's CliRunner, against a real service and a real engine."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchard.cli import app

runner = CliRunner()


def test_help_is_fast_and_imports_nothing_heavy():
    code = "import sys, orchard.cli; print(sorted(m for m in ('docker', 'httpx', 'fastapi', 'torch', 'sqlmodel') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0 and "sandbox" in result.output


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.startswith("orchard ")


def test_sandbox_commands_against_the_service(service, busybox_image, monkeypatch):
    url, key = service
    monkeypatch.setenv("ORCHARD_URL", url)
    monkeypatch.setenv("ORCHARD_API_KEY", key)
    created = runner.invoke(app, ["sandbox", "create", busybox_image])
    assert created.exit_code == 0, created.output
    sandbox_id = created.stdout.strip()
    try:
        listed = runner.invoke(app, ["sandbox", "ls"])
        assert sandbox_id in listed.stdout and "blocked" in listed.stdout
        ran = runner.invoke(app, ["sandbox", "exec", sandbox_id, "--", "sh", "-c", "echo out; echo err >&2; exit 3"])
        assert (ran.exit_code, ran.stdout, ran.stderr) == (3, "out\n", "err\n")
        one_string = runner.invoke(app, ["sandbox", "exec", sandbox_id, "echo $((6*7))"])
        assert one_string.stdout == "42\n"
        runner.invoke(app, ["sandbox", "exec", "--session", "t", sandbox_id, "cd /tmp; X=7"])
        kept = runner.invoke(app, ["sandbox", "exec", "--session", "t", sandbox_id, "echo $X; pwd"])
        assert kept.stdout == "7\n/tmp\n"
        bad_cwd = runner.invoke(app, ["sandbox", "exec", sandbox_id, "--cwd", "/nope", "true"])
        assert bad_cwd.exit_code == 1 and bad_cwd.stderr == "error: cwd does not exist: /nope\n"
    finally:
        removed = runner.invoke(app, ["sandbox", "rm", sandbox_id])
    assert removed.exit_code == 0
    assert sandbox_id not in runner.invoke(app, ["sandbox", "ls"]).stdout


def test_user_mistakes_are_one_line_errors(service, monkeypatch):
    url, key = service
    monkeypatch.setenv("ORCHARD_URL", url)
    monkeypatch.setenv("ORCHARD_API_KEY", key)
    for argv, needle in [
        (["sandbox", "exec", "nosuchbox", "true"], "no sandbox 'nosuchbox'"),
        (["sandbox", "create", "orchard/nope:0"], "image 'orchard/nope:0' not found"),
        (["sandbox", "create", "--memory", "lots"], "memory 'lots' is not a Kubernetes quantity"),
        (["sandbox", "create", "--network", "wide"], "--network must be one of 'blocked', 'dropped', 'open'"),
        (["sandbox", "create", "--memory", "1e400"], "memory '1e400' is too large"),
        (["sandbox", "rm", ".."], "sandbox id '..' is invalid"),
        (["sandbox", "rm", "nosuchbox"], "no sandbox 'nosuchbox' (`orchard sandbox ls` lists them)"),
    ]:
        result = runner.invoke(app, argv)
        assert result.exit_code == 1, (argv, result.output)
        assert result.stderr.count("\n") == 1 and needle in result.stderr, result.stderr
    monkeypatch.setenv("ORCHARD_API_KEY", "wrong")
    wrong_key = runner.invoke(app, ["sandbox", "ls"])
    assert wrong_key.exit_code == 1 and "wrong API key" in wrong_key.stderr


def test_no_service_running_is_a_clear_error(orchard_home):
    result = runner.invoke(app, ["sandbox", "ls"])
    assert result.exit_code == 1
    assert result.stderr == "error: no Orchard service is running: start one with `orchard up` (or set ORCHARD_URL)\n"


def test_an_unreachable_service_is_a_clear_error(orchard_home, monkeypatch):
    monkeypatch.setenv("ORCHARD_URL", "http://127.0.0.1:9")  # the discard port: nothing listens
    for argv in (
        ["sandbox", "ls"],
        ["sandbox", "create"],
        ["sandbox", "rm", "abc"],
        ["sandbox", "exec", "abc", "true"],
    ):
        result = runner.invoke(app, argv)
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith("error: no answer from http://127.0.0.1:9") and result.stderr.count("\n") == 1


def started_pid(home: Path) -> int:
    import json

    return json.loads((home / "service.json").read_text())["pid"]


def test_up_status_down_leave_nothing_behind(orchard_home, docker_client, base_image):
    """`orchard up` in the background, a sandbox through it, `orchard down`: service and sandbox gone."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"ORCHARD_HOME": str(orchard_home)}
    started = runner.invoke(app, ["up", "--port", str(port), "--pool", f"{base_image}=1"], env=env)
    assert started.exit_code == 0, started.output
    assert f"http://127.0.0.1:{port}" in started.stdout
    assert (orchard_home / "service.json").stat().st_mode & 0o777 == 0o600
    try:
        again = runner.invoke(app, ["up", "--port", str(port)], env=env)
        assert "already running" in again.stdout
        moved = runner.invoke(app, ["up", "--port", str(port + 1)], env=env)  # not a service where asked: said
        assert moved.exit_code == 1 and moved.stderr == (
            f"error: a service is already running at http://127.0.0.1:{port} (pid {started_pid(orchard_home)}), "
            f"not at 127.0.0.1:{port + 1}: `orchard down` stops it, then `orchard up` starts one where you ask\n"
        )
        sandbox_id = runner.invoke(app, ["sandbox", "create", base_image], env=env).stdout.strip()
        assert docker_client.api.containers(filters={"name": f"orchard-{sandbox_id}"})
        import json

        import httpx

        key = json.loads((orchard_home / "service.json").read_text())["api_key"]
        for _ in range(300):  # the warm pool fills in the background
            pools = httpx.get(f"http://127.0.0.1:{port}/pools", headers={"X-API-Key": key}).json()["pools"]
            if pools and pools[0]["ready"] == 1:
                break
            time.sleep(0.05)
        assert pools == [{"image": base_image, "block_network": True, "network": "blocked", "size": 1, "ready": 1}]
        status = runner.invoke(app, ["status", "--port", str(port)], env=env)
        assert "2 sandbox(es)" in status.stdout and "running" in status.stdout  # one pooled
        elsewhere = runner.invoke(
            app, ["down", "--url", f"http://127.0.0.1:{port}"], env={"ORCHARD_HOME": str(orchard_home / "other")}
        )
        assert (
            elsewhere.exit_code != 0 and "is not this ORCHARD_HOME's" in elsewhere.output
        )  # another home's service stays
        assert "not running on port 1 " in runner.invoke(app, ["status", "--port", "1"], env=env).stdout
        listed = httpx.get(f"http://127.0.0.1:{port}/sandboxes", headers={"X-API-Key": key}).json()["sandboxes"]
        ids = [s["sandbox_id"] for s in listed]
        assert len(ids) == 2
    finally:
        stopped = runner.invoke(app, ["down", "--port", str(port)], env=env)
    assert stopped.exit_code == 0, stopped.output
    assert not docker_client.api.containers(all=True, filters={"name": f"orchard-{sandbox_id}"})
    for owned in ids:  # the pooled one too
        assert not docker_client.api.containers(all=True, filters={"name": f"orchard-{owned}"})
    assert not (orchard_home / "service.json").exists()
    time.sleep(0.1)
    assert "not running" in runner.invoke(app, ["status"], env=env).stdout


def test_a_malformed_pool_is_one_line(orchard_home):
    result = runner.invoke(app, ["up", "--pool", "orchard/base:bookworm"])
    assert result.exit_code == 1
    assert (
        result.stderr == "error: a pool is IMAGE=SIZE, such as orchard/base:bookworm=4; not 'orchard/base:bookworm'\n"
    )


def test_model_tiny_builds_offline_and_refuses_a_full_folder(tmp_path):
    built = runner.invoke(app, ["model", "tiny", str(tmp_path / "tiny")])
    assert built.exit_code == 0 and built.stdout == f"tiny model: {tmp_path / 'tiny'}\n"
    assert {"config.json", "tokenizer.json", "model.safetensors"} <= {p.name for p in (tmp_path / "tiny").iterdir()}
    again = runner.invoke(app, ["model", "tiny", str(tmp_path / "tiny")])
    assert (
        again.exit_code == 1
        and again.stderr == f"error: {tmp_path / 'tiny'} is not empty; choose a new folder for the model\n"
    )


def test_examples_copies_the_example_files_and_refuses_a_full_folder(tmp_path):
    copied = runner.invoke(app, ["examples", str(tmp_path / "ex")])
    assert copied.exit_code == 0, copied.output
    root = Path(__file__).resolve().parents[1] / "examples"
    for name in (
        "tasks/tasks.jsonl",
        "gui/sites/shop.py",
        "configs/swe-tiny.yaml",
        "tasks/projects/textkit/.gitignore",
    ):
        assert (tmp_path / "ex" / name).read_bytes() == (root / name).read_bytes(), name
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    again = runner.invoke(app, ["examples", str(tmp_path / "mine")])
    assert (
        again.exit_code == 1
        and again.stderr == f"error: {tmp_path / 'mine'} exists and is not empty: name a new folder\n"
    )
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound once to find it free, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_error_line(result, needle: str) -> None:
    output = result.output if hasattr(result, "output") else result.stdout + result.stderr
    stderr = result.stderr
    code = result.exit_code if hasattr(result, "exit_code") else result.returncode
    assert code == 1, output
    assert "Traceback" not in output, output
    assert stderr.startswith("error: ") and stderr.count("\n") == 1, stderr
    assert needle in stderr, stderr


def test_every_help_page_reads_as_a_command_line():
    """No `<bool>`, no Python type such as `<list[str]>`, no `{braces}` in usage; choices as a|b."""
    import re

    import typer.main

    def pages(command, path):
        yield path
        for name, sub in getattr(command, "commands", {}).items():
            yield from pages(sub, [*path, name])

    seen = 0
    for path in pages(typer.main.get_command(app), []):
        shown = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "120"})
        assert shown.exit_code == 0, (path, shown.output)
        assert not re.search(r"<[\w\[\]|, ]+>", shown.output), (path, shown.output)
        usage = next(line for line in shown.output.splitlines() if "Usage:" in line)
        assert "{" not in usage and "}" not in usage and "[[" not in usage, (path, usage)
        seen += 1
    assert seen > 25  # the root, every group and every command
    create = runner.invoke(app, ["sandbox", "create", "--help"], env={"COLUMNS": "120"}).output
    assert "blocked|dropped|open" in create and "[IMAGE]" in create
    assert (
        "eval|collect|credit|sft|rl|value|bench"
        in runner.invoke(app, ["runs", "ls", "--help"], env={"COLUMNS": "120"}).output
    )
    assert "IMAGE=SIZE" in runner.invoke(app, ["up", "--help"], env={"COLUMNS": "120"}).output


def test_a_refused_command_line_is_one_error_line(orchard_home):
    for argv, needle in [
        (["runs", "ls", "--bogus"], "no such option: --bogus (see `orchard runs ls --help`)"),
        (["up", "--api-key", "k"], "no such option: --api-key; did you mean --api-key-file?"),
        (["runs", "show"], "missing argument 'RUN_ID'"),
        (["nosuch"], "no such command 'nosuch'"),
        (["eval", "--tasks", "t.jsonl", "--k", "0"], "'--k'"),
    ]:
        _one_error_line(runner.invoke(app, argv), needle)


def test_runs_ls_kind_is_a_choice(orchard_home):
    result = runner.invoke(app, ["runs", "ls", "--kind", "bogus"])
    _one_error_line(
        result, "--kind must be one of 'eval', 'collect', 'credit', 'sft', 'rl', 'value', 'bench', 'proxy', not 'bogus'"
    )
    assert runner.invoke(app, ["runs", "ls", "--kind", "sft"]).stdout == "no runs\n"


def test_export_to_a_missing_folder_is_one_line(orchard_home, tmp_path):
    out = tmp_path / "nosuch" / "x.jsonl"
    _one_error_line(runner.invoke(app, ["trajectories", "export", str(out)]), f"there is no folder {out.parent}")
    assert not out.parent.exists()
    _one_error_line(runner.invoke(app, ["trajectories", "export", "--run", "nope"]), "no run 'nope'")
    empty = runner.invoke(app, ["trajectories", "export"])  # stdout: the JSONL; stderr: what was written
    assert (empty.exit_code, empty.stdout) == (0, "")
    assert (
        empty.stderr == "wrote 0 trajectories to stdout (none yet: `orchard eval` and `orchard collect` record them)\n"
    )


def test_model_tiny_on_a_file_is_one_line(tmp_path):
    target = tmp_path / "a-file"
    target.write_text("mine\n")
    _one_error_line(runner.invoke(app, ["model", "tiny", str(target)]), f"{target} is not a folder")
    assert target.read_text() == "mine\n"


def test_a_malformed_store_url_is_one_line(orchard_home, monkeypatch):
    monkeypatch.setenv("ORCHARD_DB_URL", "not a url")
    _one_error_line(runner.invoke(app, ["runs", "ls"]), "the store's URL is not a database URL")


def test_an_unreachable_postgresql_is_one_line(orchard_home, monkeypatch):
    port = _closed_port()
    monkeypatch.setenv("ORCHARD_DB_URL", f"postgresql://u:secret@127.0.0.1:{port}/db")
    result = runner.invoke(app, ["runs", "ls"])
    _one_error_line(result, f"cannot open the store at postgresql://u:***@127.0.0.1:{port}/db")
    assert "secret" not in result.output


def test_an_unwritable_orchard_home_is_one_line(tmp_path, monkeypatch):
    """A home under a file cannot be made, root or not (permission bits do not stop root)."""
    (tmp_path / "a-file").write_text("")
    home = tmp_path / "a-file" / "home"
    monkeypatch.setenv("ORCHARD_HOME", str(home))
    monkeypatch.delenv("ORCHARD_DB_URL", raising=False)
    _one_error_line(runner.invoke(app, ["runs", "ls"]), f"cannot create the folder {home}")
    assert "set ORCHARD_HOME to a folder you can write" in runner.invoke(app, ["runs", "ls"]).stderr


def test_up_refuses_a_port_out_of_range_before_starting(orchard_home):
    _one_error_line(runner.invoke(app, ["up", "--port", "99999"]), "'--port'")
    assert not (orchard_home / "service.json").exists() and not (orchard_home / "service.log").exists()


def test_up_refuses_an_unknown_backend_before_starting(orchard_home):
    result = runner.invoke(app, ["up", "--backend", "k8s"])
    _one_error_line(result, "unknown backend 'k8s': use docker, kubernetes or module:Class")
    assert not (orchard_home / "service.json").exists() and not (orchard_home / "service.log").exists()


def test_up_refuses_another_backends_options_before_starting(orchard_home):
    _one_error_line(
        runner.invoke(app, ["up", "--namespace", "x"]), "--namespace is not an option of the 'docker' backend"
    )
    _one_error_line(
        runner.invoke(app, ["up", "--backend", "kubernetes", "--runtime", "runsc"]), "--runtime is not an option"
    )
    fleet = ["up", "--backend", "kubernetes", "--fleet"]
    _one_error_line(runner.invoke(app, [*fleet, "lab"]), "--fleet needs the key its replicas share")
    keyed = {"ORCHARD_API_KEY": "shared"}
    _one_error_line(runner.invoke(app, ["up", "--fleet", "lab"], env=keyed), "--fleet needs --backend kubernetes")
    _one_error_line(runner.invoke(app, [*fleet, "Lab_1"], env=keyed), "--fleet 'Lab_1': name it in")
    assert not (orchard_home / "service.json").exists() and not (orchard_home / "service.log").exists()


def test_train_value_names_a_missing_run(orchard_home, tmp_path):
    argv = ["train", "value", "--runs", "nosuch", "--base", str(tmp_path), "--out", str(tmp_path / "v")]
    _one_error_line(runner.invoke(app, argv), "no run 'nosuch' (`orchard runs ls` lists them)")
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["--tasks", "org/dataset", "--model", "noop"],  # a hub dataset
        ["--tasks", "examples/tasks/tasks.jsonl", "--model", "hf:org/model"],  # a hub model
    ],
)
def test_a_hub_id_offline_is_one_line_without_retries(orchard_home, argv):
    """The hub is a closed loopback port: nothing leaves the machine, and the clients would retry."""
    import os
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{_closed_port()}"
    result = subprocess.run(
        [sys.executable, "-m", "orchard", "eval", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        timeout=600,
    )
    _one_error_line(result, f"cannot reach the Hugging Face hub at {env['HF_ENDPOINT']} for 'org/")
    assert "set HF_HUB_OFFLINE=1" in result.stderr


def test_status_says_how_to_start_docker_anywhere(orchard_home, tmp_path, monkeypatch):
    """`./dev` exists only in a checkout; the hint must work for an installed Orchard too."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-engine.sock'}")
    result = runner.invoke(app, ["status"])
    assert result.exit_code == 0, result.output  # a report, not a failure (tests/env/test_faults.py)
    assert "docker engine : not reachable: start it (`sudo systemctl start docker`" in result.stdout
    assert "./dev" not in result.output and "store" in result.stdout


def test_registries_take_a_name_or_a_full_import_path(tmp_path):
    from orchard.agents import harness_factory
    from orchard.agents.tools import ToolsHarness
    from orchard.env.backends import DockerConfig, backend_config
    from orchard.errors import ConfigError

    assert harness_factory("tools") is harness_factory("orchard.agents.tools:ToolsHarness") is ToolsHarness
    assert isinstance(backend_config("orchard.env.backends.docker:DockerConfig"), DockerConfig)
    with pytest.raises(
        ConfigError,
        match=r"unknown harness 'vim': use bash, tools, cli, codex, claude, opencode, pi, hermes, mini, functions, assistant, react, computer, bid, module:Class or path/file.py:Class",
    ):
        harness_factory("vim")
    with pytest.raises(ConfigError, match=r"unknown backend 'k8s': use docker, kubernetes or module:Class$"):
        backend_config("k8s")
    with pytest.raises(ConfigError, match=r"unknown backend 'x\.py:C'"):  # files are for harnesses
        backend_config("x.py:C")
    with pytest.raises(ConfigError, match="is not a backend config"):
        backend_config("os:path")
    mine = tmp_path / "mine.py"
    mine.write_text("from orchard.agents.bash import BashHarness\n\nclass Mine(BashHarness):\n    name = 'mine'\n")
    assert harness_factory(f"{mine}:Mine") is harness_factory(f"{mine}:Mine")  # the file runs once
