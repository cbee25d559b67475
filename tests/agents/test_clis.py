"""The agent CLIs labs use (codex, claude, opencode, pi, hermes, mini), unmodified, from the tools
bundle: each resolves an example task through the proxy, with a scripted model playing the CLI's
own tools, a wrong script resolves nothing, and each runs in the static busybox image."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select
from typer.testing import CliRunner

from orchard.agents import harness_factory
from orchard.agents.loop import Limits
from orchard.agents.models import ScriptedSession
from orchard.cli import app
from orchard.env.tools import build_tools
from orchard.store import TrajectoryRecord, session
from orchard.tasks.base import Step

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks" / "tasks.jsonl"
CLIS = ["codex", "claude", "opencode", "pi", "hermes", "mini"]
SHELL_TOOL = {
    "codex": "exec_command",
    "claude": "Bash",
    "opencode": "bash",
    "pi": "bash",
    "hermes": "terminal",
    "mini": "bash",
}
"""The shell tool each CLI offers its model: the scripted model called it, so the CLI ran it."""


@pytest.fixture(scope="module")
def tools(docker_client):
    """The bundle, from the cache (built when missing: a minute or two, from the registries)."""
    return build_tools(log=lambda line: print(line, file=sys.stderr))


def test_each_cli_resolves_an_example_task_and_a_wrong_script_does_not(orchard_home, base_image, example_repos, tools):
    """Slow: 12 episodes, each CLI's with a gold and a wrong (fix, then revert) script, graded."""
    task = ["--tasks", str(TASKS), "--repos", str(example_repos), "--ids", "orchard-examples__inventory-1"]
    models = ["--model", "scripted:gold,scripted:regress", "--harness", ",".join(CLIS)]
    result = CliRunner().invoke(app, ["eval", *task, *models])
    assert result.exit_code == 0, result.output
    with session() as db:
        trajectories = db.exec(select(TrajectoryRecord)).all()
    verdicts = {(t.harness, t.model): (t.resolved, t.status) for t in trajectories}
    for cli in CLIS:
        assert verdicts[(cli, "scripted:gold")] == (True, "completed"), cli
        assert verdicts[(cli, "scripted:regress")][0] is False, cli
    for trajectory in trajectories:
        messages = json.loads(trajectory.messages)
        called = {c["function"]["name"] for m in messages for c in m.get("tool_calls") or []}
        assert SHELL_TOOL[trajectory.harness] in called, (trajectory.harness, called)
        offered = {t["function"]["name"] for t in json.loads(trajectory.tools)}
        assert SHELL_TOOL[trajectory.harness] in offered
        assert messages[-1]["role"] == "assistant" and trajectory.steps >= 5
        results = [m for m in messages if m["role"] == "tool"]
        assert any("inventory" in str(m["content"]) for m in results), trajectory.harness  # what the CLI ran showed


class _FileTask:
    """A task for an image with nothing but busybox: fix a word in a file, leave a note."""

    instance_id = "busybox-1"
    workdir = "/work"

    def public(self) -> dict[str, Any]:
        return {"instance_id": self.instance_id, "problem_statement": self.prompt()}

    def prompt(self) -> str:
        return "In /work/setting.txt, spell colour the American way; then write yes to /work/done.txt."

    def start(self, box: Any) -> None:
        box.exec("mkdir -p /work && printf 'colour = 1\\n' > /work/setting.txt")

    def conclude(self, box: Any, messages: Any, dialogue: Any) -> str:
        done = box.exec("cat /work/done.txt 2>/dev/null").stdout
        return box.read_file("/work/setting.txt").decode() + done


@pytest.mark.parametrize("cli", CLIS)
def test_each_cli_works_in_the_static_busybox_image(cli, client, busybox_image, tools):
    harness = harness_factory(cli)()
    script = [
        Step("bash", command="sed -i s/colour/color/ setting.txt", thought="Fixing the spelling."),
        Step("write", path="/work/done.txt", content="yes\n", thought="Leaving the note."),
        Step("submit", thought="Done."),
    ]
    with client.create(busybox_image, tools=True) as box:
        episode = harness.drive(
            _FileTask(), ScriptedSession(script, harness), box, model_name="scripted", limits=Limits(max_seconds=120)
        )
    assert (episode.status, episode.error) == ("completed", None)
    assert episode.submission == "color = 1\nyes\n"
    assert len(episode.steps) == 3


@pytest.mark.parametrize("cli", ["pi", "mini"])
def test_a_cli_past_the_step_limit_is_told_to_stop_and_the_episode_is_truncated(cli, client, busybox_image, tools):
    """Past `episode_steps` the endpoint answers a plain text telling the CLI to stop (pi ends its
    turn on it), then refuses; mini stops at its own step limit first. Either way: `truncated`."""
    harness = harness_factory(cli)()
    script = [Step("bash", command=f"echo {i} >> /work/setting.txt") for i in range(6)]
    with client.create(busybox_image, tools=True) as box:
        episode = harness.drive(
            _FileTask(), ScriptedSession(script, harness), box, model_name="scripted", limits=Limits(episode_steps=2)
        )
    assert (episode.status, len(episode.steps)) == ("truncated", 2), episode.error
