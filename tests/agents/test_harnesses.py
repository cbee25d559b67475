"""Harness protocols without a sandbox: parsing replies, format errors, and encode -> parse."""

from __future__ import annotations

import json

import pytest

from orchard.agents import harness_factory
from orchard.agents.base import FormatError, Reply, Step, ToolCall
from orchard.errors import ConfigError


@pytest.mark.parametrize("name", ["bash", "tools", "cli"])
def test_what_a_harness_writes_it_reads_back(name):
    harness = harness_factory(name)()
    command = "grep -rn 'def wrap' textkit/ | head -3"
    actions = harness.parse(harness.encode(Step("bash", command=command), 1))
    assert len(actions) == 1 and not actions[0].is_submit
    assert command in json.dumps(actions[0].arguments)
    assert harness.parse(harness.encode(Step("submit"), 2))[0].is_submit
    written = harness.parse(harness.encode(Step("write", path="a.txt", content="x\n"), 3))[0]
    assert "a.txt" in json.dumps(written.arguments)


def test_bash_needs_exactly_one_block():
    bash = harness_factory("bash")()
    with pytest.raises(FormatError, match="found 0 ```bash blocks"):
        bash.parse(Reply(content="I think I should look at the code."))
    with pytest.raises(FormatError, match="found 2 ```bash blocks"):
        bash.parse(Reply(content="```bash\nls\n```\nand\n```bash\npwd\n```"))
    assert bash.parse(Reply(content="done\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"))[0].is_submit
    assert bash.tools() is None


def test_tools_format_errors_answer_every_call():
    tools = harness_factory("tools")()
    with pytest.raises(FormatError, match="no tool call"):
        tools.parse(Reply(content="Let me think."))
    bad = Reply(tool_calls=[ToolCall("c1", "execute_bash", "{not json")])
    with pytest.raises(FormatError, match="not valid JSON") as error:
        tools.parse(bad)
    answers = tools.format_error_messages(bad, error.value)
    assert answers == [{"role": "tool", "tool_call_id": "c1", "content": f"Error: {error.value}"}]
    with pytest.raises(FormatError, match="unknown tool 'rm_rf'"):
        tools.parse(Reply(tool_calls=[ToolCall("c2", "rm_rf", "{}")]))
    assert [t["function"]["name"] for t in tools.tools()] == ["execute_bash", "str_replace_editor", "finish"]


def test_cli_ends_on_plain_text_and_checks_argument_types():
    cli = harness_factory("cli")()
    assert cli.parse(Reply(content="Fixed the off-by-one in wrap()."))[0].is_submit
    with pytest.raises(FormatError, match="empty reply"):
        cli.parse(Reply(content="  "))
    with pytest.raises(FormatError, match="shell needs `command` as a list of strings"):
        cli.parse(Reply(tool_calls=[ToolCall("c1", "shell", json.dumps({"command": "ls -la"}))]))


def test_a_harness_from_a_file(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("from orchard.agents.bash import BashHarness\n\nclass Mine(BashHarness):\n    name = 'mine'\n")
    assert harness_factory(f"{path}:Mine")().name == "mine"
    with pytest.raises(ConfigError, match="unknown harness 'vim'"):
        harness_factory("vim")
    with pytest.raises(ConfigError, match="cannot load harness"):
        harness_factory(f"{path}:Missing")


def test_fences_and_heredocs_survive_awkward_content():
    bash = harness_factory("bash")()
    command = "cat <<'EOF' > README.md\n```python\nprint(1)\n```\nEOF"
    (action,) = bash.parse(bash.encode(Step("bash", command=command), 1))
    assert action.arguments["command"] == command  # a longer fence holds the inner one
    (written,) = bash.parse(bash.encode(Step("write", path="my file.py", content="x = 1"), 2))
    assert written.arguments["command"] == "cat <<'ORCHARD_EOF' > 'my file.py'\nx = 1\nORCHARD_EOF"
    with pytest.raises(FormatError, match="`workdir` must be a str"):
        harness_factory("cli")().parse(
            Reply(tool_calls=[ToolCall("c", "shell", json.dumps({"command": ["ls"], "workdir": 5}))])
        )


def test_cli_shell_scripts_of_any_size_run(client):
    """Coding CLIs send `["bash", "-lc", SCRIPT]`: SCRIPT runs as itself, past the 128 KiB argv limit."""
    harness = harness_factory("cli")()
    big = "x" * 200_000
    script = f"cat > /tmp/big <<'EOF'\n{big}\nEOF\nwc -c < /tmp/big"
    reply = Reply(tool_calls=[ToolCall("c1", "shell", json.dumps({"command": ["bash", "-lc", script]}))])
    with client.create("orchard/base:bookworm") as box:
        (action,) = harness.parse(reply)
        answer = json.loads(harness.execute(action, box, "/tmp"))
    assert answer["metadata"]["exit_code"] == 0, answer
    assert answer["output"].strip() == "200001"
    with client.create("orchard/base:bookworm") as box:  # `sh -c` runs under sh (dash here), as written
        for shell, ran_by in (("sh", "sh"), ("bash", "bash")):
            call = {"command": [shell, "-c", '[ -n "$BASH_VERSION" ] && echo bash || echo sh']}
            (action,) = harness.parse(Reply(tool_calls=[ToolCall("c2", "shell", json.dumps(call))]))
            assert json.loads(harness.execute(action, box, "/tmp"))["output"].strip() == ran_by
