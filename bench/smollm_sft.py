"""What one SFT epoch on collected trajectories does to a real small model (not a test).

    .venv/bin/python bench/smollm_sft.py [--tasks 6] [--max-steps 6] [--lr 1e-4]

SmolLM2-135M-Instruct (offline, `orchard model smollm2`) is evaluated on the first `--tasks`
example tasks under the `bash` harness, then fine-tuned for one epoch on trajectories the
scripted teacher collected on every example task (credit-assignment SFT: all resolved), then
evaluated again, in the same run. It prints the resolve rate, the share of replies the harness
could parse (a well-formed ```bash block) and the mean steps, before and after.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=6, help="example tasks to evaluate on")
    parser.add_argument("--max-steps", type=int, default=6, help="agent steps per episode")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="orchard-smollm-"))
    os.environ["ORCHARD_HOME"] = str(work / "home")  # a store of its own
    warnings.filterwarnings("ignore", category=FutureWarning)
    from sqlmodel import select
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from orchard.agents.loop import Limits
    from orchard.agents.models import ScriptedModel, TransformersModel
    from orchard.env import Client
    from orchard.eval.agent import agent_solver
    from orchard.eval.runner import evaluate
    from orchard.store import TrajectoryRecord, session
    from orchard.tasks import load_tasks
    from orchard.tasks.base import Prepare
    from orchard.train.config import SFTConfig
    from orchard.train.sft import sft_examples, train_sft
    from orchard.train.smollm import smollm2_folder

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    subprocess.run(
        [sys.executable, str(ROOT / "examples/tasks/make_repos.py"), str(work / "repos")],
        check=True,
        capture_output=True,
    )
    prepare = Prepare(work / "repos")
    tasks = load_tasks(ROOT / "examples/tasks/tasks.jsonl")
    chosen = tasks[: args.tasks]
    base = smollm2_folder()  # converted into the cache the first time

    def run_eval(client, path: Path, label: str):
        model = TransformersModel(str(path), max_new_tokens=args.max_new_tokens, name=label)
        started = time.monotonic()
        result = evaluate(
            chosen,
            ["bash"],
            1,
            agent_solver(model, Limits(episode_steps=args.max_steps)),
            client=client,
            prepare=prepare,
            config={"bench": "smollm", "model": label},
            name=label,
            concurrency=1,
        )
        with session() as db:
            records = list(db.exec(select(TrajectoryRecord).where(TrajectoryRecord.run_id == result.run_id)))
        steps = sum(t.steps for t in records)
        parsed = 1 - sum(t.format_errors for t in records) / max(1, steps)
        rate = result.summary["harnesses"]["bash"]["resolve_rate"]
        return rate, parsed, steps / max(1, len(records)), time.monotonic() - started

    with Client() as client:
        before = run_eval(client, base, "smollm2-before")
        collected = evaluate(
            tasks,
            ["bash"],
            1,
            agent_solver(ScriptedModel("gold")),
            client=client,
            prepare=prepare,
            config={"bench": "smollm", "collect": "scripted:gold"},
            name="collect",
            kind="collect",
        )
        examples = sft_examples(AutoTokenizer.from_pretrained(base), runs=[collected.run_id], max_length=2048)
        trained = train_sft(
            base,
            examples,
            work / "sft",
            SFTConfig(max_steps=-1, epochs=1.0, learning_rate=args.lr, max_length=2048),
        )
        after = run_eval(client, work / "sft", "smollm2-after-sft")
    print(f"\nSmolLM2-135M-Instruct, bash harness, {len(chosen)} example tasks, {args.max_steps} steps per episode")
    print(
        f"SFT: {trained['examples']} trajectories, {trained['steps']} steps, lr {args.lr:g}, {trained['seconds']:.0f} s"
    )
    print(f"{'':<12} {'resolved':>9} {'parsed replies':>15} {'steps':>6} {'eval s':>7}")
    for label, (rate, parsed, steps, seconds) in (("before", before), ("after SFT", after)):
        print(f"{label:<12} {rate:>9.0%} {parsed:>15.0%} {steps:>6.1f} {seconds:>7.0f}")


if __name__ == "__main__":
    main()
