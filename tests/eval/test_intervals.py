"""95% intervals of resolve rates (per task, Wilson) and of paired changes, against known values."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchard.eval.intervals import change, rate, shares, wilson


def test_wilson_matches_the_textbook_values():
    assert wilson(0, 50) == pytest.approx((0.0, 0.0714), abs=1e-4)  # the rule of three's cousin
    assert wilson(25, 50) == pytest.approx((0.3664, 0.6336), abs=1e-4)
    assert wilson(50, 50) == pytest.approx((0.9286, 1.0), abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)


def test_a_task_is_the_unit_so_more_samples_of_it_do_not_narrow_the_interval():
    records = [SimpleNamespace(instance_id=f"t{i}", resolved=j < i % 5) for i in range(40) for j in range(4)]
    per_task = shares(records)
    assert per_task["t3"] == 0.75 and len(per_task) == 40
    measured = rate(per_task)
    assert measured["n"] == 40 and measured["rate"] == pytest.approx(sum(i % 5 for i in range(40)) / 160)
    assert (measured["low"], measured["high"]) == pytest.approx(wilson(measured["rate"] * 40, 40))
    assert (
        measured["high"] - measured["low"]
        > wilson(measured["rate"] * 160, 160)[1] - wilson(measured["rate"] * 160, 160)[0]
    )


def test_a_change_is_paired_by_task_and_only_over_tasks_both_have():
    before = {f"t{i}": 0.0 for i in range(50)}
    after = {f"t{i}": float(i % 2) for i in range(50)} | {"extra": 1.0}
    gained = change(before, after)
    assert gained["n"] == 50 and gained["change"] == 0.5
    assert gained["low"] == pytest.approx(0.5 - 1.959964 * 0.50508 / 50**0.5, abs=1e-4) and gained["low"] > 0
    assert change(after, after)["change"] == 0 and change({}, after)["n"] == 0
