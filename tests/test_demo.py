"""`orchard demo`, shortened to one task, end to end; it leaves no sandbox behind."""

from __future__ import annotations

from typer.testing import CliRunner

from orchard.cli import app


def test_a_short_demo_runs_the_whole_loop(orchard_home, base_image, docker_client, tmp_path):
    """Slow: `orchard demo` as a user runs it: every stage of the pipeline on a real sandbox and real TRL trainers."""
    from orchard.process import process_owner

    def managed() -> set[str]:  # this process's sandboxes (the demo runs in it), not the other worker's
        mine = {"label": f"org.orchard.owner={process_owner()}"}
        return {c["Id"] for c in docker_client.api.containers(all=True, filters=mine)}

    before = managed()
    result = CliRunner().invoke(app, ["demo", "--tasks", "1", "--work-dir", str(tmp_path / "demo")])
    assert result.exit_code == 0, result.output
    for row in ("collect", "credit", "sft", "rl (BAR)", "value", "eval before", "eval after", "rerank bash"):
        assert f"│ {row}" in result.stdout, row
    assert "scripted:gold: resolved bash 100%, tools 100%" in result.stdout
    assert "open `orchard tui`" in result.stdout
    assert managed() - before == set()
