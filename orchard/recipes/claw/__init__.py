"""Orchard-Claw: a personal assistant (mail, calendar, to-dos, ...) graded on its actions.

`world` (the services' state and rules, standard library only) and `server` (them as a real HTTP
server) run inside a task's sandbox as well as on the host; `checks` are the rule-based grading;
`task` is the `claw` task kind, `claweval` the `claw-eval` kind (Claw-Eval's task folders), and
`harnesses` its three harnesses (`functions`, `assistant`, `react`).
"""

from orchard.recipes import Example, Recipe

RECIPE = Recipe(
    name="claw",
    title="Orchard-Claw",
    about="assistant tasks",
    kinds={"claw": "orchard.recipes.claw.task:ClawTask", "claw-eval": "orchard.recipes.claw.claweval:ClawEvalTask"},
    harnesses={
        "functions": "orchard.recipes.claw.harnesses:FunctionsHarness",
        "assistant": "orchard.recipes.claw.harnesses:AssistantHarness",
        "react": "orchard.recipes.claw.harnesses:ReactHarness",
    },
    folders={"claw-eval": "orchard.recipes.claw.claweval:read_folder"},
    images={"claw-eval": "orchard.recipes.claw.claweval:build_image"},
    example=Example(tasks="claw/tasks.json", config="configs/claw-tiny.yaml", pass_k=True),
)
