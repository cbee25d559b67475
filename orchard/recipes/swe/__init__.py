"""Orchard-SWE: agents that fix real repository issues (SWE-bench), graded by the repository's tests.

`task` is the `swe` kind (SWE-bench's schema), `specs` SWE-bench's knowledge of each repository
(from its pinned package), `environments` the task images built offline, `grading` a patch judged
by the task's tests in a fresh sandbox, and `infra` the test infrastructure no patch may change.
"""

from orchard.recipes import Example, Recipe

RECIPE = Recipe(
    name="swe",
    title="Orchard-SWE",
    about="repository issues",
    kinds={"swe": "orchard.recipes.swe.task:SWETask"},
    harnesses={
        "bash": "orchard.agents.bash:BashHarness",
        "tools": "orchard.agents.tools:ToolsHarness",
        "cli": "orchard.agents.coding_cli:CliHarness",
        "codex": "orchard.agents.clis:CodexHarness",
        "claude": "orchard.agents.clis:ClaudeHarness",
        "opencode": "orchard.agents.clis:OpencodeHarness",
        "pi": "orchard.agents.clis:PiHarness",
        "hermes": "orchard.agents.clis:HermesHarness",
        "mini": "orchard.agents.clis:MiniHarness",
    },
    example=Example(
        tasks="tasks/tasks.jsonl", config="configs/swe-tiny.yaml", prepare="orchard.recipes.swe.example:prepare"
    ),
)
