"""The value model learns a separable toy set; reranking submits the top-scored candidate."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from orchard.eval.rerank import ValueModel, rerank
from orchard.store import TrajectoryRecord
from orchard.train.config import ValueConfig
from orchard.train.value import balanced, train_value


def record(index: int, resolved: bool, instance: str = "t") -> TrajectoryRecord:
    word = "all tests pass, fixed" if resolved else "error traceback, still broken"
    messages = [
        {"role": "user", "content": "Fix the bug."},
        {"role": "assistant", "content": f"Ran the tests: {word}."},
        {"role": "user", "content": f"<output>\n{word}\n</output>"},
    ]
    return TrajectoryRecord(
        id=f"{instance}-{index}",
        instance_id=instance,
        harness="bash",
        model="m",
        status="completed",
        messages=json.dumps(messages),
        tools="null",
        patch="+fixed line" if resolved else "+broken line",
        resolved=resolved,
        created_at=time.time(),
    )


def test_a_value_model_separates_resolved_from_unresolved(tmp_path: Path):
    """Slow: it trains a value model until it separates the two, with a real TRL trainer."""
    from orchard.train.tiny import build_tiny_model

    base = build_tiny_model(tmp_path / "tiny")
    train = [record(i, i % 2 == 0) for i in range(8)]
    config = ValueConfig(max_steps=40, learning_rate=3e-3, batch_size=4, max_length=512)
    result = train_value(base, train, tmp_path / "value", config)
    assert result["steps"] == 40 and result["losses"][-1] < result["losses"][0]
    model = ValueModel(tmp_path / "value")
    assert model.max_length == 512  # scored as it was trained: the same end of each trajectory
    good, bad = model.score([record(100, True), record(101, False)])
    assert good > bad
    assert [good, bad] == pytest.approx(model.score([record(100, True)]) + model.score([record(101, False)]), abs=1e-5)
    with pytest.raises(Exception, match="resolved and unresolved"):
        train_value(base, [record(0, True)], tmp_path / "nope")


class Scores:
    """Scores by trajectory id (the reranker only needs `score`)."""

    def __init__(self, scores: dict[str, float]):
        self.scores = scores

    def score(self, records):
        return [self.scores[r.id] for r in records]


def test_rerank_picks_the_top_scored_candidate():
    a = [record(0, False, "a"), record(1, True, "a"), record(2, False, "a")]
    b = [record(0, False, "b"), record(1, False, "b")]
    summary = rerank({"a": a, "b": b}, Scores({"a-0": 0.1, "a-1": 0.9, "a-2": 0.5, "b-0": 0.7, "b-1": 0.2}))
    assert summary["picks"] == {"a": "a-1", "b": "b-0"}
    assert summary["reranked"] == 0.5 and summary["oracle_pass_at_n"] == 0.5
    assert summary["one_sample"] == pytest.approx((1 / 3 + 0) / 2)


def test_an_empty_submission_is_never_picked_where_it_always_fails():
    """SWE's empty diff fixes nothing: the pick is the best-scored sample that submitted something,
    and `non_empty` is the rate of a sample drawn from those (the rule's share of a gain)."""
    a = [record(0, True, "a"), record(1, False, "a"), record(2, False, "a")]
    a[2].patch = ""
    b = [record(0, False, "b"), record(1, False, "b")]
    b[0].patch = b[1].patch = ""  # every one empty: the value model picks among them all
    scores = Scores({"a-0": 0.5, "a-1": 0.1, "a-2": 0.9, "b-0": 0.3, "b-1": 0.4})
    assert rerank({"a": a, "b": b}, scores)["picks"] == {"a": "a-2", "b": "b-1"}
    summary = rerank({"a": a, "b": b}, scores, empty_fails=True)
    assert summary["picks"] == {"a": "a-0", "b": "b-1"} and summary["reranked"] == 0.5
    assert summary["non_empty"] == pytest.approx((1 / 2 + 0) / 2) and summary["one_sample"] == pytest.approx(1 / 6)


def test_the_rarer_verdict_is_repeated_to_balance_the_value_models_examples():
    rows = [{"labels": 1.0, "i": i} for i in range(5)] + [{"labels": 0.0, "i": 9}, {"labels": 0.0, "i": 8}]
    out = balanced(rows)
    assert [r["i"] for r in out if not r["labels"]] == [9, 8, 9, 8, 9] and len(out) == 10
    assert balanced(rows[:5]) == rows[:5]  # one verdict only: nothing to balance (train_value refuses it)
