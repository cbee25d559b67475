"""Generation for rollouts on this CPU: transformers against llama.cpp's server (not a test).

    .venv/bin/python bench/generation.py [--episodes 8] [--concurrency 4] [--max-tokens 96]

SmolLM2-135M-Instruct (`orchard model smollm2`) plays the first turns of `--episodes` agent
episodes on generated SWE tasks under the `bash` harness, `--concurrency` at once, as an eval or
an RL stride does: turn 1 is the system prompt and the issue, turn 2 adds the reply and the
listing of the file to fix (what `scripted:sed` reads). Both backends render the same prompts
with the same tokenizer and generate greedily, `hf:` in this process (`TransformersModel`, one
sequence at a time) and `llama:` on `llama-server` (`orchard model llama-server`; bf16 GGUF,
continuous batching, prompt cache). It prints each backend's wall time and tokens per second,
and the ratio.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    from orchard.agents.bash import BashHarness
    from orchard.agents.llamacpp import LlamaCppModel, build
    from orchard.agents.models import TransformersModel
    from orchard.tasks import load_tasks
    from orchard.train.smollm import smollm2_folder

    hf_logging.set_verbosity_error()
    folder = smollm2_folder()
    build()
    work = Path(tempfile.mkdtemp(prefix="orchard-gen-bench-"))
    generate = [sys.executable, ROOT / "examples/tasks/generate.py", work, "--train", "1"]
    subprocess.run([*generate, "--held-out", str(args.episodes)], check=True, capture_output=True)
    tasks = load_tasks(work / "held-out.jsonl")
    harness = BashHarness()

    def episode(model: TransformersModel, task) -> int:
        row = task.model_dump()
        messages = [
            {"role": "system", "content": harness.system_prompt(row)},
            {"role": "user", "content": harness.task_prompt(row)},
        ]
        first = model.complete(messages, None)
        path = task.patch.split(" b/", 1)[1].split("\n", 1)[0]
        listing = subprocess.run(["cat", "-n", path], cwd=work / task.instance_id, capture_output=True, text=True)
        messages += [
            {"role": "assistant", "content": first.content},
            *harness.observation_messages(None, listing.stdout),
        ]
        second = model.complete(messages, None)
        return first.completion_tokens + second.completion_tokens

    timings = {}
    for label, make in (
        ("hf (transformers)", lambda: TransformersModel(str(folder), max_new_tokens=args.max_tokens)),
        (
            "llama (llama-server)",
            lambda: LlamaCppModel(str(folder), max_new_tokens=args.max_tokens, parallel=args.concurrency),
        ),
    ):
        model = make()
        episode(model, tasks[0])  # warm up: first calls, caches
        start = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            tokens = sum(pool.map(episode, [model] * len(tasks), tasks))
        seconds = time.perf_counter() - start
        timings[label] = seconds
        print(f"{label:22} {seconds:6.1f} s for {args.episodes} episodes x 2 turns, {tokens / seconds:6.1f} tokens/s")
        getattr(model, "close", lambda: None)()
    hf, llama = timings.values()
    print(f"llama-server is {hf / llama:.1f}x faster than transformers")


if __name__ == "__main__":
    main()
