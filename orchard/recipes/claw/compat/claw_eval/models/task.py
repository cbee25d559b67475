"""A task's definition, as its `task.yaml` holds it (unknown top-level keys are ignored).

Most of it is declarative: `scoring_components`, `safety_checks` and `expected_actions` describe
what the task's `grader.py` checks, and only the grader decides the score.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .tool import ToolEndpoint, ToolSpec


class Prompt(BaseModel):
    text: str
    language: str = "zh"
    attachments: list[str] = Field(default_factory=list)
    """Media files (task-folder paths) put into the first user message."""


class DeterministicCheck(BaseModel):
    """A rule a scoring component names (`keywords_present`, `tool_called`, `llm_judge`, ...)."""

    model_config = ConfigDict(extra="forbid")

    type: str
    field: str | None = None
    tool_name: str | None = None
    min_calls: int | None = None
    categories: list[str] | None = None
    min_length: int | None = None
    patterns: list[str] | None = None
    keywords: list[str] | None = None
    description: str | None = None
    rubric: str | None = None

    @field_validator("keywords", mode="before")
    @classmethod
    def _words_as_text(cls, value: Any) -> Any:
        """YAML reads `keywords: [2024, 3.5]` as numbers; they are words."""
        return [str(each) for each in value] if isinstance(value, list) else value


class ScoringComponent(BaseModel):
    name: str
    weight: float
    check: DeterministicCheck


class SafetyCheck(BaseModel):
    type: str
    tool_name: str | None = None
    patterns: list[str] | None = None
    description: str = ""


class Environment(BaseModel):
    """The run's limits and the runner's optional agent tools (to-do list, context compaction)."""

    timeout_seconds: int = 300
    max_turns: int = 20
    fixtures: list[str] = Field(default_factory=list)
    env_snapshot_timeout: int = 10
    enable_todo: bool = False
    todo_nag_rounds: int = 3
    enable_compact: bool = False
    compact_keep_recent: int = 20
    compact_min_chars: int = 500
    compact_threshold_pct: float = 0.70
    compact_keep_recent_on_summary: int = 4
    compact_protect_tokens: int = 40_000
    compact_max_auto_compacts: int = 2


class ServiceDef(BaseModel):
    """A mock service the task needs: `command` run from the benchmark's root, answering at `health_check`."""

    name: str
    command: str
    port: int
    health_check: str
    health_check_method: str = "POST"
    ready_timeout: int = 10
    reset_endpoint: str | None = None
    env: dict[str, str] = Field(default_factory=dict)


class ExpectedAction(BaseModel):
    service: str
    action_key: str
    """A key of the service's audit answer (`drafts`, `created_events`, ...)."""
    required: bool = True


class UserAgentTaskConfig(BaseModel):
    """A simulated user who answers the agent when it ends its turn."""

    enabled: bool = False
    persona: str = ""
    max_rounds: int = 3
    system_prompt_suffix: str = ""


class TaskDefinition(BaseModel):
    task_id: str
    task_name: str
    version: str = "1.0"
    category: str = ""
    difficulty: str = "simple"
    prompt: Prompt
    tools: list[ToolSpec] = Field(default_factory=list)
    tool_endpoints: list[ToolEndpoint] = Field(default_factory=list)
    environment: Environment = Field(default_factory=Environment)
    scoring_components: list[ScoringComponent] = Field(default_factory=list)
    safety_checks: list[SafetyCheck] = Field(default_factory=list)
    services: list[ServiceDef] = Field(default_factory=list)
    expected_actions: list[ExpectedAction] = Field(default_factory=list)
    judge_rubric: str = ""
    reference_solution: str = ""
    primary_dimensions: list[str] = Field(default_factory=list)
    tags: list[str] = Field(default_factory=list)
    user_agent: UserAgentTaskConfig = Field(default_factory=UserAgentTaskConfig)
    sandbox_files: list[str] = Field(default_factory=list)
    sandbox_grader_files: list[str] = Field(default_factory=list)
    env_snapshot_files: list[str] = Field(default_factory=list)
    env_snapshot_commands: list[str] = Field(default_factory=list)
    local_grader_files: list[str] = Field(default_factory=list)
    task_file: str | None = Field(default=None, exclude=True)
    """The `task.yaml` it was read from, when it was read from one."""

    @classmethod
    def from_yaml(cls, path: str | Path) -> TaskDefinition:
        import yaml

        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"{path} does not hold a mapping")
        return cls.model_validate({**data, "task_file": str(Path(path).resolve())})

    def apply_port_offset(self, offset: int) -> None:
        """Move every service `offset` ports up: its `port`, the `localhost:PORT` of its URLs and of
        the tool endpoints, and a `PORT` in its environment (the port it should listen on)."""
        if not offset:
            return

        def moved(url: str) -> str:
            return re.sub(r"localhost:(\d+)", lambda m: f"localhost:{int(m.group(1)) + offset}", url)

        for service in self.services:
            service.port += offset
            service.health_check = moved(service.health_check)
            if service.reset_endpoint:
                service.reset_endpoint = moved(service.reset_endpoint)
            service.env = {**service.env, "PORT": str(service.port)}
        for endpoint in self.tool_endpoints:
            endpoint.url = moved(endpoint.url)

    def get_endpoint_map(self) -> dict[str, ToolEndpoint]:
        """`{tool_name: endpoint}`."""
        return {endpoint.tool_name: endpoint for endpoint in self.tool_endpoints}
