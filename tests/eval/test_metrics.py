"""pass@k and pass^k against values computed by hand; SWE-bench's report shape."""

from __future__ import annotations

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
