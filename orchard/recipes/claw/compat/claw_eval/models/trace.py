"""What a grader reads of a run: its messages (`TraceMessage`), its tool calls as sent to the
services (`ToolDispatch`), media loaded (`MediaLoad`); and what it returns (`DimensionScores`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from .message import Message


def _now() -> str:
    return datetime.now(UTC).isoformat()


class TokenUsage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0


class DimensionScores(BaseModel):
    """A grader's verdict, each in [0, 1]; `safety` gates the score (0: the run did something forbidden).
    The task's score is `models.scoring.compute_task_score` of it."""

    completion: float = 0.0
    robustness: float = 0.0
    communication: float = 0.0
    safety: float = 1.0
    efficiency_turns: int = 0
    efficiency_tokens: int = 0
    efficiency_wall_time_s: float = 0.0


class TraceMessage(BaseModel):
    type: Literal["message"] = "message"
    trace_id: str = ""
    message: Message
    usage: TokenUsage = Field(default_factory=TokenUsage)
    timestamp: str = Field(default_factory=_now)


class ToolDispatch(BaseModel):
    """One tool call as it went to its service: the arguments as the JSON body, the answer's status and body."""

    type: Literal["tool_dispatch"] = "tool_dispatch"
    trace_id: str = ""
    tool_use_id: str
    tool_name: str
    endpoint_url: str
    request_body: dict[str, Any] = Field(default_factory=dict)
    response_status: int = 200
    response_body: Any = None
    latency_ms: float = 0.0
    timestamp: str = Field(default_factory=_now)


class AuditSnapshot(BaseModel):
    """A service's own record of what it was asked (`GET .../audit`), taken after the run."""

    type: Literal["audit_snapshot"] = "audit_snapshot"
    trace_id: str = ""
    service_name: str
    audit_url: str
    audit_data: dict[str, Any] = Field(default_factory=dict)
    timestamp: str = Field(default_factory=_now)


class MediaLoad(BaseModel):
    type: Literal["media_load"] = "media_load"
    trace_id: str = ""
    modality: Literal["image", "audio", "video", "document"]
    source_path: str
    mime_type: str
    size_bytes: int
    sha256: str
    status: Literal["loaded", "skipped", "error"] = "loaded"
    note: str = ""
    timestamp: str = Field(default_factory=_now)


class GradingResult(BaseModel):
    type: Literal["grading_result"] = "grading_result"
    trace_id: str = ""
    task_id: str
    scores: DimensionScores = Field(default_factory=DimensionScores)
    task_score: float = 0.0
    passed: bool = False
    failure_modes: list[str] = Field(default_factory=list)
    judge_calls: list[dict[str, Any]] = Field(default_factory=list)
    user_agent_meta: dict[str, Any] = Field(default_factory=dict)
    timestamp: str = Field(default_factory=_now)
