"""Balanced Adaptive Rollout (BAR): rollouts for a task until a balanced GRPO group can be formed.

Per task, rollouts are generated in strides of `stride` (a stride runs in parallel) and scored.
After each stride the assembler tries to pick a group of `group_size` whose share of successes
n+/N lies in [rho_min, rho_max], trying the n+ closest to the middle of the band first and, within
successes and within failures, preferring rollouts by status (completed, then truncated, then
time limit, then aborted). The first group that forms ends generation. Once `max_rollouts` are
spent without one, a relaxed fallback takes any mix of successes and failures (still
informative: advantages are not all zero), nearest the middle; failing that (all rollouts agree),
the best `group_size` by status. Defaults are the paper's: N = 8, N_max = 16, s = 16,
rho in [0.375, 0.625].

With memory (beyond the paper: `PassRates`), what each task's rollouts did in earlier steps and
epochs sizes its next group: a task whose last `settle_after` rollouts or more all agree (the
policy always solves it, or never does) gets one probe rollout, and when the probe agrees too its
group is that rollout N times (uninformative, as any group of it would be: GRPO's advantages are
all zero); one that disagrees is rolled out as usual. Any other task's first stride is the number
of rollouts likely to hold a balanced group at its estimated pass rate, not a fixed `stride`. And
a task settles within a step too: once its newest `settle_after` rollouts agree and no balanced
group has formed, no more are generated for it (the group is the fallback's), where the paper
would spend the rest of `max_rollouts` looking for the one rollout that differs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

STATUS_ORDER = {"completed": 0, "truncated": 1, "time_limit": 2, "aborted": 3}


@dataclass
class Rollout:
    success: bool
    reward: float
    status: str = "completed"
    payload: Any = None


@dataclass(frozen=True)
class BARConfig:
    group_size: int = 8
    max_rollouts: int = 16
    stride: int = 16
    rho_min: float = 0.375
    rho_max: float = 0.625

    def __post_init__(self) -> None:
        if not 1 <= self.group_size <= self.max_rollouts:
            raise ValueError("need 1 <= group_size <= max_rollouts")
        if self.stride < 1:
            raise ValueError("stride must be at least 1")
        if not 0.0 <= self.rho_min <= self.rho_max <= 1.0:
            raise ValueError("need 0 <= rho_min <= rho_max <= 1")

    def positive_counts(self) -> list[int]:
        """The admissible numbers of successes, the one closest to the band's middle first."""
        n = self.group_size
        low, high = math.ceil(self.rho_min * n - 1e-9), math.floor(self.rho_max * n + 1e-9)
        middle = (self.rho_min + self.rho_max) / 2 * n
        return sorted(range(low, high + 1), key=lambda k: (abs(k - middle), k))


@dataclass
class Group:
    rollouts: list[Rollout]
    kind: Literal["balanced", "relaxed", "best", "settled"]
    spent: int
    """Rollouts generated for this task (the group plus the ones left out)."""
    pool: list[Rollout] = field(default_factory=list)

    @property
    def positives(self) -> int:
        return sum(r.success for r in self.rollouts)

    @property
    def informative(self) -> bool:
        """GRPO learns from a group only when its rewards differ."""
        return len({r.reward for r in self.rollouts}) > 1


def _by_status(rollouts: Sequence[Rollout]) -> list[Rollout]:
    return sorted(rollouts, key=lambda r: STATUS_ORDER.get(r.status, len(STATUS_ORDER)))  # stable


def assemble(pool: Sequence[Rollout], config: BARConfig) -> Group | None:
    """A balanced group from `pool`, or None if none can be formed yet."""
    wins = _by_status([r for r in pool if r.success])
    losses = _by_status([r for r in pool if not r.success])
    for positives in config.positive_counts():
        negatives = config.group_size - positives
        if len(wins) >= positives and len(losses) >= negatives:
            return Group(wins[:positives] + losses[:negatives], "balanced", len(pool), list(pool))
    return None


def fallback(pool: Sequence[Rollout], config: BARConfig) -> Group:
    """After the budget: any informative mix nearest the middle; else the best N by status."""
    wins = _by_status([r for r in pool if r.success])
    losses = _by_status([r for r in pool if not r.success])
    n = config.group_size
    middle = (config.rho_min + config.rho_max) / 2 * n
    mixes = [k for k in range(1, n) if len(wins) >= k and len(losses) >= n - k]
    if mixes:
        positives = min(mixes, key=lambda k: (abs(k - middle), k))
        return Group(wins[:positives] + losses[: n - positives], "relaxed", len(pool), list(pool))
    return Group(_by_status(pool)[:n], "best", len(pool), list(pool))


@dataclass
class PassRates:
    """What BAR remembers of each task across steps and epochs: the outcomes of its rollouts, in
    order, and from them a pass-rate estimate (the mean of a Beta(1, 1) prior updated by them)."""

    settle_after: int = 8
    """Rollouts that must all agree, the newest ones, before a task is taken as settled."""
    outcomes: dict[str, list[bool]] = field(default_factory=dict)

    def record(self, task: str, rollouts: Sequence[Rollout]) -> None:
        self.outcomes.setdefault(task, []).extend(r.success for r in rollouts)

    def rate(self, task: str) -> float | None:
        """The estimated pass rate, in (0, 1); None for a task never rolled out."""
        seen = self.outcomes.get(task)
        return None if not seen else (1 + sum(seen)) / (2 + len(seen))

    def settled(self, task: str) -> bool | None:
        """True when the task's newest `settle_after` rollouts all succeeded, False when they all
        failed, None otherwise (too few, or mixed)."""
        newest = self.outcomes.get(task, [])[-self.settle_after :]
        if len(newest) < self.settle_after or len(set(newest)) != 1:
            return None
        return newest[0]

    def first_stride(self, task: str, config: BARConfig) -> int:
        """Rollouts to generate first: at the estimated rate, enough to expect the fewest successes
        and the fewest failures a balanced group holds (at least `group_size`, at most
        `max_rollouts`); the config's `stride` for a task never seen."""
        p = self.rate(task)
        if p is None:
            return config.stride
        counts = config.positive_counts()
        wins, losses = min(counts), config.group_size - max(counts)
        needed = math.ceil(max(wins / p, losses / (1 - p)) - 1e-9)
        return max(config.group_size, min(needed, config.max_rollouts))


def balanced_rollout(
    generate: Callable[[int], list[Rollout]],
    config: BARConfig = BARConfig(),
    *,
    memory: PassRates | None = None,
    task: str = "",
) -> Group:
    """Call `generate(k)` for strides of rollouts until a group forms (or the budget ends); with
    `memory`, what task `task` did before sizes it (and what it does now is remembered)."""
    pool: list[Rollout] = []
    stride = config.stride
    if memory is not None:
        known = memory.settled(task)
        if known is not None:
            probe = generate(1)
            memory.record(task, probe)
            if probe and probe[0].success == known:
                return Group(probe * config.group_size, "settled", 1, list(probe))
            pool.extend(probe)  # it no longer agrees: rolled out as usual, the probe counted
        stride = memory.first_stride(task, config)
    while len(pool) < config.max_rollouts:
        wanted = min(stride, config.max_rollouts - len(pool))
        stride = config.stride
        produced = generate(wanted)
        if not produced:
            break
        if memory is not None:
            memory.record(task, produced)
        pool.extend(produced)
        group = assemble(pool, config)
        if group is not None:
            return group
        if memory is not None and len(pool) >= config.group_size and memory.settled(task) is not None:
            break  # settled within this step: more rollouts would most likely agree too
    if len(pool) < config.group_size:
        raise ValueError(f"only {len(pool)} rollouts were generated; a group needs {config.group_size}")
    return fallback(pool, config)


def fixed_rollouts_per_informative(rates: Sequence[float], group_size: int) -> float:
    """What fixed groups would spend per informative group on the same draws of tasks: one group
    of `group_size` per draw, informative with probability 1 - p^N - (1-p)^N at the task's pass
    rate p, so N x draws / (the expected informative groups); inf when none would be."""
    n = group_size
    expected = sum(1 - p**n - (1 - p) ** n for p in rates)
    return n * len(rates) / expected if expected > 0 else math.inf


def advantages(group: Group) -> list[float]:
    """GRPO's group-relative advantages: reward minus the group mean, over the group's std."""
    rewards = [r.reward for r in group.rollouts]
    mean = sum(rewards) / len(rewards)
    std = (sum((x - mean) ** 2 for x in rewards) / len(rewards)) ** 0.5
    return [(x - mean) / (std + 1e-4) for x in rewards]
