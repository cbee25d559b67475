"""Orchard-Claw: a personal assistant (mail, calendar, to-dos, ...) graded on its actions."""

from orchard.recipes import Recipe

RECIPE = Recipe(
    name="claw",
    title="Orchard-Claw",
    about="assistant tasks",
    kinds={"claw": "orchard.claw.task:ClawTask", "claw-eval": "orchard.claw.claweval:ClawEvalTask"},
    harnesses={
        "functions": "orchard.claw.harnesses:FunctionsHarness",
        "assistant": "orchard.claw.harnesses:AssistantHarness",
        "react": "orchard.claw.harnesses:ReactHarness",
    },
    folders={"claw-eval": "orchard.claw.claweval:read_folder"},
    example_tasks="claw/tasks.json",
    example_config="configs/claw-tiny.yaml",
)
