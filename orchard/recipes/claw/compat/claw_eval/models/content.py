"""A message's content blocks, in the Anthropic Messages shape Claw-Eval's traces use: text, a tool
call (`tool_use`), its answer (`tool_result`), and media (image, audio, video as base64)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field


class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(BaseModel):
    """The assistant calls tool `name` with `input` (its arguments); `id` pairs it with its result."""

    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(BaseModel):
    """The answer to the tool call `tool_use_id`, sent back in a user message."""

    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: list[TextBlock] = Field(default_factory=list)
    is_error: bool = False


class _Media(BaseModel):
    data: str
    """Base64 of the file."""
    mime_type: str
    source_path: str | None = None


class ImageBlock(_Media):
    type: Literal["image"] = "image"


class AudioBlock(_Media):
    type: Literal["audio"] = "audio"


class VideoBlock(_Media):
    type: Literal["video"] = "video"


ContentBlock = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ImageBlock | AudioBlock | VideoBlock,
    Field(discriminator="type"),
]
