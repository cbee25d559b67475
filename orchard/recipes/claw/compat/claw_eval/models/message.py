"""One chat message: a role and its content blocks (a plain string is taken as one text block)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from .content import ContentBlock


class Message(BaseModel):
    role: Literal["user", "assistant", "system"]
    content: list[ContentBlock] = Field(default_factory=list)
    reasoning_content: str | None = None
    """The model's reasoning, where its server returned it apart from the answer."""

    @model_validator(mode="before")
    @classmethod
    def _text_as_block(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("content"), str):
            return {**data, "content": [{"type": "text", "text": data["content"]}]}
        return data

    @property
    def text(self) -> str:
        """The message's text blocks, one per line (tool calls, results and media left out)."""
        return "\n".join(block.text for block in self.content if block.type == "text")
