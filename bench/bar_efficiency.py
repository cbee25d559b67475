"""Rollouts spent per informative GRPO group: fixed groups, oversample-and-filter, and BAR (not a test).

    .venv/bin/python bench/bar_efficiency.py [--tasks 2000] [--seed 0]

Tasks get success probabilities spread like a real SWE set for a mid-size open model: many it
never solves, some it rarely solves, fewer it often or always solves (the mix is printed). Each
method draws Bernoulli rollouts per task, in the same run with the same task set:

* fixed: one GRPO group of N = 8 per task, kept whatever it holds;
* oversample-and-filter (DAPO's dynamic sampling): groups of N until one is mixed, at most
  N_max = 16 rollouts per task;
* BAR with the paper's defaults (s = 16, N_max = 16) and with a smaller stride (s = 4, 8).

A group is informative when its rewards differ (else every GRPO advantage is zero). The figure
that matters is rollouts spent per informative group; the script prints it per method and its
ratio to fixed groups, plus the share of informative groups and how balanced they are.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchard.train.bar import BARConfig, Rollout, balanced_rollout

SPREAD = [  # (share of tasks, low, high) of the success probability
    (0.45, 0.0, 0.0),  # never solved
    (0.25, 0.02, 0.2),  # rarely
    (0.15, 0.2, 0.6),
    (0.10, 0.6, 0.95),
    (0.05, 1.0, 1.0),  # always
]


@dataclass
class Outcome:
    spent: int
    informative: bool
    positives: int
    size: int


def task_probabilities(n: int, rng: random.Random) -> list[float]:
    probabilities = []
    for share, low, high in SPREAD:
        probabilities += [rng.uniform(low, high) for _ in range(round(share * n))]
    return probabilities


def draw(p: float, k: int, rng: random.Random) -> list[Rollout]:
    return [Rollout(success=(s := rng.random() < p), reward=1.0 if s else -1.0) for _ in range(k)]


def fixed(p: float, rng: random.Random, n: int = 8) -> Outcome:
    group = draw(p, n, rng)
    wins = sum(r.success for r in group)
    return Outcome(n, 0 < wins < n, wins, n)


def oversample_filter(p: float, rng: random.Random, n: int = 8, budget: int = 16) -> Outcome:
    spent = 0
    while spent + n <= budget:
        group = draw(p, n, rng)
        spent += n
        wins = sum(r.success for r in group)
        if 0 < wins < n:
            return Outcome(spent, True, wins, n)
    return Outcome(spent, False, wins, n)


def bar(p: float, rng: random.Random, config: BARConfig) -> Outcome:
    group = balanced_rollout(lambda k: draw(p, k, rng), config)
    return Outcome(group.spent, group.informative, group.positives, len(group.rollouts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    tasks = task_probabilities(args.tasks, rng)
    methods = {
        "fixed groups (N=8)": lambda p: fixed(p, rng),
        "oversample-and-filter (N=8, max 16)": lambda p: oversample_filter(p, rng),
        "BAR paper defaults (s=16, N_max=16)": lambda p: bar(p, rng, BARConfig()),
        "BAR s=8 (N_max=16)": lambda p: bar(p, rng, BARConfig(stride=8)),
        "BAR s=4 (N_max=16)": lambda p: bar(p, rng, BARConfig(stride=4)),
    }
    figures: dict[str, dict] = {}
    print(
        f"{len(tasks)} tasks; success-probability mix: " + ", ".join(f"{s:.0%} in [{lo}, {hi}]" for s, lo, hi in SPREAD)
    )
    for title, chosen in (
        ("all tasks", tasks),
        (
            "tasks solved sometimes, never always (what a pass-rate filter from collection keeps)",
            [p for p in tasks if 0 < p < 1],
        ),
    ):
        print(f"\n{title}: {len(chosen)} tasks")
        print(
            f"{'method':<38} {'rollouts':>9} {'informative':>12} {'per informative':>16} {'vs fixed':>9} {'balanced':>9} {'per balanced':>13} {'vs fixed':>9}"
        )
        base = base_balanced = None
        figures[title.split(" (")[0]] = rows = {}
        for name, method in methods.items():
            outcomes = [method(p) for p in chosen]
            spent = sum(o.spent for o in outcomes)
            informative = [o for o in outcomes if o.informative]
            balanced = [o for o in informative if 0.375 <= o.positives / o.size <= 0.625]
            per, per_balanced = spent / max(1, len(informative)), spent / max(1, len(balanced))
            base, base_balanced = base or per, base_balanced or per_balanced
            rows[name] = {
                "per_informative": per,
                "per_balanced": per_balanced,
                "informative_share": len(informative) / len(outcomes),
                "balanced_share": len(balanced) / max(1, len(informative)),
            }
            print(
                f"{name:<38} {spent:>9} {len(informative) / len(outcomes):>11.1%} {per:>16.2f} {base / per:>8.2f}x "
                f"{len(balanced) / max(1, len(informative)):>8.1%} {per_balanced:>13.2f} {base_balanced / per_balanced:>8.2f}x"
            )
    print(
        "\n'vs fixed': how many times fewer rollouts than fixed groups each (balanced) informative group costs; "
        "'balanced': share of informative groups with n+/N in [0.375, 0.625]."
    )
    from orchard.store.runs import record_bench

    print(f"recorded as run {record_bench('bar-efficiency', vars(args), figures)}")


if __name__ == "__main__":
    main()
