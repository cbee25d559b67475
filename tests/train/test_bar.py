"""The BAR assembler on hand-made reward sequences: every branch."""

from __future__ import annotations

import pytest

from orchard.train.bar import BARConfig, Rollout, advantages, assemble, balanced_rollout, fallback


def sequence(outcomes: str, statuses: str | None = None):
    """A generator replaying `outcomes` ('1' success, '0' failure) in the order asked; records calls."""
    codes = {"c": "completed", "t": "truncated", "l": "time_limit", "a": "aborted"}
    rollouts = [
        Rollout(
            success=o == "1",
            reward=1.0 if o == "1" else -1.0,
            status=codes[(statuses or "c" * len(outcomes))[i]],
            payload=i,
        )
        for i, o in enumerate(outcomes)
    ]
    calls: list[int] = []

    def generate(k: int) -> list[Rollout]:
        start = sum(calls)
        calls.append(k)
        return rollouts[start : start + k]

    return generate, calls


def test_the_band_is_tried_from_its_middle():
    assert BARConfig().positive_counts() == [4, 3, 5]
    assert BARConfig(group_size=4, rho_min=0.25, rho_max=0.75).positive_counts() == [2, 1, 3]


def test_early_stop_as_soon_as_a_balanced_group_forms():
    generate, calls = sequence("10" * 8)
    group = balanced_rollout(generate, BARConfig(stride=4))
    assert calls == [4, 4] and group.kind == "balanced" and group.spent == 8
    assert group.positives == 4 and len(group.rollouts) == 8 and group.informative


def test_the_paper_defaults_take_one_stride_and_keep_the_middle():
    generate, calls = sequence("1111110000000000")  # 6 wins, 10 losses
    group = balanced_rollout(generate)
    assert calls == [16] and group.kind == "balanced" and group.positives == 4


def test_status_order_within_successes_and_failures():
    pool = [
        Rollout(True, 1.0, "aborted", "win-aborted"),
        Rollout(True, 1.0, "truncated", "win-truncated"),
        Rollout(True, 1.0, "completed", "win-completed"),
        Rollout(True, 1.0, "time_limit", "win-time"),
        Rollout(True, 1.0, "completed", "win-completed-2"),
        *[
            Rollout(False, -1.0, s, f"loss-{s}")
            for s in ("aborted", "time_limit", "truncated", "completed", "completed")
        ],
    ]
    group = assemble(pool, BARConfig(group_size=4, max_rollouts=10, rho_min=0.5, rho_max=0.5))
    assert [r.payload for r in group.rollouts] == [
        "win-completed",
        "win-completed-2",
        "loss-completed",
        "loss-completed",
    ]


def test_relaxed_fallback_when_the_band_cannot_be_met():
    generate, calls = sequence("1" + "0" * 15)
    group = balanced_rollout(generate, BARConfig(stride=8))
    assert calls == [8, 8] and group.kind == "relaxed" and group.spent == 16
    assert group.positives == 1 and group.informative


def test_best_n_by_status_when_every_rollout_agrees():
    generate, _ = sequence("0" * 16, "aaaattttllllcccc")
    group = balanced_rollout(generate)
    assert group.kind == "best" and not group.informative
    assert [r.status for r in group.rollouts] == ["completed"] * 4 + ["truncated"] * 4


def test_too_few_rollouts_and_bad_configs():
    generate, _ = sequence("10")
    with pytest.raises(ValueError, match="only 2 rollouts"):
        balanced_rollout(generate)
    with pytest.raises(ValueError, match="group_size <= max_rollouts"):
        BARConfig(group_size=20)
    assert fallback([Rollout(True, 1.0)] * 8, BARConfig()).kind == "best"


def test_advantages_are_group_relative():
    generate, _ = sequence("1111000000000000")
    values = advantages(balanced_rollout(generate, BARConfig(group_size=4, rho_min=0.5, rho_max=0.5)))
    assert sum(values) == pytest.approx(0.0) and values[0] > 0 > values[-1]
