"""Orchard-SWE: agents that fix real repository issues (SWE-bench), graded by the repository's tests."""

from orchard.recipes import Recipe

RECIPE = Recipe(
    name="swe",
    title="Orchard-SWE",
    about="repository issues",
    kinds={"swe": "orchard.tasks.swe:SWETask"},
    harnesses={
        "bash": "orchard.agents.bash:BashHarness",
        "tools": "orchard.agents.tools:ToolsHarness",
        "cli": "orchard.agents.cli:CliHarness",
    },
    example_tasks="tasks/tasks.jsonl",
    example_config="configs/swe-tiny.yaml",
)
