"""The `orchard` command through typer's CliRunner, against a real service and a real engine."""

from __future__ import annotations

import subprocess
import sys
import time

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


@pytest.mark.docker
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


@pytest.mark.docker
def test_user_mistakes_are_one_line_errors(service, monkeypatch):
    url, key = service
    monkeypatch.setenv("ORCHARD_URL", url)
    monkeypatch.setenv("ORCHARD_API_KEY", key)
    for argv, needle in [
        (["sandbox", "exec", "nosuchbox", "true"], "no sandbox 'nosuchbox'"),
        (["sandbox", "create", "orchard/nope:0"], "image 'orchard/nope:0' not found"),
        (["sandbox", "create", "--memory", "lots"], "memory 'lots' is not a size"),
        (["sandbox", "create", "--network", "wide"], "network must be 'blocked' or 'open'"),
        (["sandbox", "create", "--memory", "1e400"], "memory '1e400' is not a size"),
        (["sandbox", "rm", ".."], "sandbox id '..' is invalid"),
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


@pytest.mark.docker
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
        assert pools == [{"image": base_image, "block_network": True, "size": 1, "ready": 1}]
        status = runner.invoke(app, ["status"], env=env)
        assert "2 sandbox(es)" in status.stdout and "running" in status.stdout  # one pooled
        listed = httpx.get(f"http://127.0.0.1:{port}/sandboxes", headers={"X-API-Key": key}).json()["sandboxes"]
        ids = [s["sandbox_id"] for s in listed]
        assert len(ids) == 2
    finally:
        stopped = runner.invoke(app, ["down"], env=env)
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
