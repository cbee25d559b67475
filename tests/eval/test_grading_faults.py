"""Grading and episodes when things go wrong: each is a recorded outcome, never a crash."""

from __future__ import annotations

import pytest

from orchard.agents import harness_factory
from orchard.agents.base import Reply
from orchard.agents.loop import Limits, run_episode
from orchard.agents.models import ModelError, ScriptedModel
from orchard.recipes.swe.grading import grade_in, grade_patch


@pytest.fixture(scope="module")
def example(example_task):
    """An example task (one-line fix in textkit) and its image."""
    return example_task("orchard-examples__textkit-1")


def test_broken_and_weakening_patches(client, example):
    task, image = example
    assert (
        grade_patch(
            client, task, "diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1 +1 @@\n-a\n+b\n", image
        ).outcome
        == "patch_failed"
    )
    # Rewriting the tests so that they pass does not count: the grader resets them first.
    test_file = next(p for p in task.test_patch.split("diff --git a/")[1:]).split(" ", 1)[0]
    with client.create(image) as box:
        box.exec(f"printf 'def test_nothing():\\n    assert True\\n' > {test_file}", cwd=task.workdir)
        weakening = box.exec("git diff", cwd=task.workdir).stdout
    grade = grade_patch(client, task, weakening, image)
    assert grade.outcome == "unresolved" and grade.fail_to_pass["failure"] == task.fail_to_pass
    assert grade_patch(client, task, "", image).outcome == "empty_patch"


def test_a_task_whose_gold_patch_does_not_pass_or_whose_test_patch_is_broken(client, example):
    task, image = example
    missing = task.model_copy(update={"fail_to_pass": ["tests/test_wrap.py::test_that_does_not_exist"]})
    grade = grade_patch(client, missing, task.patch, image)
    assert grade.outcome == "unresolved" and grade.tests["tests/test_wrap.py::test_that_does_not_exist"] == "MISSING"
    broken = task.model_copy(
        update={"test_patch": "diff --git a/t.py b/t.py\n--- a/t.py\n+++ b/t.py\n@@ -9 +9 @@\n-x\n+y\n"}
    )
    grade = grade_patch(client, broken, task.patch, image)
    assert grade.outcome == "error" and "test patch does not apply" in grade.error


def test_no_test_at_all_is_the_patch_s_fault_only_when_the_tests_run_without_it(client, example):
    """A run in which no test ran is `unresolved` when the patch did it (here: the package ends the
    process as it is imported), and `error` of the task when no test runs without the patch either.

    Slow: the task is graded several times, each in a fresh sandbox, with and without the patch.
    """
    task, image = example
    package = "textkit/__init__.py"
    with client.create(image) as box:
        box.exec(f"git apply <<'EOF'\n{task.patch}EOF\necho 'import os; os._exit(0)' >> {package}", cwd=task.workdir)
        exits = box.exec("git diff", cwd=task.workdir).stdout
    grade = grade_patch(client, task, exits, image)
    assert grade.outcome == "unresolved" and "the patch breaks the test run" in grade.error
    assert grade.checks["tests_found"] is False
    nothing = task.model_copy(update={"test_cmd": "python3 -m pytest -rA -k no_test_has_this_name"})
    grade = grade_patch(client, nothing, task.patch, image)
    assert grade.outcome == "error" and grade.fault == "task" and "with the patch or without it" in grade.error


def test_tests_that_hang_time_out(client, example):
    task, image = example
    hanging = task.model_copy(update={"test_cmd": "sleep 60; " + task.environment().test_cmd})
    with client.create(image) as box:
        grade = grade_in(box, hanging, task.patch, timeout=2)
        assert box.exec("echo alive").stdout == "alive\n"  # the sandbox outlived the hung tests
    assert grade.outcome == "timeout" and "longer than 2 s" in grade.error


class Babbler:
    """A model that never follows the format."""

    def complete(self, messages, tools):
        return Reply(content="I would rather talk about the weather.", prompt_tokens=10, completion_tokens=5)


class Crashing:
    """A model server that answers once, then fails."""

    def __init__(self):
        self.calls = 0

    def complete(self, messages, tools):
        self.calls += 1
        if self.calls > 1:
            raise ModelError("the model server failed: APIConnectionError: connection refused")
        return Reply(content="```bash\nls\n```")


def test_malformed_replies_are_fed_back_counted_and_end_the_episode(client, example):
    task, image = example
    with client.create(image) as box:
        episode = run_episode(
            task, harness_factory("bash")(), Babbler(), box, model_name="babbler", limits=Limits(max_format_errors=3)
        )
    assert (episode.status, episode.format_errors, len(episode.steps)) == ("aborted", 3, 3)
    assert episode.error == "3 format errors in a row"
    assert episode.messages[3]["content"].startswith("Format error: found 0 ```bash blocks")


def test_a_failing_model_server_and_a_dying_sandbox_abort_with_the_reason(client, example, docker_client):
    task, image = example
    with client.create(image) as box:
        episode = run_episode(task, harness_factory("bash")(), Crashing(), box, model_name="crashing")
    assert episode.status == "aborted" and "connection refused" in episode.error and len(episode.steps) == 1

    class Killer:
        """Kills its own sandbox before asking for a command."""

        def complete(self, messages, tools):
            docker_client.containers.get(f"orchard-{box.id}").kill()
            return Reply(content="```bash\nls\n```")

    with client.create(image) as box:
        episode = run_episode(
            task,
            harness_factory("tools")(),
            ScriptedModel("gold").session(task, harness_factory("tools")()),
            box,
            model_name="x",
            limits=Limits(episode_steps=1),
        )
        assert episode.status == "truncated"  # one step allowed, not submitted
        dying = run_episode(task, harness_factory("bash")(), Killer(), box, model_name="killer")
    assert dying.status == "aborted" and "agent" in dying.error and dying.submission == ""
