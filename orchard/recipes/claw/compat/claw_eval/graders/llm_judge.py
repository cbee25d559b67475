"""An LLM judge for what rules cannot check: `evaluate` (the conversation), `evaluate_actions` (what
the services recorded), `evaluate_visual` (images against references). Each asks once for a JSON
`{"score": 0..1, "reasoning": "..."}` and returns it as a `JudgeResult`.

`LLMJudge(chat=...)` sends every request through `chat(messages) -> answer text` (Orchard passes its
own model adapter); without it, through an OpenAI client of `base_url`. Each call, its prompt and
the answer are kept (`get_call_log`), and so are requests graders send through `judge.client`
directly when `chat` is given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from pydantic import BaseModel

Chat = Callable[[list[dict[str, Any]]], str]

JUDGE_SYSTEM = """You grade the work of an AI assistant. You get the user's request, the conversation,
what the assistant did, and a rubric. Apply the rubric and score the work from 0.0 (fails it) to 1.0
(meets it fully). Answer with one JSON object only: {"score": <number>, "reasoning": "<one or two sentences>"}"""

ACTIONS_SYSTEM = """You grade the actions of an AI agent. You get the user's request, the actions the
agent took as the services themselves recorded them (not as the agent described them), and a rubric.
Apply the rubric and score the actions from 0.0 to 1.0. Answer with one JSON object only:
{"score": <number>, "reasoning": "<one or two sentences>"}"""

VISUAL_SYSTEM = """You compare images an AI agent produced (candidates) with reference images and a
rubric, strictly: check every detail the rubric names; output that looks right but has the wrong
content scores low; reference images are the ground truth. Score from 0.0 to 1.0 and answer with one
JSON object only: {"score": <number>, "reasoning": "<one or two sentences>"}"""

TRIES = 3
"""Requests per evaluation when the answer holds no score."""


class JudgeResult(BaseModel):
    score: float
    """In [0, 1]."""
    reasoning: str


def _now() -> str:
    return datetime.now(UTC).isoformat()


def parse_verdict(answer: str) -> JudgeResult:
    """The score and reasoning of a judge's answer: a JSON object, perhaps in a code fence or among
    other text, or at least a `"score": N`; ValueError when it holds none. The score is held to [0, 1]."""
    text = re.sub(r"^```(?:json)?\s*|\s*```$", "", answer.strip())
    for candidate in [text, *re.findall(r"\{[^{}]*\}", text)]:
        try:
            data = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("score"), int | float | str):
            try:
                score = float(data["score"])
            except ValueError:
                continue
            return JudgeResult(score=min(1.0, max(0.0, score)), reasoning=str(data.get("reasoning", "")))
    found = re.search(r'"?score"?\s*[:=]\s*([0-9]*\.?[0-9]+)', text)
    if found is None:
        raise ValueError(f"the judge's answer holds no score: {answer[:200]!r}")
    reason = re.search(r'"reasoning"\s*:\s*"((?:[^"\\]|\\.)*)"', text)
    return JudgeResult(score=min(1.0, max(0.0, float(found.group(1)))), reasoning=reason.group(1) if reason else "")


class LLMJudge:
    def __init__(
        self,
        model_id: str = "judge",
        api_key: str | None = None,
        base_url: str | None = None,
        *,
        chat: Chat | None = None,
    ) -> None:
        self.model_id = model_id
        self._call_log: list[dict[str, Any]] = []
        self._chat = chat
        if chat is None:
            from openai import OpenAI

            self.client: Any = OpenAI(api_key=api_key or "none", base_url=base_url)
        else:
            self.client = _RecordingClient(self)

    def evaluate(self, task_prompt: str, conversation: str, actions_summary: str, rubric: str) -> JudgeResult:
        """Score the conversation against `rubric`."""
        prompt = (
            f"## Task Prompt\n{task_prompt}\n\n## Conversation\n{conversation}\n\n"
            f"## Actions Taken\n{actions_summary}\n\n## Rubric\n{rubric}"
        )
        return self._judge("evaluate", JUDGE_SYSTEM, prompt, rubric)

    def evaluate_actions(self, task_prompt: str, artifacts: str, rubric: str) -> JudgeResult:
        """Score the actions the services recorded (`artifacts`) against `rubric`."""
        prompt = (
            f"## Task Prompt\n{task_prompt}\n\n"
            f"## Agent Actions (from server audit log)\n{artifacts}\n\n## Rubric\n{rubric}"
        )
        return self._judge("evaluate_actions", ACTIONS_SYSTEM, prompt, rubric)

    def evaluate_visual(
        self, rubric: str, reference_images_b64: list[str], candidate_images_b64: list[str], context: str = ""
    ) -> JudgeResult:
        """Score candidate images (base64 PNG) against references and `rubric`."""
        header = (
            f"{context}\n\n" if context else ""
        ) + f"## Rubric\n{rubric}\n\nReference images first, then candidates."
        parts: list[dict[str, Any]] = [{"type": "text", "text": header}]
        for title, images in (("Reference", reference_images_b64), ("Candidate", candidate_images_b64)):
            if images:
                parts.append({"type": "text", "text": f"### {title} ({len(images)} images)"})
                parts += [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b}"}} for b in images]
        extra = {"n_ref_images": len(reference_images_b64), "n_cand_images": len(candidate_images_b64)}
        return self._judge("evaluate_visual", VISUAL_SYSTEM, parts, rubric, extra)

    def get_call_log(self) -> list[dict[str, Any]]:
        return list(self._call_log)

    def reset_call_log(self) -> None:
        self._call_log.clear()

    def _judge(
        self,
        method: str,
        system: str,
        prompt: str | list[dict[str, Any]],
        rubric: str,
        extra: dict[str, Any] | None = None,
    ) -> JudgeResult:
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
        problem: ValueError | None = None
        for _ in range(TRIES):
            answer = self._send(messages)
            try:
                result = parse_verdict(answer)
            except ValueError as exc:
                problem = exc
                self._log(method, messages, answer, rubric_preview=rubric[:300], error=str(exc), **(extra or {}))
                continue
            self._log(
                method, messages, answer, rubric_preview=rubric[:300], score=result.score,
                reasoning=result.reasoning, **(extra or {}),
            )  # fmt: skip
            return result
        assert problem is not None
        raise problem

    def _send(self, messages: list[dict[str, Any]]) -> str:
        if self._chat is not None:
            return self._chat(messages)
        answer = self.client.chat.completions.create(model=self.model_id, messages=messages, temperature=0.0)
        return answer.choices[0].message.content or ""

    def _log(self, method: str, messages: list[dict[str, Any]], answer: str, **fields: Any) -> None:
        self._call_log.append({"method": method, "prompt": messages, "answer": answer, **fields, "timestamp": _now()})


class _RecordingClient:
    """`judge.client` when the judge has a `chat`: `client.chat.completions.create(model=..., messages=...)`
    goes through it, is logged, and answers in the OpenAI client's shape (`.choices[0].message.content`)."""

    def __init__(self, judge: LLMJudge) -> None:
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))
        self._judge = judge

    def _create(self, *, messages: list[dict[str, Any]], model: str | None = None, **_: Any) -> Any:
        assert self._judge._chat is not None
        answer = self._judge._chat(list(messages))
        self._judge._log("client", list(messages), answer)
        message = SimpleNamespace(role="assistant", content=answer, tool_calls=None)
        return SimpleNamespace(choices=[SimpleNamespace(index=0, message=message, finish_reason="stop")], model=model)
