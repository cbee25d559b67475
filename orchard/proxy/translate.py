"""Anthropic's Messages API and OpenAI's Responses API, spoken to clients over an upstream that
speaks only Chat Completions: requests, answers and streams translated, with no HTTP here.

    translation = translated("/v1/messages", body)   # InvalidRequest when the body is not one
    translation.chat                                 # the chat request that goes upstream
    translation.answer(chat_answer)                  # the chat answer, as the client's API answers
    events = translation.events()                    # a stream: upstream chat SSE bytes in ...
    events.feed(chunk)                               # ... the API's events out, as they come
    events.fail(message)                             # the API's error event, for a stream that broke

`Messages` (`POST /v1/messages`, what Claude Code speaks): `system`, and a `system` turn within
`messages` (Claude Code sends them), become system messages; content blocks become chat parts
(`text`; `image` as an `image_url`, base64 as a data URL; `tool_use` a tool call of the assistant
message; `tool_result` a `tool` message, `is_error` an `Error: ` before its text, its images in
the user message after; `thinking` dropped); `tools` become function tools (server tools, whose
`type` is not `custom`, and deferred ones, `defer_loading`, are dropped); `tool_choice`
auto/any/tool/none becomes auto/required/the function/none; `max_tokens`, `temperature`, `top_p`,
`stop_sequences` carry over; `metadata`, `thinking`, `top_k`, `output_config`,
`context_management` and `cache_control` do not. The answer is a `message` of text and `tool_use`
blocks; a stream is Anthropic's event sequence (`message_start`, `ping`, a
`content_block_start`/`_delta`/`_stop` run for each block, `message_delta` with the stop reason
and usage, `message_stop`), and a failure an `error` event.

`Responses` (`POST /v1/responses`, what Codex CLI speaks): `instructions` and `developer`
messages become system messages; `input` items become messages (`message` parts `input_text`,
`output_text`, `input_image`; a `function_call` joins the assistant message before it as a tool
call; `function_call_output` is a `tool` message; `reasoning` items are dropped). Function tools
carry over; a freeform `custom` tool (Codex's `apply_patch`) becomes a function of one string
argument, `input`, and its calls come back as `custom_tool_call` items; a `namespace`'s tools
become functions named `NAMESPACE__NAME`, whose calls come back with their `namespace`; tools in
an `additional_tools` input item join the others; other tool types (web_search, tool_search,
local_shell ...) are dropped. `previous_response_id` is refused: the proxy keeps no responses,
the client sends the whole conversation (`store: false`, as Codex does). The answer is a
`response` of `message` and `function_call` items; a stream is its events (`response.created`
... `response.completed`, each with its `sequence_number`), and a failure `response.failed`.

A stream's final events (stop reason, usage, the completed response) go out at the upstream's
`[DONE]`: a stream cut before it ends with the API's error event instead, never as a clean one.
Memory per stream: the event being read, and for a response the text and arguments of its items
(`response.completed` repeats them), no more than the upstream's answer.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

from orchard.errors import InvalidRequest
from orchard.proxy.recorder import assembled, first_choice

MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
RESPONSES = "/v1/responses"
CHAT = "/v1/chat/completions"
EVENT_END = re.compile(rb"\r?\n\r?\n")


def dialect(path: str) -> str | None:
    """Which API a request's path (tagged or not) speaks, for the shape of its errors: `anthropic`,
    `responses`, or None (OpenAI's own)."""
    path = path.rstrip("/")
    if path.endswith((MESSAGES, COUNT_TOKENS)):
        return "anthropic"
    return "responses" if path.endswith(RESPONSES) else None


def translated(api: str, body: bytes) -> Translation:
    """The translation of a request to `api` (`MESSAGES` or `RESPONSES`); InvalidRequest, in one
    line, when the body is not such a request."""
    parsed = _parsed(body)
    return Messages(parsed) if api == MESSAGES else Responses(parsed)


def _parsed(body: bytes) -> dict[str, Any]:
    try:
        parsed = json.loads(body)
    except ValueError as exc:
        raise InvalidRequest(f"the request's body is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise InvalidRequest("the request's body is not a JSON object")
    return parsed


def error_body(dialect: str | None, status: int, message: str, kind: str) -> dict[str, Any]:
    """An error in the shape of the client's API (`kind`: the proxy's name for it)."""
    if dialect == "anthropic":
        return {"type": "error", "error": {"type": ANTHROPIC_ERRORS.get(status, "api_error"), "message": message}}
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
"""Anthropic's error types by HTTP status (its SDK picks the exception by status; the type is told)."""


def count_tokens(body: bytes) -> dict[str, int]:
    """An estimate of a Messages request's input tokens, for `/v1/messages/count_tokens`: a token
    per 4 characters of its system, messages and tools (no upstream is asked)."""
    parsed = _parsed(body)
    counted = [parsed.get(key) for key in ("system", "messages", "tools") if parsed.get(key) is not None]
    return {"input_tokens": max(1, sum(len(json.dumps(part, ensure_ascii=False)) for part in counted) // 4)}


def upstream_message(content: bytes) -> str:
    """The message of an upstream's error body (OpenAI's, vLLM's, or plain text), in one line."""
    try:
        parsed = json.loads(content)
    except ValueError:
        parsed = None
    message: Any = None
    if isinstance(parsed, dict):
        error = parsed.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        message = message or parsed.get("message") or parsed.get("detail")
    if not isinstance(message, str) or not message:
        message = content.decode("utf-8", "replace") if content else "no answer"
    return " ".join(message.split())[:2000]


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidRequest(f"{what} must be a list")
    return value


def _dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRequest(f"{what} must be an object")
    return value


def _joined(parts: list[dict[str, Any]], separator: str = "\n") -> str | list[dict[str, Any]]:
    """Chat content: a string when all parts are text, else the parts."""
    if all(part["type"] == "text" for part in parts):
        return separator.join(part["text"] for part in parts)
    return parts


def _image(url: str, detail: Any = None) -> dict[str, Any]:
    image: dict[str, Any] = {"url": url}
    if detail in ("auto", "low", "high"):
        image["detail"] = detail
    return {"type": "image_url", "image_url": image}


def _arguments(text: str) -> dict[str, Any]:
    """A tool call's arguments as an object (what the model wrote that is no JSON object: {})."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _sampling(body: dict[str, Any], chat: dict[str, Any], max_tokens: str) -> None:
    """The options both APIs share, onto the chat request."""
    if body.get(max_tokens) is not None:
        chat["max_tokens"] = body[max_tokens]
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            chat[key] = body[key]
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}  # the usage the final events report


def _message_of(choice: dict[str, Any]) -> dict[str, Any]:
    message = choice.get("message")
    return message if isinstance(message, dict) else {}


def chunks_of(answer: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A whole chat answer as the stream chunks that would have brought it (its first choice)."""
    choice = first_choice(answer)
    message = _message_of(choice)
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    calls = [call for call in message.get("tool_calls") or [] if isinstance(call, dict)]
    if calls:
        delta["tool_calls"] = [{**call, "index": index} for index, call in enumerate(calls)]
    top: dict[str, Any] = {key: answer[key] for key in ("id", "model") if key in answer}
    yield {**top, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
    finish: dict[str, Any] = {"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason")}
    if choice.get("stop_reason") is not None:
        finish["stop_reason"] = choice["stop_reason"]
    yield {**top, "choices": [finish]}
    if isinstance(answer.get("usage"), dict):
        yield {**top, "choices": [], "usage": answer["usage"]}


# -- the two APIs ---------------------------------------------------------------------------------


class Translation:
    """A client's request in another API and the chat request it became."""

    dialect = ""

    def __init__(self, body: dict[str, Any]):
        self.request = body
        self.stream = bool(body.get("stream"))
        self.model = body.get("model")
        self.chat: dict[str, Any] = {}

    def body(self) -> bytes:
        """The chat request, as it goes upstream (and is recorded)."""
        return json.dumps(self.chat, ensure_ascii=False).encode()

    def answer(self, chat: dict[str, Any]) -> dict[str, Any]:
        """A whole chat answer, as this API answers."""
        raise NotImplementedError

    def events(self) -> Events:
        """The translator of this call's stream."""
        raise NotImplementedError

    def respond(self, status: int, content: bytes, streamed: bool) -> tuple[int, bytes, str]:
        """(status, body, content type) for the client, from the upstream's whole answer (`streamed`:
        its server-sent events): an error in this API's shape, the answer, or (when the client asked
        for a stream and the upstream answered whole) the answer's events."""
        if status >= 400:
            return status, self._error(status, upstream_message(content), "upstream_error"), "application/json"
        try:
            chat = assembled(content) if streamed else json.loads(content)
        except ValueError:
            chat = None
        if not isinstance(chat, dict) or not isinstance(chat.get("choices"), list):
            message = "the upstream's answer is not a chat completion"
            return 502, self._error(502, message, "upstream_error"), "application/json"
        if self.stream:
            return status, self.events().whole(chat), "text/event-stream"
        return status, json.dumps(self.answer(chat), ensure_ascii=False).encode(), "application/json"

    def _error(self, status: int, message: str, kind: str) -> bytes:
        return json.dumps(error_body(self.dialect, status, message, kind)).encode()


class Messages(Translation):
    """Anthropic's Messages API (`POST /v1/messages`)."""

    dialect = "anthropic"

    def __init__(self, body: dict[str, Any]):
        super().__init__(body)
        messages: list[dict[str, Any]] = []
        system = body.get("system")
        if system:
            text = system if isinstance(system, str) else "\n\n".join(self._texts(system, "system"))
            messages.append({"role": "system", "content": text})
        for index, message in enumerate(_list(body.get("messages"), "messages")):
            message = _dict(message, f"messages[{index}]")
            role, what = message.get("role"), f"messages[{index}]"
            if role == "system":  # a system turn mid-conversation (Claude Code sends them)
                messages.append({"role": "system", "content": "\n\n".join(self._texts(message.get("content"), what))})
            elif role in ("user", "assistant"):
                messages += self._message(role, message.get("content"), what)
            else:
                raise InvalidRequest(f"{what}.role must be user, assistant or system, not {role!r}")
        self.chat = {"model": self.model, "messages": messages}
        _sampling(body, self.chat, "max_tokens")
        if body.get("stop_sequences"):
            self.chat["stop"] = _list(body["stop_sequences"], "stop_sequences")
        tools = [
            {
                "type": "function",
                "function": {
                    "name": tool.get("name"),
                    "description": tool.get("description") or "",
                    "parameters": tool.get("input_schema") or {"type": "object", "properties": {}},
                },
            }
            for tool in _list(body.get("tools") or [], "tools")
            # server tools (a type other than custom) are not the upstream's to run; deferred ones
            # (`defer_loading`) are not shown to the model until a tool search loads them
            if isinstance(tool, dict) and tool.get("type") in (None, "custom") and not tool.get("defer_loading")
        ]
        if tools:
            self.chat["tools"] = tools
        choice = body.get("tool_choice")
        if isinstance(choice, dict) and tools:
            kind = choice.get("type")
            if kind == "tool":
                self.chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
            elif kind in ("auto", "any", "none"):
                self.chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
            if choice.get("disable_parallel_tool_use"):
                self.chat["parallel_tool_calls"] = False

    @staticmethod
    def _texts(blocks: Any, what: str) -> list[str]:
        if isinstance(blocks, str):
            return [blocks]
        return [b.get("text") or "" for b in _list(blocks, what) if isinstance(b, dict) and b.get("type") == "text"]

    def _message(self, role: str, content: Any, what: str) -> list[dict[str, Any]]:
        """One Anthropic message as chat messages: an assistant's text and tool calls in one; a user's
        tool results first (each a `tool` message, answering the calls before them), then one user
        message with the rest (the results' images first: a `tool` message holds text only)."""
        if isinstance(content, str):
            return [{"role": role, "content": content}]
        parts: list[dict[str, Any]] = []
        calls: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        shown: list[dict[str, Any]] = []
        for index, block in enumerate(_list(content, f"{what}.content")):
            block = _dict(block, f"{what}.content[{index}]")
            kind = block.get("type")
            if kind == "text":
                parts.append({"type": "text", "text": block.get("text") or ""})
            elif kind == "image":
                parts.append(self._image(block, f"{what}.content[{index}]"))
            elif kind == "document":
                parts.append({"type": "text", "text": "[a document the model server cannot read was left out]"})
            elif kind == "tool_use" and role == "assistant":
                arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
                call = {"name": block.get("name"), "arguments": arguments}
                calls.append({"id": block.get("id"), "type": "function", "function": call})
            elif kind == "tool_result" and role == "user":
                result, images = self._result(block, f"{what}.content[{index}]")
                results.append(result)
                shown += images
            # thinking, redacted_thinking and server tools' blocks: nothing the upstream can take
        if role == "assistant":
            said: dict[str, Any] = {"role": "assistant", "content": "".join(p.get("text") or "" for p in parts) or None}
            if calls:
                said["tool_calls"] = calls
            return [said] if calls or said["content"] else []
        parts = shown + parts
        return results + ([{"role": "user", "content": _joined(parts)}] if parts else [])

    def _image(self, block: dict[str, Any], what: str) -> dict[str, Any]:
        source = _dict(block.get("source"), f"{what}.source")
        if source.get("type") == "base64":
            return _image(f"data:{source.get('media_type') or 'image/png'};base64,{source.get('data') or ''}")
        if source.get("type") == "url":
            return _image(str(source.get("url")))
        raise InvalidRequest(f"{what}.source: only base64 and url images can be forwarded")

    def _result(self, block: dict[str, Any], what: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """A tool result as its `tool` message (its text), and its images."""
        content = block.get("content")
        texts, images = [], []
        if isinstance(content, str):
            texts.append(content)
        elif content is not None:
            for index, part in enumerate(_list(content, f"{what}.content")):
                part = _dict(part, f"{what}.content[{index}]")
                if part.get("type") == "text":
                    texts.append(part.get("text") or "")
                elif part.get("type") == "image":
                    images.append(self._image(part, f"{what}.content[{index}]"))
        text = "\n".join(texts)
        if block.get("is_error"):
            text = f"Error: {text}"
        return {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text}, images

    def answer(self, chat: dict[str, Any]) -> dict[str, Any]:
        choice = first_choice(chat)
        message = _message_of(choice)
        content: list[dict[str, Any]] = []
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            content.append(
                {
                    "type": "tool_use",
                    "id": call.get("id") or _new_id("toolu_"),
                    "name": function.get("name") or "",
                    "input": _arguments(function.get("arguments") or ""),
                }
            )
        stop_reason, stop_sequence = self.stop_reason(choice, bool(message.get("tool_calls")))
        return {
            "id": _new_id("msg_"),
            "type": "message",
            "role": "assistant",
            "model": chat.get("model") or self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": _anthropic_usage(chat.get("usage")),
        }

    def stop_reason(self, choice: dict[str, Any], called: bool) -> tuple[str, str | None]:
        """Anthropic's stop reason and sequence for a chat choice's finish (vLLM's `stop_reason`
        names the stop string that ended it)."""
        finish = choice.get("finish_reason")
        if called or finish in ("tool_calls", "function_call"):
            return "tool_use", None
        if finish == "length":
            return "max_tokens", None
        if finish == "content_filter":
            return "refusal", None
        matched = choice.get("stop_reason")
        if isinstance(matched, str) and matched in (self.chat.get("stop") or []):
            return "stop_sequence", matched
        return "end_turn", None

    def events(self) -> MessageEvents:
        return MessageEvents(self)


def _anthropic_usage(usage: Any) -> dict[str, int]:
    usage = usage if isinstance(usage, dict) else {}
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {
        "input_tokens": int(usage.get("prompt_tokens") or 0) - cached,
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


class Responses(Translation):
    """OpenAI's Responses API (`POST /v1/responses`)."""

    dialect = "responses"

    def __init__(self, body: dict[str, Any]):
        super().__init__(body)
        if body.get("previous_response_id"):
            raise InvalidRequest(
                "previous_response_id is not supported: the proxy keeps no responses; "
                "send the whole conversation in input (store: false)"
            )
        self.custom: set[str] = set()
        """The (chat) names of freeform tools, whose calls go back as `custom_tool_call` items."""
        self.namespaced: dict[str, tuple[str, str]] = {}
        """The chat name of each tool of a namespace (`NAMESPACE__NAME`) -> (namespace, name)."""
        self.tools = self._tools(body.get("tools") or [], "tools")
        messages: list[dict[str, Any]] = []
        if body.get("instructions"):
            messages.append({"role": "system", "content": str(body["instructions"])})
        given = body.get("input")
        items = [{"role": "user", "content": given}] if isinstance(given, str) else _list(given or [], "input")
        self._shown: list[dict[str, Any]] = []
        """The images of the tool outputs just read: a user message once they end (a `tool`
        message holds text only, and tool messages must follow their calls)."""
        for index, item in enumerate(items):
            self._item(messages, _dict(item, f"input[{index}]"), f"input[{index}]")
        self._show(messages)
        self.chat = {"model": self.model, "messages": messages}
        _sampling(body, self.chat, "max_output_tokens")
        if self.tools:
            self.chat["tools"] = self.tools
            choice = body.get("tool_choice")
            if choice in ("auto", "none", "required"):
                self.chat["tool_choice"] = choice
            elif isinstance(choice, dict) and choice.get("type") in ("function", "custom") and choice.get("name"):
                self.chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
            if isinstance(body.get("parallel_tool_calls"), bool):
                self.chat["parallel_tool_calls"] = body["parallel_tool_calls"]

    def _tools(self, tools: Any, what: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Function and freeform tools as chat function tools; a namespace's tools each named
        `NAMESPACE__NAME`; other types (web_search, file_search, local_shell, tool_search,
        image_generation, mcp ...) dropped: they are not the upstream's to run."""
        out = []
        for index, tool in enumerate(_list(tools, what)):
            tool = _dict(tool, f"{what}[{index}]")
            kind, name = tool.get("type"), str(tool.get("name"))
            if kind == "namespace":
                out += self._tools(tool.get("tools") or [], f"{what}[{index}].tools", name)
                continue
            if kind not in ("function", "custom"):
                continue
            flat = f"{namespace}__{name}" if namespace else name
            if namespace:
                self.namespaced[flat] = (namespace, name)
            if kind == "custom":
                self.custom.add(flat)
                function = _freeform(tool)
            else:
                function = {"name": name, "description": tool.get("description") or ""}
                function["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
            out.append({"type": "function", "function": {**function, "name": flat}})
        return out

    def _show(self, messages: list[dict[str, Any]]) -> None:
        if self._shown:
            messages.append({"role": "user", "content": self._shown})
            self._shown = []

    def _item(self, messages: list[dict[str, Any]], item: dict[str, Any], what: str) -> None:
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind not in ("function_call_output", "custom_tool_call_output", "reasoning"):
            self._show(messages)
        if kind == "message":
            role = "system" if item.get("role") == "developer" else item.get("role")
            if role not in ("user", "assistant", "system"):
                raise InvalidRequest(f"{what}.role must be user, assistant, system or developer")
            content = self._content(item.get("content"), f"{what}.content")
            if role == "assistant":
                content = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
            messages.append({"role": role, "content": content})
        elif kind in ("function_call", "custom_tool_call"):
            arguments = item.get("arguments") if kind == "function_call" else _dumps({"input": item.get("input")})
            name = f"{item['namespace']}__{item.get('name')}" if item.get("namespace") else item.get("name")
            call = {"name": name, "arguments": arguments if isinstance(arguments, str) else "{}"}
            said = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
            if said is None:
                said = {"role": "assistant", "content": None}
                messages.append(said)
            said.setdefault("tool_calls", []).append({"id": item.get("call_id"), "type": "function", "function": call})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            if not isinstance(output, str):
                parts = self._content(output if output is not None else "", f"{what}.output")
                if isinstance(parts, list):
                    self._shown += [p for p in parts if p["type"] != "text"]
                    parts = "\n".join(p["text"] for p in parts if p["type"] == "text")
                output = parts
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
        elif kind == "additional_tools":  # tools declared within the input: tools all the same
            self.tools += self._tools(item.get("tools") or [], f"{what}.tools")
        # reasoning, web_search_call, item_reference, ...: nothing the upstream can take

    def _content(self, content: Any, what: str) -> str | list[dict[str, Any]]:
        if isinstance(content, str):
            return content
        parts: list[dict[str, Any]] = []
        for index, part in enumerate(_list(content, what)):
            part = _dict(part, f"{what}[{index}]")
            kind = part.get("type")
            if kind in ("input_text", "output_text", "text"):
                parts.append({"type": "text", "text": part.get("text") or ""})
            elif kind == "refusal":
                parts.append({"type": "text", "text": part.get("refusal") or ""})
            elif kind == "input_image":
                if not part.get("image_url"):
                    raise InvalidRequest(f"{what}[{index}]: send images as image_url (file ids are not kept here)")
                parts.append(_image(str(part["image_url"]), part.get("detail")))
            elif kind == "input_file":
                raise InvalidRequest(f"{what}[{index}]: input_file cannot be forwarded to a chat model")
        return _joined(parts)

    def _output(self, chat: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """A chat answer's output items, and the response's status fields."""
        choice = first_choice(chat)
        message = _message_of(choice)
        output = []
        if message.get("content"):
            output.append(_message_item(_new_id("msg_"), message["content"], "completed"))
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            output.append(self.call_item(function.get("name") or "", call.get("id"), function.get("arguments") or ""))
        return output, _status(choice.get("finish_reason"))

    def call_item(self, name: str, call_id: str | None, arguments: str, item_id: str | None = None) -> dict[str, Any]:
        """A finished chat tool call (`name`: its chat name) as its output item: a `custom_tool_call`
        for a freeform tool, with its `namespace` for a namespace's."""
        base: dict[str, Any] = {"id": item_id or _new_id("fc_"), "status": "completed"}
        base["call_id"] = call_id or _new_id("call_")
        namespace, short = self.namespaced.get(name, (None, name))
        if namespace is not None:
            base["namespace"] = namespace
        if name in self.custom:
            value = _arguments(arguments).get("input")
            return {**base, "type": "custom_tool_call", "name": short, "input": value if isinstance(value, str) else ""}
        return {**base, "type": "function_call", "name": short, "arguments": arguments}

    def response(self, response_id: str, created: int, output: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        """The `response` object: the request's settings echoed, `fields` (status, usage ...) given."""
        body = self.request
        return {
            "id": response_id,
            "object": "response",
            "created_at": created,
            "status": "in_progress",
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": self.model,
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "reasoning": body.get("reasoning"),
            "store": body.get("store", False),
            "temperature": body.get("temperature"),
            "text": body.get("text") or {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p"),
            "truncation": "disabled",
            "usage": None,
            "metadata": body.get("metadata") or {},
            **fields,
        }

    def answer(self, chat: dict[str, Any]) -> dict[str, Any]:
        output, status = self._output(chat)
        created = int(chat.get("created") or time.time())
        return self.response(_new_id("resp_"), created, output, **status, usage=_responses_usage(chat.get("usage")))

    def events(self) -> ResponseEvents:
        return ResponseEvents(self)


def _freeform(tool: dict[str, Any]) -> dict[str, Any]:
    """A freeform (`custom`) tool as a function of one string argument, `input`, its grammar told."""
    described = "The tool's whole input, as free text."
    form = tool.get("format")
    if isinstance(form, dict) and form.get("type") == "grammar" and form.get("definition"):
        described += f" It must follow this {form.get('syntax') or ''} grammar:\n{form['definition']}"
    parameters = {
        "type": "object",
        "properties": {"input": {"type": "string", "description": described}},
        "required": ["input"],
        "additionalProperties": False,
    }
    return {"name": tool.get("name"), "description": tool.get("description") or "", "parameters": parameters}


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": [part]}


def _status(finish: Any) -> dict[str, Any]:
    if finish in ("length", "content_filter"):
        reason = "max_output_tokens" if finish == "length" else "content_filter"
        return {"status": "incomplete", "incomplete_details": {"reason": reason}}
    return {"status": "completed"}


def _responses_usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        },
        "output_tokens": completion,
        "output_tokens_details": {
            "reasoning_tokens": int((usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)
        },
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
    }


# -- streams --------------------------------------------------------------------------------------


class Events:
    """A stream's translator: the upstream's chat server-sent events in, as bytes split anywhere,
    the API's events out (`event: NAME\\ndata: JSON\\n\\n`). The final events go out at `[DONE]`; an
    error event of the upstream's, or `fail`, ends the stream with the API's error event instead.
    After either, nothing more goes out."""

    def __init__(self) -> None:
        self._rest = b""
        self.ended = False
        self.failed = False

    def feed(self, data: bytes) -> bytes:
        """The events for what the upstream sent next."""
        if self.ended or self.failed:
            return b""
        pieces = EVENT_END.split(self._rest + data)
        self._rest = pieces.pop()
        if self._rest.strip() == b"data: [DONE]":  # a last event without its blank line
            pieces.append(self._rest)
            self._rest = b""
        out: list[tuple[str, dict[str, Any]]] = []
        for piece in pieces:
            lines = piece.decode("utf-8", "replace").splitlines()
            payload = "\n".join(line[5:].lstrip() for line in lines if line.startswith("data:"))
            if payload == "[DONE]":
                out += self._done()
                self.ended = True
                break
            try:
                chunk = json.loads(payload) if payload else None
            except ValueError:
                continue
            if not isinstance(chunk, dict):
                continue
            if chunk.get("error") is not None:
                out += self._failure(upstream_message(payload.encode()) or "the upstream sent an error")
                self.failed = True
                break
            out += self._chunk(chunk)
        return self._written(out)

    def fail(self, message: str) -> bytes:
        """The API's error event for a stream that broke (nothing after its end or an earlier error)."""
        if self.ended or self.failed:
            return b""
        self.failed = True
        return self._written(self._failure(message))

    def whole(self, answer: dict[str, Any]) -> bytes:
        """The events of a whole chat answer (for a client that asked for a stream and got one piece)."""
        out: list[tuple[str, dict[str, Any]]] = []
        for chunk in chunks_of(answer):
            out += self._chunk(chunk)
        out += self._done()
        self.ended = True
        return self._written(out)

    def _written(self, events: list[tuple[str, dict[str, Any]]]) -> bytes:
        return "".join(f"event: {name}\ndata: {_dumps(data)}\n\n" for name, data in events).encode()

    def _chunk(self, chunk: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        raise NotImplementedError

    def _done(self) -> list[tuple[str, dict[str, Any]]]:
        raise NotImplementedError

    def _failure(self, message: str) -> list[tuple[str, dict[str, Any]]]:
        raise NotImplementedError


class _Call:
    """A tool call being streamed: what its deltas brought so far."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.name = ""
        self.arguments: list[str] = []
        self.index: int | None = None
        """Its block (Anthropic) or output item (Responses) once started."""
        self.item_id = _new_id("fc_")

    def take(self, delta: dict[str, Any]) -> str:
        """Merge a delta; the arguments it brought."""
        self.id = self.id or delta.get("id")
        function = delta.get("function") or {}
        self.name = self.name or function.get("name") or ""
        piece = function.get("arguments") or ""
        self.arguments.append(piece)
        return piece


class MessageEvents(Events):
    """Chat chunks as Anthropic's stream: one block open at a time, text or tool use."""

    def __init__(self, translation: Messages):
        super().__init__()
        self.translation = translation
        self.started = False
        self.blocks = 0
        self.open: int | None = None
        """The index of the block open now."""
        self.calls: dict[int, _Call] = {}
        self.text_block: int | None = None
        self.finish: dict[str, Any] = {}
        self.usage: Any = None
        self.id = _new_id("msg_")

    def _start(self, chunk: dict[str, Any] | None = None) -> list[tuple[str, dict[str, Any]]]:
        if self.started:
            return []
        self.started = True
        model = (chunk or {}).get("model") or self.translation.model
        message: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return [("message_start", {"type": "message_start", "message": message}), ("ping", {"type": "ping"})]

    def _block(self, block: dict[str, Any]) -> tuple[int, list[tuple[str, dict[str, Any]]]]:
        """Close the open block, start `block`: its index and the events."""
        out = self._close()
        index, self.blocks = self.blocks, self.blocks + 1
        self.open = index
        out.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}))
        return index, out

    def _close(self) -> list[tuple[str, dict[str, Any]]]:
        if self.open is None:
            return []
        index, self.open = self.open, None
        if index == self.text_block:
            self.text_block = None
        return [("content_block_stop", {"type": "content_block_stop", "index": index})]

    def _delta(self, index: int, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}

    def _chunk(self, chunk: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        out = self._start(chunk)
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or int(choice.get("index") or 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                if self.text_block is None or self.open != self.text_block:
                    self.text_block, started = self._block({"type": "text", "text": ""})
                    out += started
                out.append(self._delta(self.text_block, {"type": "text_delta", "text": text}))
            for position, piece in enumerate(delta.get("tool_calls") or []):
                call = self.calls.setdefault(int(piece.get("index", position)), _Call())
                arguments = call.take(piece)
                if call.index is None and call.name:
                    call.index, started = self._block(self._tool_block(call))
                    out += started
                    arguments = "".join(call.arguments)
                if call.index is not None and arguments:
                    out.append(self._delta(call.index, {"type": "input_json_delta", "partial_json": arguments}))
            if choice.get("finish_reason"):
                self.finish = choice
        return out

    def _tool_block(self, call: _Call) -> dict[str, Any]:
        return {"type": "tool_use", "id": call.id or _new_id("toolu_"), "name": call.name, "input": {}}

    def _done(self) -> list[tuple[str, dict[str, Any]]]:
        out = self._start()
        for call in self.calls.values():  # a call whose name never came: started now, all it brought
            if call.index is None:
                call.index, started = self._block(self._tool_block(call))
                arguments = "".join(call.arguments)
                out += started + (
                    [self._delta(call.index, {"type": "input_json_delta", "partial_json": arguments})]
                    if arguments
                    else []
                )
        out += self._close()
        stop_reason, stop_sequence = self.translation.stop_reason(self.finish, bool(self.calls))
        usage = _anthropic_usage(self.usage)
        delta = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        out.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
        out.append(("message_stop", {"type": "message_stop"}))
        return out

    def _failure(self, message: str) -> list[tuple[str, dict[str, Any]]]:
        return [("error", {"type": "error", "error": {"type": "api_error", "message": message}})]


class ResponseEvents(Events):
    """Chat chunks as a Responses stream: a message item for the text, an item per tool call, all
    finished at `[DONE]` in their order, then `response.completed` with the whole response."""

    def __init__(self, translation: Responses):
        super().__init__()
        self.translation = translation
        self.sequence = 0
        self.id = _new_id("resp_")
        self.created = int(time.time())
        self.started = False
        self.items: list[dict[str, Any]] = []
        """The output items: for a message, its text pieces under `pieces` until it is finished."""
        self.text: dict[str, Any] | None = None
        """The message item text goes to now."""
        self.text_index = 0
        self.calls: dict[int, _Call] = {}
        self.finish: Any = None
        self.usage: Any = None

    def _event(self, kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return kind, event

    def _response(self, output: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        return self.translation.response(self.id, self.created, output, **fields)

    def _start(self) -> list[tuple[str, dict[str, Any]]]:
        if self.started:
            return []
        self.started = True
        return [
            self._event("response.created", response=self._response([])),
            self._event("response.in_progress", response=self._response([])),
        ]

    def _chunk(self, chunk: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        out = self._start()
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or int(choice.get("index") or 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content")
            if isinstance(text, str) and text:
                out += self._text(text)
            for position, piece in enumerate(delta.get("tool_calls") or []):
                call = self.calls.setdefault(int(piece.get("index", position)), _Call())
                arguments = call.take(piece)
                if call.index is None and call.name:
                    out += self._added(call)
                    arguments = "".join(call.arguments)
                if call.index is not None and arguments and call.name not in self.translation.custom:
                    item_id, index = call.item_id, call.index
                    out.append(
                        self._event(
                            "response.function_call_arguments.delta",
                            item_id=item_id,
                            output_index=index,
                            delta=arguments,
                        )
                    )
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return out

    def _text(self, text: str) -> list[tuple[str, dict[str, Any]]]:
        out = []
        if self.text is None:
            self.text = {**_message_item(_new_id("msg_"), "", "in_progress"), "pieces": []}
            index = self.text_index = len(self.items)
            self.items.append(self.text)
            item = {key: value for key, value in self.text.items() if key != "pieces"}
            out.append(self._event("response.output_item.added", output_index=index, item={**item, "content": []}))
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            ids = {"item_id": self.text["id"], "output_index": index, "content_index": 0}
            out.append(self._event("response.content_part.added", **ids, part=part))
        self.text["pieces"].append(text)
        ids = {"item_id": self.text["id"], "output_index": self.text_index, "content_index": 0}
        out.append(self._event("response.output_text.delta", **ids, delta=text, logprobs=[]))
        return out

    def _added(self, call: _Call) -> list[tuple[str, dict[str, Any]]]:
        self.text = None  # text after a tool call goes into a new message item
        call.index = len(self.items)
        item = self.translation.call_item(call.name, call.id, "", call.item_id)
        item["status"] = "in_progress"
        self.items.append({"call": call})
        return [self._event("response.output_item.added", output_index=call.index, item=item)]

    def _done(self) -> list[tuple[str, dict[str, Any]]]:
        out = self._start()
        for call in self.calls.values():
            if call.index is None:
                out += self._added(call)
        output = []
        for index, item in enumerate(self.items):
            if "call" in item:
                call = item["call"]
                arguments = "".join(call.arguments)
                done = self.translation.call_item(call.name, call.id, arguments, call.item_id)
                if done["type"] == "custom_tool_call":
                    ids = {"item_id": call.item_id, "output_index": index}
                    out.append(self._event("response.custom_tool_call_input.delta", **ids, delta=done["input"]))
                    out.append(self._event("response.custom_tool_call_input.done", **ids, input=done["input"]))
                else:
                    ids = {"item_id": call.item_id, "output_index": index}
                    out.append(
                        self._event(
                            "response.function_call_arguments.done", **ids, name=done["name"], arguments=arguments
                        )
                    )
            else:
                text = "".join(item.pop("pieces"))
                done = _message_item(item["id"], text, "completed")
                part = done["content"][0]
                ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
                out.append(self._event("response.output_text.done", **ids, text=text, logprobs=[]))
                out.append(self._event("response.content_part.done", **ids, part=part))
            out.append(self._event("response.output_item.done", output_index=index, item=done))
            output.append(done)
        status = _status(self.finish)
        final = self._response(output, **status, usage=_responses_usage(self.usage))
        kind = "response.completed" if status["status"] == "completed" else "response.incomplete"
        out.append(self._event(kind, response=final))
        return out

    def _failure(self, message: str) -> list[tuple[str, dict[str, Any]]]:
        failed = self._response([], status="failed", error={"code": "server_error", "message": message})
        return [*self._start(), self._event("response.failed", response=failed)]
