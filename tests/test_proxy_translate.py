"""`orchard proxy` speaking Anthropic's Messages API and OpenAI's Responses API to their official
clients (`anthropic`, `openai`), over the real chat upstream of tests/test_proxy.py on loopback: each
call is translated into a chat call, forwarded, answered in the client's API (streams event by event,
assembled by the SDK's own stream parser), and recorded as the chat call it became."""

# ruff: noqa: F811 (the fixtures imported from test_proxy are the tests' arguments)
from __future__ import annotations

import json
import random
import threading
from typing import Any

import anthropic
import httpx
import openai
import pytest
from test_proxy import (  # noqa: F401 (fixtures: a store, an echoing upstream, the proxy)
    KEY,
    MODEL,
    Reply,
    bash_call,
    calls_of,
    pieces_of,
    proxy,
    store,
    token_of,
    trajectories_of,
    upstream,
    upstream_serving,
)

from orchard.proxy import translate
from orchard.proxy.server import Proxy

BASH = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
CHAT_BASH = {"type": "function", "function": {"name": "bash", "description": "Run a command", "parameters": BASH}}
"""The chat tool both APIs' `bash` tool becomes."""
ANTHROPIC_TOOLS = [
    {"name": "bash", "description": "Run a command", "input_schema": BASH, "cache_control": {"type": "ephemeral"}},
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 1},  # a server tool: not the upstream's
    {"name": "Deferred", "description": "loaded by a tool search", "input_schema": BASH, "defer_loading": True},
]
RESPONSES_TOOLS = [
    {"type": "function", "name": "bash", "description": "Run a command", "parameters": BASH, "strict": False},
    {"type": "web_search"},
]
IMAGE = "iVBORw0KGgo="
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch\n"


def claude(proxy: Proxy, key: str = KEY) -> anthropic.Anthropic:
    """Anthropic's client, as Claude Code points it: the base URL without `/v1`, tagged run and sandbox."""
    return anthropic.Anthropic(base_url=proxy.tagged("claude", "box-1").removesuffix("/v1"), api_key=key, max_retries=0)


def codex(proxy: Proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.tagged("codex", "box-2"), api_key=KEY, max_retries=0)


def events_of(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each server-sent event."""
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = block.split("\n")
        names = [line[6:].strip() for line in lines if line.startswith("event:")]
        data = "\n".join(line[5:].strip() for line in lines if line.startswith("data:"))
        if names and data:
            out.append((names[0], json.loads(data)))
    return out


def chat_bytes(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\r\n\r\n".encode() for c in chunks) + b"data: [DONE]\r\n\r\n"


# -- Anthropic's Messages API --------------------------------------------------------------------


def test_a_messages_call_goes_upstream_as_its_chat_call_and_is_recorded_as_one(upstream, proxy, store):
    """System blocks, content blocks (an image, a thinking block dropped), sampling options: the
    upstream gets the chat request they mean, the client an Anthropic message, and the record holds
    the chat call, tagged by the path, with the upstream's token ids and log-probs."""
    answer = claude(proxy).messages.create(
        model=MODEL,
        max_tokens=64,
        system=[
            {"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "and kind"},
        ],
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": IMAGE}},
                    {"type": "text", "text": "look"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "text", "text": "I see"},
                ],
            },
            {"role": "user", "content": [{"type": "text", "text": "hello"}]},
        ],
        extra_body={"temperature": 0.2, "top_p": 0.9},  # older clients send them; this SDK has no such arguments
        stop_sequences=["END"],
        metadata={"user_id": "someone"},
    )
    assert answer.type == "message" and answer.role == "assistant" and answer.id.startswith("msg_")
    assert [(b.type, b.text) for b in answer.content] == [("text", "turn 1: you said hello")]
    assert (answer.stop_reason, answer.stop_sequence, answer.model) == ("end_turn", None, MODEL)
    assert (answer.usage.input_tokens, answer.usage.output_tokens) == (40, len(pieces_of("turn 1: you said hello")))
    chat = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "be brief\n\nand kind"},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{IMAGE}"}},
                    {"type": "text", "text": "look"},
                ],
            },
            {"role": "assistant", "content": "I see"},
            {"role": "user", "content": "hello"},
        ],
        "max_tokens": 64,
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": ["END"],
    }
    ((method, path, headers, body),) = upstream.requests
    assert (method, path, body) == ("POST", "/v1/chat/completions", chat)  # no `?beta=true`, nothing else
    assert "x-api-key" not in headers and "authorization" not in headers
    proxy.flush()
    (call,) = calls_of(store, "proxy-claude")
    assert (call.path, call.sandbox, call.status, call.stream, call.model) == (
        "/v1/chat/completions",
        "box-1",
        "ok",
        False,
        MODEL,
    )
    assert json.loads(call.request) == chat
    assert json.loads(call.answer)["choices"][0]["message"]["content"] == "turn 1: you said hello"
    tokens = [token_of(i) for i in range(len(pieces_of("turn 1: you said hello")))]
    assert json.loads(call.token_ids) == {"prompt": [1, 2, 3], "completion": tokens}
    assert [e["token"] for e in json.loads(call.logprobs)["content"]] == [f"token_id:{t}" for t in tokens]


def test_claude_style_tool_use_and_tool_results_make_one_trajectory_streamed_or_not(upstream, proxy, store):
    """tool_use / tool_result round trips, the second streamed (the SDK's stream parser assembles the
    message), the third with an error result: the upstream gets tool calls and `tool` messages, the
    client tool_use blocks, and the three calls are one trajectory of three steps."""
    client = claude(proxy)
    choice = {"type": "any", "disable_parallel_tool_use": True}
    ask: dict[str, Any] = {"model": MODEL, "max_tokens": 256, "tools": ANTHROPIC_TOOLS, "tool_choice": choice}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "tool please"}]
    first = client.messages.create(**ask, messages=messages)
    assert first.stop_reason == "tool_use"
    assert [b.model_dump(include={"type", "text", "id", "name", "input"}) for b in first.content] == [
        {"type": "text", "text": "turn 0: running it"},
        {"type": "tool_use", "id": "call-0", "name": "bash", "input": {"command": "echo 0"}},
    ]
    messages += [
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call-0", "content": [{"type": "text", "text": "OBSERVED 0"}]}
            ],
        },
    ]
    with client.messages.stream(**ask, messages=messages) as stream:
        text = "".join(stream.text_stream)
        second = stream.get_final_message()
    assert text == "turn 1: running it" and second.stop_reason == "tool_use"
    assert [(b.type, getattr(b, "input", None)) for b in second.content] == [
        ("text", None),
        ("tool_use", {"command": "echo 1"}),
    ]
    assert second.content[1].id == "call-1" and second.usage.output_tokens == len(pieces_of(text))
    messages += [
        {"role": "assistant", "content": second.content},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call-1", "content": "boom", "is_error": True},
                {"type": "text", "text": "done?"},
            ],
        },
    ]
    third = client.messages.create(**ask, messages=messages)
    assert [b.text for b in third.content] == ["turn 2: you said done?"] and third.stop_reason == "end_turn"
    first_chat, second_chat, third_chat = upstream.chats()
    assert first_chat["tools"] == [CHAT_BASH]  # no server tool, no deferred one
    assert (first_chat["tool_choice"], first_chat["parallel_tool_calls"]) == ("required", False)
    assert second_chat["stream"] is True and second_chat["stream_options"] == {"include_usage": True}
    assert second_chat["messages"][1:] == [
        {"role": "assistant", "content": "turn 0: running it", "tool_calls": [bash_call("call-0", "echo 0")]},
        {"role": "tool", "tool_call_id": "call-0", "content": "OBSERVED 0"},
    ]
    assert third_chat["messages"][-2:] == [
        {"role": "tool", "tool_call_id": "call-1", "content": "Error: boom"},
        {"role": "user", "content": "done?"},
    ]
    proxy.flush()
    ((trajectory, steps),) = trajectories_of(store, "proxy-claude")
    assert trajectory.instance_id == "box-1" and json.loads(trajectory.tools) == [CHAT_BASH]
    assert [s.reply for s in steps] == ["turn 0: running it", "turn 1: running it", "turn 2: you said done?"]
    assert [s.observation for s in steps] == ["OBSERVED 0", "Error: boom\ndone?", ""]
    assert json.loads(steps[1].actions) == [{"name": "bash", "arguments": {"command": "echo 1"}}]
    assert [c.stream for c in calls_of(store, "proxy-claude")] == [False, True, False]


def test_a_messages_stream_is_anthropics_event_sequence_relayed_as_it_arrives(store):
    """The upstream holds its last chunks until the client has seen three text deltas: they come
    through before the upstream finished, and the whole stream is Anthropic's events in order, each
    named as its type, the tool's arguments as `input_json_delta` pieces."""
    hold = threading.Event()
    with (
        upstream_serving(lambda body: Reply("one two three four five six", [bash_call("c1", "ls")]), hold=hold) as up,
        Proxy(up.url, port=0, store=store, key=KEY) as proxy,
    ):
        ask = {"model": MODEL, "max_tokens": 100, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        seen = ""
        with (
            httpx.Client(timeout=httpx.Timeout(5.0), headers={"x-api-key": KEY}) as http,
            http.stream("POST", proxy.url + "/messages", json={**ask, "tools": ANTHROPIC_TOOLS[:1]}) as answer,
        ):
            assert answer.headers["content-type"].startswith("text/event-stream")
            for chunk in answer.iter_text():
                seen += chunk
                if seen.count("text_delta") >= 3 and not hold.is_set():
                    assert up.finished_streams == 0
                    hold.set()
    events = events_of(seen)
    assert all(name == data["type"] for name, data in events)
    names = [name for name, _ in events]
    texts = len(pieces_of("one two three four five six"))
    assert names == [
        "message_start",
        "ping",
        "content_block_start",
        *["content_block_delta"] * texts,
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert (start["role"], start["content"], start["stop_reason"], start["model"]) == ("assistant", [], None, MODEL)
    assert events[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta" and d["index"] == 0)
    assert text == "one two three four five six"
    tool = events[4 + texts][1]
    assert tool["index"] == 1 and tool["content_block"] == {"type": "tool_use", "id": "c1", "name": "bash", "input": {}}
    arguments = "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta" and d["index"] == 1)
    assert json.loads(arguments) == {"command": "ls"}
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2][1]["usage"]["output_tokens"] == texts


def test_count_tokens_is_an_estimate_made_without_the_upstream(upstream, proxy):
    system = "be brief"
    messages = [{"role": "user", "content": "hello there, how many tokens is this?"}]
    counted = claude(proxy).messages.count_tokens(
        model=MODEL, system=system, messages=messages, tools=ANTHROPIC_TOOLS[:1]
    )
    characters = sum(len(json.dumps(part, ensure_ascii=False)) for part in (system, messages, ANTHROPIC_TOOLS[:1]))
    assert counted.input_tokens == characters // 4 > 0
    longer = claude(proxy).messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "word " * 400}])
    assert longer.input_tokens > 400
    assert upstream.requests == []


def test_messages_errors_reach_the_client_as_anthropic_errors_and_fail_in_the_record(store):
    """An upstream error status, a stream cut before its `[DONE]`, a stream carrying an error event,
    a wrong key, a malformed request: each is an error in Anthropic's shape (in a stream, an `error`
    event the SDK raises), and each call that went upstream is recorded failed."""

    def script(body: dict[str, Any]) -> Reply:
        said = body["messages"][-1]["content"]
        return Reply(status=503) if said == "fail" else Reply("half an answer", stream_end=said)

    with upstream_serving(script) as up, Proxy(up.url, port=0, store=store, key=KEY) as proxy:
        client = claude(proxy)
        ask = {"model": MODEL, "max_tokens": 50}
        with pytest.raises(anthropic.InternalServerError) as refused:
            client.messages.create(**ask, messages=[{"role": "user", "content": "fail"}])
        assert refused.value.status_code == 503
        assert refused.value.body == {
            "type": "error",
            "error": {"type": "overloaded_error", "message": "scripted failure 503"},
        }
        for end, told in (("cut", "the upstream's stream ended before its [DONE]"), ("error", "the engine died")):
            with (
                pytest.raises(anthropic.APIStatusError, match="api_error") as broke,
                client.messages.stream(**ask, messages=[{"role": "user", "content": end}]) as stream,
            ):
                list(stream)
            assert broke.value.body == {"type": "error", "error": {"type": "api_error", "message": told}}
        with pytest.raises(anthropic.AuthenticationError) as unknown:
            claude(proxy, key="sk-wrong").messages.create(**ask, messages=[{"role": "user", "content": "hi"}])
        assert unknown.value.body["error"]["type"] == "authentication_error"
        bad = httpx.post(proxy.url + "/messages", json={"model": MODEL, "messages": "hi"}, headers={"x-api-key": KEY})
        assert bad.status_code == 400
        assert bad.json() == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "messages must be a list"},
        }
        with client.messages.stream(**ask, messages=[{"role": "user", "content": "done"}]) as stream:
            assert stream.get_final_message().content[0].text == "half an answer"
        proxy.flush()
    calls = calls_of(store, "proxy-claude")
    assert [(c.status, c.http_status, c.path) for c in calls] == [
        ("failed", 503, "/v1/chat/completions"),
        ("failed", 200, "/v1/chat/completions"),
        ("failed", 200, "/v1/chat/completions"),
        ("ok", 200, "/v1/chat/completions"),
    ]
    assert [c.error for c in calls] == [
        "the upstream answered HTTP 503",
        "the upstream's stream ended before its [DONE]",
        "the upstream sent an error in its stream",
        None,
    ]


# -- OpenAI's Responses API ----------------------------------------------------------------------


def test_codex_style_function_calls_round_trip_and_make_one_trajectory(upstream, proxy, store):
    """instructions, developer and user messages, function tools (a web_search tool dropped), a
    function_call and its output sent back (a reasoning item dropped), the second call streamed and
    put together by the SDK's stream parser: the upstream gets the chat requests they mean, and the
    calls are one trajectory."""
    client = codex(proxy)
    ask: dict[str, Any] = {
        "model": MODEL,
        "instructions": "be brief",
        "tools": RESPONSES_TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"effort": "low"},
    }
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "use tools"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "tool please"}]},
    ]
    first = client.responses.create(**ask, input=items, max_output_tokens=50, temperature=0.1)
    assert first.status == "completed" and first.id.startswith("resp_")
    message, call = first.output
    assert message.type == "message" and [part.text for part in message.content] == ["turn 0: running it"]
    assert (call.type, call.call_id, call.name, json.loads(call.arguments)) == (
        "function_call",
        "call-0",
        "bash",
        {"command": "echo 0"},
    )
    assert first.output_text == "turn 0: running it"
    assert (first.usage.input_tokens, first.usage.output_tokens, first.usage.total_tokens) == (30, 5, 35)
    assert upstream.chats()[0] == {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "system", "content": "use tools"},
            {"role": "user", "content": "tool please"},
        ],
        "max_tokens": 50,
        "temperature": 0.1,
        "tools": [CHAT_BASH],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
    }
    items += [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "opaque"},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": "call-0", "output": "OBSERVED 0"},
    ]
    with client.responses.stream(**ask, input=items) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        second = stream.get_final_response()
    assert "".join(deltas) == "turn 1: running it" == second.output_text
    assert [item.type for item in second.output] == ["message", "function_call"]
    assert json.loads(second.output[1].arguments) == {"command": "echo 1"} and second.output[1].call_id == "call-1"
    assert second.usage is not None and second.usage.output_tokens == 5
    assert upstream.chats()[1]["messages"][3:] == [
        {"role": "assistant", "content": "turn 0: running it", "tool_calls": [bash_call("call-0", "echo 0")]},
        {"role": "tool", "tool_call_id": "call-0", "content": "OBSERVED 0"},
    ]
    items += [
        *[item.model_dump(exclude_none=True) for item in second.output],
        {"type": "function_call_output", "call_id": "call-1", "output": [{"type": "input_text", "text": "OBSERVED 1"}]},
        {"role": "user", "content": "done?"},
    ]
    third = client.responses.create(**ask, input=items)
    assert third.output_text == "turn 2: you said done?" and [item.type for item in third.output] == ["message"]
    proxy.flush()
    ((trajectory, steps),) = trajectories_of(store, "proxy-codex")
    assert trajectory.instance_id == "box-2" and trajectory.steps == 3
    assert [s.observation for s in steps] == ["OBSERVED 0", "OBSERVED 1\ndone?", ""]
    assert [c.path for c in calls_of(store, "proxy-codex")] == ["/v1/chat/completions"] * 3


def test_a_responses_stream_is_its_event_sequence_with_sequence_numbers(upstream, proxy):
    events = list(
        codex(proxy).responses.create(model=MODEL, input="tool please", tools=RESPONSES_TOOLS[:1], stream=True)
    )
    assert [e.sequence_number for e in events] == list(range(len(events)))
    texts = len(pieces_of("turn 0: running it"))
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * texts,
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    message, call = events[-1].response.output
    assert events[2].item.id == message.id and events[4].item_id == message.id  # one item, one id throughout
    assert events[4 + texts].item.id == call.id and events[-2].item == call
    assert (call.name, call.call_id, json.loads(call.arguments)) == ("bash", "call-0", {"command": "echo 0"})
    assert events[-1].response.status == "completed" and events[-1].response.usage.total_tokens == 15
    lifecycle = {"response.created", "response.in_progress", "response.completed"}
    assert {e.response.id for e in events if e.type in lifecycle} == {events[0].response.id}


def test_freeform_and_namespace_tools_become_function_tools_and_come_back_as_theirs(store):
    """Codex's freeform `apply_patch` (a `custom` tool with a grammar) is a function of one string,
    `input`, upstream, and its call a `custom_tool_call` again; a namespace's tool is
    `NAMESPACE__NAME` upstream and a function_call with its `namespace` again; both round trip."""

    def script(body: dict[str, Any]) -> Reply:
        said = [m for m in body["messages"] if m["role"] == "tool"]
        if not said:
            patch = {"name": "apply_patch", "arguments": json.dumps({"input": PATCH})}
            return Reply("patching", [{"id": "call-p", "type": "function", "function": patch}])
        if len(said) == 1:
            spawn = {"name": "agents__spawn", "arguments": '{"task": "look"}'}
            return Reply("", [{"id": "call-s", "type": "function", "function": spawn}])
        return Reply("all done")

    tools = [
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "Edit files.",
            "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch hunk+ end_patch"},
        },
        {
            "type": "namespace",
            "name": "agents",
            "description": "Sub-agents.",
            "tools": [{"type": "function", "name": "spawn", "parameters": {"type": "object", "properties": {}}}],
        },
    ]
    with upstream_serving(script) as up, Proxy(up.url, port=0, store=store, key=KEY) as proxy:
        client = openai.OpenAI(base_url=proxy.url, api_key=KEY, max_retries=0)
        items: list[Any] = [{"role": "user", "content": "patch it"}]
        first = client.responses.create(model=MODEL, input=items, tools=tools)
        (_, patch) = first.output
        assert (patch.type, patch.name, patch.call_id, patch.input) == (
            "custom_tool_call",
            "apply_patch",
            "call-p",
            PATCH,
        )
        items += [item.model_dump(exclude_none=True) for item in first.output]
        items.append({"type": "custom_tool_call_output", "call_id": "call-p", "output": "Success."})
        second = client.responses.create(model=MODEL, input=items, tools=tools)
        (spawn,) = second.output
        assert (spawn.type, spawn.namespace, spawn.name, spawn.arguments) == (
            "function_call",
            "agents",
            "spawn",
            '{"task": "look"}',
        )
        items += [
            spawn.model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": "call-s", "output": "ok"},
        ]
        assert client.responses.create(model=MODEL, input=items, tools=tools).output_text == "all done"
    first_chat, _, last_chat = up.chats()
    apply_patch, spawn_tool = first_chat["tools"]
    assert apply_patch["function"]["name"] == "apply_patch" and spawn_tool["function"]["name"] == "agents__spawn"
    parameters = apply_patch["function"]["parameters"]
    assert parameters["required"] == ["input"] and parameters["properties"]["input"]["type"] == "string"
    assert "start: begin_patch hunk+ end_patch" in parameters["properties"]["input"]["description"]
    assert last_chat["messages"][1:] == [
        {
            "role": "assistant",
            "content": "patching",
            "tool_calls": [
                {
                    "id": "call-p",
                    "type": "function",
                    "function": {
                        "name": "apply_patch",
                        "arguments": json.dumps({"input": PATCH}, separators=(",", ":")),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call-p", "content": "Success."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call-s",
                    "type": "function",
                    "function": {"name": "agents__spawn", "arguments": '{"task": "look"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call-s", "content": "ok"},
    ]


def test_responses_errors_reach_the_client_in_its_shape_and_fail_in_the_record(store):
    """An upstream error status, `previous_response_id` (the proxy keeps no responses), and streams
    cut or carrying an error event: OpenAI errors the SDK raises, or a stream ending in
    `response.failed` (never `response.completed`); the calls that went upstream are recorded failed."""

    def script(body: dict[str, Any]) -> Reply:
        said = body["messages"][-1]["content"]
        return Reply(status=500) if said == "fail" else Reply("half an answer", stream_end=said)

    with upstream_serving(script) as up, Proxy(up.url, port=0, store=store, key=KEY) as proxy:
        client = openai.OpenAI(base_url=proxy.url, api_key=KEY, max_retries=0)
        with pytest.raises(openai.InternalServerError, match="scripted failure 500"):
            client.responses.create(model=MODEL, input="fail")
        with pytest.raises(openai.BadRequestError, match="previous_response_id is not supported"):
            client.responses.create(model=MODEL, input="more", previous_response_id="resp_1")
        for end, told in (("cut", "the upstream's stream ended before its [DONE]"), ("error", "the engine died")):
            events = list(client.responses.create(model=MODEL, input=end, stream=True))
            assert events[0].type == "response.created" and events[-1].type == "response.failed"
            assert events[-1].response.error.message == told and events[-1].response.status == "failed"
            assert "response.completed" not in {e.type for e in events}
            with (
                pytest.raises(RuntimeError, match=r"response\.completed"),
                client.responses.stream(model=MODEL, input=end) as stream,
            ):
                stream.get_final_response()
        proxy.flush()
    assert len(up.chats()) == 5  # the refused previous_response_id never went upstream
    calls = calls_of(store, "proxy-default")
    assert [(c.status, c.error) for c in calls] == [
        ("failed", "the upstream answered HTTP 500"),
        *[("failed", "the upstream's stream ended before its [DONE]")] * 2,
        *[("failed", "the upstream sent an error in its stream")] * 2,
    ]


# -- the stream translators alone ----------------------------------------------------------------


def test_stream_translators_give_the_same_events_however_the_upstreams_bytes_are_split():
    """Chat chunks (with CRLF line ends) fed whole or split at random places, even inside a UTF-8
    character: the same events; a freeform call's arguments come back as its `input`."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": MODEL}
    arguments = json.dumps({"input": PATCH})
    chunks = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {**base, "choices": [{"index": 0, "delta": {"content": "héllo "}}]},
        {**base, "choices": [{"index": 0, "delta": {"content": "wörld"}}]},
        {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "id": "call-p", "type": "function", "function": {"name": "apply_patch"}}
                        ]
                    },
                }
            ],
        },
        *[
            {
                **base,
                "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}}],
            }
            for piece in (arguments[:7], arguments[7:30], arguments[30:])
        ],
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {**base, "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16}},
    ]
    data = chat_bytes(chunks)
    responses = translate.translated(
        "/v1/responses",
        json.dumps(
            {"model": MODEL, "input": "hi", "stream": True, "tools": [{"type": "custom", "name": "apply_patch"}]}
        ).encode(),
    )
    messages = translate.translated(
        "/v1/messages", json.dumps({"model": MODEL, "messages": [], "stream": True}).encode()
    )
    shuffle = random.Random(7)
    for translation in (responses, messages):
        whole = events_of(translation.events().feed(data).decode())
        for _ in range(20):
            events, out, at = translation.events(), b"", 0
            while at < len(data):
                step = shuffle.randint(1, 9)
                out += events.feed(data[at : at + step])
                at += step
            assert [name for name, _ in events_of(out.decode())] == [name for name, _ in whole]
            assert events.fail("too late") == b""  # the stream ended: nothing more
        unended = translation.events().feed(data.rstrip())  # a last `[DONE]` without its blank line
        assert [name for name, _ in events_of(unended.decode())] == [name for name, _ in whole]
        if translation is responses:
            final = whole[-1][1]["response"]
            assert whole[-1][0] == "response.completed" and final["usage"]["total_tokens"] == 16
            assert final["output"][0]["content"][0]["text"] == "héllo wörld"
            assert {k: final["output"][1][k] for k in ("type", "name", "call_id", "input")} == {
                "type": "custom_tool_call",
                "name": "apply_patch",
                "call_id": "call-p",
                "input": PATCH,
            }
        else:
            partial = "".join(d["delta"].get("partial_json", "") for n, d in whole if n == "content_block_delta")
            assert json.loads(partial) == {"input": PATCH}
            assert whole[-2][1]["usage"]["input_tokens"] == 7 and whole[-1][0] == "message_stop"
    cut = messages.events()
    assert events_of((cut.feed(data[:400]) + cut.fail("cut off")).decode())[-1] == (
        "error",
        {"type": "error", "error": {"type": "api_error", "message": "cut off"}},
    )
