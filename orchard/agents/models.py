"""Models the agent loop can drive, named by a spec string:

* `scripted:gold` replays, for each task, the script its kind makes from its known solution
  (`task.script("gold")`; for SWE: look around, apply the gold patch, check, submit) in whatever
  harness is used; `scripted:regress` does the same but undoes the solution before submitting
  (unresolved, with one productive stretch); `scripted:FILE` replays steps from a JSON file
  (`{instance_id: [step, ...]}`, steps as `orchard.agents.base.Step` fields); `noop` submits at
  once. For tests and offline demos.
* `openai:MODEL` (any OpenAI-compatible server: vLLM, SGLang, Ollama, hosted APIs), with the
  server from `--base-url` / `OPENAI_BASE_URL` and the key from `OPENAI_API_KEY` (or none).
* `hf:PATH` a local `transformers` causal LM (a folder), generating on this machine.

A model hands out one `ModelSession` per episode (`session(task, harness)`), so sessions can run
in parallel and keep per-episode state.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from orchard.agents.base import Harness, Message, Reply, Step, ToolCall
from orchard.errors import ConfigError, OrchardError
from orchard.registry import load

if TYPE_CHECKING:
    from orchard.tasks.base import TaskBase


class ModelError(OrchardError):
    """The model could not answer (server down, out of context, ...)."""


class ModelSession(Protocol):
    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> Reply: ...


class Model(Protocol):
    name: str

    def session(self, task: TaskBase, harness: Harness) -> ModelSession: ...


# -- scripted ----------------------------------------------------------------------------


class ScriptedSession:
    """Replays steps, each written in the harness's own format; submits when they run out."""

    def __init__(self, steps: list[Step], harness: Harness):
        self.steps, self.harness, self.index = steps, harness, 0

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> Reply:
        step = self.steps[self.index] if self.index < len(self.steps) else Step("submit")
        self.index += 1
        reply = self.harness.encode(step, self.index)
        reply.prompt_tokens = sum(len(str(m.get("content") or "")) for m in messages) // 4
        reply.completion_tokens = max(1, len(reply.content) // 4 + sum(len(c.arguments) for c in reply.tool_calls) // 4)
        return reply


class ScriptedModel:
    """`scripted:gold`, `scripted:regress` (fixes, then reverts), `scripted:FILE` or `noop`."""

    def __init__(self, source: str):
        builtin = source in ("gold", "regress")
        self.name = "noop" if source == "noop" else f"scripted:{source if builtin else Path(source).name}"
        self._scripts: dict[str, list[Step]] | None = None
        self._source = source
        if source not in ("gold", "regress", "noop"):
            path = Path(source)
            try:
                data = json.loads(path.read_text())
                if not isinstance(data, dict):
                    raise TypeError("the file must hold a JSON object: {instance_id: [step, ...]}")
                self._scripts = {key: [Step(**step) for step in steps] for key, steps in data.items()}
            except (OSError, ValueError, TypeError, AttributeError) as exc:
                raise ConfigError(f"scripted model {source}: cannot read steps ({exc})") from None

    @classmethod
    def from_spec(cls, argument: str, **_: Any) -> ScriptedModel:
        return cls(argument)

    def session(self, task: TaskBase, harness: Harness) -> ScriptedSession:
        if self._source == "noop":
            return ScriptedSession([], harness)
        if self._scripts is None:
            return ScriptedSession(task.script(self._source), harness)
        return ScriptedSession(self._scripts.get(task.instance_id, []), harness)


class RecordedModel:
    """A trajectory's own assistant turns, replayed in order (then a submit): credit by replay runs
    a trajectory again through the same loop and harness, so its actions are parsed and executed
    exactly as they were."""

    def __init__(self, messages: list[Message], name: str = "replay"):
        self.name = name
        self.replies = [_reply(m) for m in messages if m.get("role") == "assistant"]

    def session(self, task: TaskBase, harness: Harness) -> _ReplaySession:
        return _ReplaySession(self.replies, harness)


class _ReplaySession:
    def __init__(self, replies: list[Reply], harness: Harness):
        self.replies, self.harness, self.index = replies, harness, 0

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> Reply:
        self.index += 1
        if self.index <= len(self.replies):
            return self.replies[self.index - 1]
        return self.harness.encode(Step("submit"), self.index)


def _reply(message: Message) -> Reply:
    calls = []
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        arguments = function.get("arguments")
        arguments = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
        calls.append(ToolCall(str(call.get("id") or f"call_{index}"), str(function.get("name")), arguments))
    content = message.get("content")
    if isinstance(content, list):  # content parts: their text, as the model wrote it
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return Reply(content=content if isinstance(content, str) else "", tool_calls=calls)


# -- OpenAI-compatible servers -----------------------------------------------------------


class OpenAIModel:
    """Any OpenAI-compatible chat server, with tool calls or plain text."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        temperature: float = 0.0,
        max_tokens: int = 2048,
        timeout: float = 600.0,
    ):
        from openai import OpenAI

        self.name = model
        self.temperature, self.max_tokens = temperature, max_tokens
        self.client = OpenAI(
            base_url=base_url or os.environ.get("OPENAI_BASE_URL"),
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or "none",
            timeout=timeout,
            max_retries=2,
        )

    @classmethod
    def from_spec(cls, argument: str, *, base_url: str | None = None, api_key: str | None = None) -> OpenAIModel:
        return cls(argument, base_url=base_url, api_key=api_key)

    def session(self, task: TaskBase, harness: Harness) -> OpenAIModel:
        return self

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> Reply:
        import openai

        kwargs: dict[str, Any] = {"tools": tools} if tools else {}
        try:
            answer = self.client.chat.completions.create(
                model=self.name,
                messages=messages,  # type: ignore[arg-type]
                temperature=self.temperature,
                max_tokens=self.max_tokens,
                **kwargs,
            )
        except openai.OpenAIError as exc:
            raise ModelError(f"the model server failed: {type(exc).__name__}: {str(exc)[:300]}") from None
        choice = answer.choices[0]
        calls = [
            ToolCall(call.id or f"call_{uuid.uuid4().hex[:8]}", call.function.name, call.function.arguments or "{}")
            for call in choice.message.tool_calls or []
            if call.type == "function"
        ]
        usage = answer.usage
        return Reply(
            content=choice.message.content or "",
            tool_calls=calls,
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
            finish_reason=choice.finish_reason,
        )


# -- local transformers ------------------------------------------------------------------

_TOOL_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


class TransformersModel:
    """A causal LM's chat template and tool-call format, generating on this machine (greedy unless
    `temperature` > 0) or through `generate`, a remote generator such as a vLLM server."""

    def __init__(
        self,
        path: str | None = None,
        *,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        model: Any = None,
        tokenizer: Any = None,
        name: str | None = None,
        generate: Callable[[list[int]], list[int]] | None = None,
    ):
        """From a folder or hub id (`path`, on the GPU where there is one); from a loaded `model` and
        `tokenizer` (a policy being trained); or from a `tokenizer` and `generate`, which turns prompt
        token ids into completion token ids elsewhere (a vLLM server that holds the policy's weights)."""
        if tokenizer is None or (model is None and generate is None):
            tokenizer, model = _load_causal_lm(path)
            name = name or f"hf:{Path(path or '').name}"
        self.name = name or "policy"
        self.tokenizer, self.model = tokenizer, model
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        self._generate = generate or self._on_this_machine
        self._lock = threading.Lock()  # one generation at a time on this device

    @classmethod
    def from_spec(cls, argument: str, **_: Any) -> TransformersModel:
        return cls(argument)

    def session(self, task: TaskBase, harness: Harness) -> TransformersModel:
        return self

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> Reply:
        prompt: Any = self.tokenizer.apply_chat_template(
            _plain_messages(messages), tools=cast(Any, tools or None), add_generation_prompt=True, return_dict=True
        )
        prompt_ids = list(prompt["input_ids"])
        completion = self._generate(prompt_ids)
        text = str(self.tokenizer.decode(completion, skip_special_tokens=True))
        calls = []
        for index, raw in enumerate(_TOOL_CALL.findall(text)):
            try:
                call = json.loads(raw)
                calls.append(ToolCall(f"call_{index}", str(call["name"]), json.dumps(call.get("arguments", {}))))
            except (ValueError, KeyError, TypeError):
                continue
        return Reply(
            content=_TOOL_CALL.sub("", text).strip() if calls else text,
            tool_calls=calls,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(completion),
        )

    def _on_this_machine(self, prompt_ids: list[int]) -> list[int]:
        import torch

        device = next(self.model.parameters()).device
        # plain temperature sampling: not the top-k/top-p defaults of transformers or the model's generation_config
        sampling = (
            {"do_sample": True, "temperature": self.temperature, "top_k": 0, "top_p": 1.0}
            if self.temperature > 0
            else {"do_sample": False}
        )
        with self._lock, torch.no_grad():
            output = self.model.generate(
                input_ids=torch.tensor([prompt_ids], device=device),
                attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long, device=device),
                max_new_tokens=self.max_new_tokens,
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
                **sampling,
            )
        return [int(t) for t in output[0][len(prompt_ids) :]]


def _load_causal_lm(path: str | None) -> tuple[Any, Any]:
    """A tokenizer and causal LM from a folder or a hub id (the hub needs a network or the HF cache)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(path or "").expanduser()
    hub_id = bool(path) and not folder.exists() and re.fullmatch(r"[\w.-]+/[\w.-]+", path or "") is not None
    if not folder.is_dir() and not hub_id:
        raise ConfigError(f"no model folder at {path}")
    source = str(path) if hub_id else str(folder)
    if hub_id:
        from orchard.config import require_hub

        require_hub(source)  # offline: one line now, not half a minute of retries first
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model: Any = AutoModelForCausalLM.from_pretrained(source, dtype="auto")
    except OSError as exc:
        raise ConfigError(f"cannot load model {path}: {str(exc).splitlines()[0]}") from None
    if torch.cuda.is_available():
        model.to("cuda")
    return tokenizer, model.eval()


def _plain_messages(messages: list[Message]) -> list[Message]:
    """Tool-call arguments as objects, as chat templates expect them."""
    plain = []
    for message in messages:
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = dict(call["function"])
                with contextlib.suppress(ValueError, TypeError):
                    function["arguments"] = json.loads(function["arguments"])
                calls.append({**call, "function": function})
            message = {**message, "tool_calls": calls}
        plain.append(message)
    return plain


MODELS: dict[str, str] = {
    "scripted": "orchard.agents.models:ScriptedModel",
    "openai": "orchard.agents.models:OpenAIModel",
    "hf": "orchard.agents.models:TransformersModel",
}
"""Model adapters by the prefix of a spec (`PREFIX:ARGUMENT`): `name -> "module:Class"`; each class
makes a model from the argument with `from_spec`. `noop` stands for `scripted:noop`."""
SPECS = "scripted:gold, scripted:regress, scripted:FILE, noop, openai:NAME (with --base-url), hf:PATH or module:Class[:ARGUMENT]"


def model_from_spec(spec: str, *, base_url: str | None = None, api_key: str | None = None) -> Model:
    """The model a spec names: `PREFIX:ARGUMENT` with a prefix of `MODELS`, `noop`, or your own
    adapter as `module:Class[:ARGUMENT]` (a class with the same `from_spec`)."""
    prefix, _, rest = ("scripted:noop" if spec == "noop" else spec).partition(":")
    if prefix in MODELS and rest:
        return load(MODELS, prefix, "model").from_spec(rest, base_url=base_url, api_key=api_key)
    attribute, _, argument = rest.partition(":")
    if not (prefix.replace(".", "_").isidentifier() and attribute.isidentifier() and _importable(prefix)):
        raise ConfigError(f"unknown model {spec!r}: use {SPECS}")
    adapter = load({}, f"{prefix}:{attribute}", "model")
    if not callable(getattr(adapter, "from_spec", None)):
        raise ConfigError(f"model {spec!r}: {prefix}:{attribute} has no from_spec(argument, base_url=, api_key=)")
    return adapter.from_spec(argument, base_url=base_url, api_key=api_key)


def _importable(module: str) -> bool:
    """Whether `module` can be imported (a spec's prefix that is neither a model adapter nor a module is a typo)."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
