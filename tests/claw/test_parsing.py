"""The claw harnesses' parsing of replies, on the host: what becomes an action, an answer to the
user, or a format error the model is shown."""

from __future__ import annotations

import json

import pytest

from orchard.agents.base import FormatError, Reply, Step, ToolCall
from orchard.recipes.claw.harnesses import AssistantHarness, FunctionsHarness, ReactHarness

TASK = {
    "address": "priya@northwind.example",
    "now": "2026-03-02T09:00",
    "tools": [
        {
            "name": "todo_create",
            "description": "Add a to-do.",
            "input_schema": {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]},
            "endpoint": "/todo/create",
            "url": "http://localhost:9100/todo/create",
        }
    ],
}


def _ready(cls):
    harness = cls()
    prompt = harness.system_prompt(TASK)
    assert "priya@northwind.example" in prompt and "2026-03-02" in prompt
    return harness, prompt


def test_react_reads_one_action_or_a_final_answer():
    harness, prompt = _ready(ReactHarness)
    assert "todo_create: Add a to-do." in prompt and harness.tools() is None
    (action,) = harness.parse(Reply('I will add it.\nAction: todo_create\nAction Input: {"title": "Call the bank"}'))
    assert (action.name, action.arguments) == ("todo_create", {"title": "Call the bank"})
    (done,) = harness.parse(Reply("All set.\nFinal Answer: Added the to-do.\nThanks"))
    assert done.is_submit and done.arguments["answer"] == "Added the to-do.\nThanks"
    for reply, says in [
        ("I think so.", "no `Action:`"),
        ("Action: mail_send\nAction Input: {}", "unknown tool 'mail_send'"),
        ("Action: todo_create\nAction Input: {title: x}", "not valid JSON"),
    ]:
        with pytest.raises(FormatError, match=says):
            harness.parse(Reply(reply))
    step = Step("call", tool="todo_create", arguments={"title": "x"}, thought="Adding.")
    assert harness.parse(harness.encode(step, 1))[0].arguments == {"title": "x"}


def test_functions_and_assistant_end_their_turn_on_text_and_refuse_unknown_tools():
    for cls in (FunctionsHarness, AssistantHarness):
        harness, _ = _ready(cls)
        (done,) = harness.parse(Reply("Added it."))
        assert done.is_submit and done.arguments == {"answer": "Added it."}
        with pytest.raises(FormatError, match="empty reply"):
            harness.parse(Reply("  "))
        with pytest.raises(FormatError, match="unknown tool 'rm_rf'"):
            harness.parse(Reply(tool_calls=[ToolCall("c", "rm_rf", "{}")]))
    functions, _ = _ready(FunctionsHarness)
    assert [t["function"]["name"] for t in functions.tools()] == ["todo_create"]
    assistant, prompt = _ready(AssistantHarness)
    assert "POST http://localhost:9100/todo/create {title*: string}: Add a to-do." in prompt
    call = assistant.encode(Step("call", tool="todo_create", arguments={"title": "x"}), 1).tool_calls[0]
    assert call.name == "http_request" and json.loads(call.arguments)["url"] == "http://localhost:9100/todo/create"
