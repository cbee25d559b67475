"""The BAR assembler on hand-made reward sequences: every branch."""

from __future__ import annotations

import pytest

from orchard.train.bar import BARConfig, PassRates, Rollout, advantages, assemble, balanced_rollout, fallback


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


def _history(outcomes: str):
    """A task's rollouts to come (`sequence`'s generator)."""
    return sequence(outcomes)[0]


def test_pass_rates_settle_on_the_newest_agreeing_rollouts_and_unsettle_on_a_change():
    memory = PassRates(settle_after=4)
    assert memory.rate("t") is None and memory.settled("t") is None
    memory.record("t", [Rollout(False, -1.0)] * 3)
    assert memory.settled("t") is None  # three, not four
    memory.record("t", [Rollout(False, -1.0)])
    assert memory.settled("t") is False and memory.rate("t") == 1 / 6
    memory.record("t", [Rollout(True, 1.0)])
    assert memory.settled("t") is None  # the policy learnt something: no longer settled
    memory.record("t", [Rollout(True, 1.0)] * 3)
    assert memory.settled("t") is True


def test_a_settled_task_costs_one_probe_and_one_that_changed_is_rolled_out_as_usual():
    config = BARConfig(group_size=4, max_rollouts=8, stride=8)
    memory = PassRates(settle_after=4)
    memory.record("never", [Rollout(False, -1.0)] * 4)
    group = balanced_rollout(_history("0000"), config, memory=memory, task="never")
    assert (group.kind, group.spent, len(group.rollouts), group.informative) == ("settled", 1, 4, False)
    group = balanced_rollout(_history("1" + "01" * 4), config, memory=memory, task="never")
    assert group.kind == "balanced" and group.positives == 2 and group.pool[0].success  # the probe counted
    assert memory.settled("never") is None


def test_a_task_settles_within_a_step_once_its_newest_rollouts_agree():
    """With memory, a first visit whose first stride all agrees stops there (the paper's BAR would
    spend the whole budget); a stride that differs keeps looking, as without memory."""
    config = BARConfig(group_size=4, max_rollouts=8, stride=4)
    group = balanced_rollout(_history("1111" + "0" * 4), config, memory=PassRates(settle_after=4), task="t")
    assert (group.kind, group.spent, group.informative) == ("best", 4, False)
    assert balanced_rollout(_history("1111" + "0" * 4), config).spent == 8  # no memory: the budget
    longer = BARConfig(group_size=4, max_rollouts=12, stride=4)
    group = balanced_rollout(_history("1110" + "1111" + "0000"), longer, memory=PassRates(settle_after=4), task="t")
    assert (group.kind, group.spent, group.positives) == ("relaxed", 8, 3)  # the newest four agree: a mix, and done
    assert balanced_rollout(_history("1110" + "1111" + "0000"), longer).kind == "balanced"  # no memory: 12 spent


def test_the_first_stride_follows_the_estimated_pass_rate():
    config = BARConfig(group_size=4, max_rollouts=16, stride=16)
    memory = PassRates()
    assert memory.first_stride("new", config) == 16  # never seen: the paper's stride
    memory.record("even", [Rollout(i % 2 == 0, 0.0) for i in range(20)])
    assert memory.first_stride("even", config) == 4  # at about 1/2, a group's worth
    memory.record("rare", [Rollout(i % 5 == 0, 0.0) for i in range(20)])
    assert memory.first_stride("rare", config) == 9  # at (1 + 4) / (2 + 20), two successes take nine
    memory.record("hopeless", [Rollout(False, 0.0)] * 20)
    assert memory.first_stride("hopeless", config) == 16  # capped at the budget
    wide = BARConfig(group_size=4, max_rollouts=16, stride=16, rho_min=0.25, rho_max=0.75)
    assert memory.first_stride("rare", wide) == 5  # one success of four is balanced: it takes five


def test_memory_spends_fewer_rollouts_per_informative_group_on_hand_made_histories():
    """Ten epochs over three tasks as a policy sees them: one it always solves, one it never
    solves, one it solves every other time. Without memory every group costs a whole stride (16);
    with it, the settled tasks cost a probe each and the even one a group's worth."""
    config = BARConfig(group_size=4, max_rollouts=16, stride=16)
    histories = {"always": "1" * 200, "never": "0" * 200, "even": "10" * 100}

    def spent_per_informative(memory: PassRates | None) -> float:
        left = {task: _history(outcomes) for task, outcomes in histories.items()}
        spent = informative = 0
        for _epoch in range(10):
            for task in histories:
                group = balanced_rollout(left[task], config, memory=memory, task=task)
                spent, informative = spent + group.spent, informative + group.informative
        return spent / informative

    without, with_memory = spent_per_informative(None), spent_per_informative(PassRates())
    assert without == 16 * 3 * 10 / 10  # every group a stride; only the even task's are informative
    assert with_memory * 1.3 <= without


def test_fixed_groups_cost_group_size_over_the_chance_of_a_mixed_group():
    from orchard.train.bar import fixed_rollouts_per_informative

    assert fixed_rollouts_per_informative([0.5], 4) == pytest.approx(4 / (1 - 2 / 16))
    assert fixed_rollouts_per_informative([0.5, 0.0], 4) == pytest.approx(8 / (1 - 2 / 16))  # the 0 costs 4 for nothing
    assert fixed_rollouts_per_informative([0.0, 1.0], 8) == float("inf")  # never a mixed group
