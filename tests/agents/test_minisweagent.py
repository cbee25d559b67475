"""mini-swe-agent's own agent loop, prompts and scripted test model, running in an Orchard sandbox
through `OrchardEnvironment`, graded by Orchard's grader: the environment layer is harness-agnostic."""

from __future__ import annotations

import os
from pathlib import Path

from orchard.recipes.swe.grading import grade_patch

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")


def test_mini_swe_agent_resolves_an_example_task_in_a_sandbox(client, example_task):
    import yaml
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.config import builtin_config_dir
    from minisweagent.models.test_models import DeterministicModel, make_output

    from orchard.agents.minisweagent import OrchardEnvironment

    task, image = example_task("orchard-examples__timecalc-1")
    config = yaml.safe_load((builtin_config_dir / "benchmarks" / "swebench.yaml").read_text())
    patch = task.patch if task.patch.endswith("\n") else task.patch + "\n"
    model = DeterministicModel(
        outputs=[
            make_output("Let me look around.", [{"command": "ls && git status --short"}]),
            make_output("Applying the fix.", [{"command": f"git apply <<'EOF'\n{patch}EOF"}]),
            make_output("Writing the patch.", [{"command": "git diff > patch.txt"}]),
            make_output("Submitting.", [{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat patch.txt"}]),
        ]
    )
    with client.create(image) as box:
        environment = OrchardEnvironment(sandbox=box, cwd=task.workdir, **{"env": config["environment"]["env"]})
        agent = DefaultAgent(
            model, environment, **{**config["agent"], "cost_limit": 0}
        )  # its test model bills 1 a call
        result = agent.run(task.problem_statement)
    assert result["exit_status"] == "Submitted"
    assert not Path(task.workdir).exists()  # so its commands ran in the sandbox, not on this host
    assert "<returncode>0</returncode>" in agent.messages[3]["content"]  # mini's own observation template
    grade = grade_patch(client, task, result["submission"], image)
    assert grade.resolved, grade.log[-2000:]
