"""pass@k and pass^k against values computed by hand; SWE-bench's report shape."""

from __future__ import annotations

import json

import pytest

from orchard.eval.metrics import pass_at_k, pass_hat_k, swebench_report


def test_pass_at_k_by_hand():
    # n = 5 samples, c = 2 resolved: pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10;
    # pass@3 = 1 - C(3,3)/C(5,3) = 1 - 1/10; pass@4 = 1 (fewer failures than draws).
    assert [pass_at_k(5, 2, k) for k in (1, 2, 3, 4)] == pytest.approx([0.4, 0.7, 0.9, 1.0])
    assert pass_at_k(3, 0, 2) == 0.0 and pass_at_k(3, 3, 1) == 1.0


def test_pass_hat_k_by_hand():
    # all k of n = 5 resolve, with c = 3: pass^1 = 3/5, pass^2 = C(3,2)/C(5,2) = 3/10, pass^3 = 1/10.
    assert [pass_hat_k(5, 3, k) for k in (1, 2, 3, 4)] == pytest.approx([0.6, 0.3, 0.1, 0.0])


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_hat_k(2, 3, 1)


def test_swebench_report_shape():
    report = swebench_report(
        ["a", "b", "c", "d", "e", "f"],
        {"a": "resolved", "b": "unresolved", "c": "empty_patch", "d": "patch_failed", "e": "timeout"},
    )
    assert report["resolved_ids"] == ["a"] and report["unresolved_ids"] == ["b"]
    assert report["empty_patch_ids"] == ["c"] and report["error_ids"] == ["d", "e"]
    assert report["incomplete_ids"] == ["f"] and report["completed_ids"] == ["a", "b"]
    assert (report["total_instances"], report["submitted_instances"], report["schema_version"]) == (6, 5, 2)


def test_the_report_times_each_image_and_names_the_rows_on_another_python(tmp_path) -> None:
    from orchard.eval.report import image_lines, write_report
    from orchard.eval.runner import summarize

    build = {"base": 0.1, "interpreter": 3.0, "dependencies": 25.4, "repository": 18.0, "total": 46.5}
    images = {
        "django__django-11049": {
            "seconds": 47.0, "image": "orchard/swe:d", "build": build, "built": True,
            "python": {"asked": "3.6", "ran": "3.9.2", "other": True},
        },
        "pallets__flask-5063": {  # built by an earlier run: found at once
            "seconds": 0.1, "image": "orchard/swe:f", "build": {**build, "total": 30.0}, "built": False,
            "python": {"asked": "3.11", "ran": "3.11.2", "other": False},
        },
    }  # fmt: skip
    assert image_lines(images) == [
        "image of django__django-11049: built in 46 s (interpreter 3 s, dependencies 25 s, repository 18 s)",
        "django__django-11049 asks for Python 3.6 and ran on 3.9.2 (see its warnings)",
    ]
    summary = summarize([], ["django__django-11049", "pallets__flask-5063"]) | {"images": images}
    text = write_report(tmp_path, summary, "t").read_text()
    assert "| django__django-11049 | 3.6 → 3.9.2 (other) | 0 / 3 / 25 / 18 = 46 s | 47 |" in text
    assert "| pallets__flask-5063 | 3.11 → 3.11.2 | 0 / 3 / 25 / 18 = 30 s | 0 |" in text
    assert (
        "1 ran on another Python than they ask for (their warnings say how that is made up for): `django__django-11049`."
        in text
    )


def test_the_report_gives_the_spread_of_steps_and_tokens_without_machine_errors(tmp_path) -> None:
    from orchard.eval.metrics import spread
    from orchard.eval.report import write_report
    from orchard.eval.runner import summarize
    from orchard.store import ResultRecord

    assert spread([]) == {} and spread([7]) == {"min": 7, "p25": 7, "median": 7, "p75": 7, "max": 7}
    assert spread([1, 2, 3, 4, 5]) == {"min": 1, "p25": 2, "median": 3, "p75": 4, "max": 5}

    def result(task: str, steps: int, tokens: int, outcome: str = "resolved", grade: str = "{}") -> ResultRecord:
        return ResultRecord(
            id=f"r/{task}/bash/0", run_id="r", instance_id=task, harness="bash", sample=0, outcome=outcome,
            resolved=outcome == "resolved", grade=grade, steps=steps, tokens=tokens, created_at=0.0,
        )  # fmt: skip

    results = [result(f"t{i}", steps, 100 * steps) for i, steps in enumerate([2, 4, 6, 8, 10])]
    died = json.dumps({"error": "the model server failed: APIConnectionError", "fault": "machine"})
    results.append(result("t9", 0, 0, "error", died))  # a machine error: not an attempt's effort
    summary = summarize(results, [f"t{i}" for i in range(10)])
    assert summary["harnesses"]["bash"]["steps"] == {"min": 2, "p25": 4, "median": 6, "p75": 8, "max": 10}
    text = write_report(tmp_path, summary, "t").read_text()
    assert "| bash | 6.0 [4.0-8.0] (2-10) | 600 [400-800] (200-1000) |" in text
    assert "![steps_tokens](steps_tokens.png)" in text and (tmp_path / "steps_tokens.png").stat().st_size > 1000
