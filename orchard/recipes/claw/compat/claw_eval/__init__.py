"""Orchard's own `claw_eval`: the modules, classes and helpers that Claw-Eval's `grader.py` files
import (`graders.base`, `graders.llm_judge`, `models.task`, `models.trace`, `models.message`,
`models.content`, `models.scoring`), with the same paths and names, so those files run unchanged.

Only the grading interface is here: no runner, services or CLI (Orchard runs the tasks). The
helper bases some graders subclass (`graders.multimodal_common`, `visual_grader`,
`user_agent_clarify_base`, ...) are not: importing one fails, and so does that task's grade.
"""

__version__ = "1.0.0+orchard"
