"""A tool as the model sees it (`ToolSpec`), and where a call of it is sent (`ToolEndpoint`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ToolSpec(BaseModel):
    name: str
    description: str
    input_schema: dict[str, Any] = Field(default_factory=dict)
    """A JSON Schema of the arguments: an OpenAI function's `parameters`."""


class ToolEndpoint(BaseModel):
    """Hidden from the model: a call of `tool_name` is an HTTP request to `url`, its arguments the JSON body."""

    tool_name: str
    url: str
    method: str = "POST"
