"""mini-swe-agent on Orchard sandboxes: its `Environment` interface, backed by a `Sandbox`.

    from minisweagent.agents.default import DefaultAgent
    from orchard.agents.minisweagent import OrchardEnvironment

    with Client() as client, client.create(image) as box:
        agent = DefaultAgent(model, OrchardEnvironment(sandbox=box, cwd="/testbed"), **agent_config)
        result = agent.run(problem_statement)      # result["submission"]: the patch, with mini's SWE-bench config

mini-swe-agent's own loop, prompts and models run unchanged; commands go to the sandbox's agent
instead of `docker exec` (each one a fresh `bash -c`, as mini-swe-agent expects). Needs the
`minisweagent` extra (`pip install orchard-agents[minisweagent]`).
"""

from __future__ import annotations

import platform
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from orchard.errors import OrchardError

if TYPE_CHECKING:
    from orchard.env.client import Sandbox

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class OrchardEnvironmentConfig(BaseModel):
    cwd: str = "/testbed"
    env: dict[str, str] = {}
    timeout: int = 60


class OrchardEnvironment:
    """mini-swe-agent's Environment protocol: `execute`, `get_template_vars`, `serialize`."""

    def __init__(self, *, sandbox: Sandbox, config_class: type = OrchardEnvironmentConfig, **kwargs: Any):
        self.sandbox = sandbox
        self.config = config_class(**kwargs)

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        command = action.get("command", "")
        limit = timeout or self.config.timeout
        try:
            result = self.sandbox.exec(command, cwd=cwd or self.config.cwd, env=self.config.env, timeout=limit)
        except OrchardError as exc:
            output = {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {exc}",
            }
        else:
            output = {"output": result.stdout + result.stderr, "returncode": result.exit_code, "exception_info": ""}
            if result.timed_out:
                output["returncode"] = -1
                output["exception_info"] = f"The command timed out after {limit} s and was killed."
        self._check_finished(output)
        return output

    @staticmethod
    def _check_finished(output: dict[str, Any]) -> None:
        """mini-swe-agent's submission protocol: the marker on the first line of a successful command."""
        from minisweagent.exceptions import Submitted

        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {"role": "exit", "content": submission, "extra": {"exit_status": "Submitted", "submission": submission}}
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        from minisweagent.utils.serialize import recursive_merge

        return recursive_merge(
            self.config.model_dump(), platform.uname()._asdict(), {"sandbox_id": self.sandbox.id}, kwargs
        )

    def serialize(self) -> dict[str, Any]:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json"),
                    "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
                }
            }
        }
