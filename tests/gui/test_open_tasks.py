"""Open tasks (WebVoyager's kind): a question on one of our sites, the agent's final answer and its
last screenshots judged SUCCESS or NOT SUCCESS by a vision model. The judge here is a real
OpenAI-compatible server on loopback whose verdict is scripted: it reads the answer out of the
prompt and checks it against the facts of the site, and it counts the screenshots it was shown.
The episodes are real: Chromium in `blocked` sandboxes, through `orchard eval`."""

from __future__ import annotations

import json
from pathlib import Path

from sqlmodel import select
from typer.testing import CliRunner

from orchard.cli import app
from orchard.recipes.gui.task import JUDGE_ENV
from orchard.store import ResultRecord, session

OPEN = Path(__file__).resolve().parents[2] / "examples" / "gui" / "open-tasks.json"
FACTS = {"Lighting": "Book Light", "week 12": "Sofia Lind", "Friday 13 March": "20:30"}
"""A fact that only a right answer to each open task holds."""
runner = CliRunner()


def verdict(messages: list[dict]) -> str:
    """The scripted judge: SUCCESS when the answer holds the task's fact and screenshots were shown."""
    parts = messages[-1]["content"]
    prompt = parts[0]["text"]
    answer = prompt.split("<<<ANSWER", 1)[1].split("ANSWER>>>", 1)[0]
    task = prompt.split("The task:", 1)[1].split("The agent's answer", 1)[0]
    fact = next(value for key, value in FACTS.items() if key in task)
    shown = sum(part["type"] == "image_url" for part in parts)
    return "The page shows it. SUCCESS" if fact in answer and shown else "Not what the page says. NOT SUCCESS"


def test_a_vision_judge_grades_open_tasks_from_the_answer_and_the_screenshots(
    orchard_home, browser_image, chat_server, monkeypatch
):
    """Slow: open tasks run in real Chromium sandboxes, then a judge on a loopback server grades their screenshots."""
    base_url, bodies = chat_server(verdict)
    monkeypatch.setenv(JUDGE_ENV, "openai:judge-model")
    monkeypatch.setenv("OPENAI_BASE_URL", base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "x")
    result = runner.invoke(
        app, ["eval", "--tasks", str(OPEN), "--model", "scripted:solution,scripted:wrong", "--harness", "computer"]
    )
    assert result.exit_code == 0, result.output
    with session() as db:
        grades = [json.loads(r.grade) for r in db.exec(select(ResultRecord))]
    by = {(g["instance_id"], g["resolved"]) for g in grades}
    ids = [t["instance_id"] for t in json.loads(OPEN.read_text())]
    assert by == {(i, True) for i in ids} | {(i, False) for i in ids}  # the solution's answers pass, the wrong ones not
    assert len(bodies) == 2 * len(ids)
    for body in bodies:
        images = [p for p in body["messages"][0]["content"] if p["type"] == "image_url"]
        assert 1 <= len(images) <= 3 and all(p["image_url"]["url"].startswith("data:image/png;base64,") for p in images)
    judged = next(g for g in grades if g["resolved"])["checks"]["judge"]
    assert "SUCCESS" in judged["answer"] and "<<<ANSWER" in judged["prompt"]


def test_without_a_judge_an_open_task_is_an_error_saying_what_to_set(orchard_home, browser_image, monkeypatch):
    monkeypatch.delenv(JUDGE_ENV, raising=False)
    result = runner.invoke(
        app,
        [
            "eval",
            "--tasks",
            str(OPEN),
            "--model",
            "scripted:solution",
            "--harness",
            "bid",
            "--ids",
            "gui-open-wiki-on-call",
        ],
    )
    assert result.exit_code == 1, result.output  # no verdict on the model: said as it happens, and the run failed
    assert f"machine error: gui-open-wiki-on-call bid/0: {JUDGE_ENV} names no judge model" in result.stderr
    with session() as db:
        (grade,) = [json.loads(r.grade) for r in db.exec(select(ResultRecord))]
    assert grade["outcome"] == "error" and grade["error"] == f"{JUDGE_ENV} names no judge model for this open task"
