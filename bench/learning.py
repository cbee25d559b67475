"""The learning run: SmolLM2-135M-Instruct before and after Orchard's pipeline, on held-out tasks (not a test).

    .venv/bin/python bench/learning.py [--train 200] [--held-out 50] [--seed 0] [--config FILE]

Makes what `examples/configs/swe-smollm.yaml` needs, once (SmolLM2 in Orchard's model cache,
llama.cpp's server, the generated training and held-out tasks in
`$ORCHARD_CACHE_DIR/learning-tasks`), runs the recipe as `orchard train swe --config` would (a
rerun continues where it stopped; delete `$ORCHARD_HOME/train/swe-smollm` and the runs
`orchard runs ls` lists to start again), and prints its report: every checkpoint's held-out
resolve rate with its 95% interval, the changes, best-of-k with the value model, BAR's cost
against fixed groups, and the seconds each stage took. The report's files are `report.md` and
`report.json` in the work dir.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", type=int, default=200, help="generated training tasks")
    parser.add_argument("--held-out", type=int, default=50, help="generated held-out tasks")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", type=Path, default=ROOT / "examples/configs/swe-smollm.yaml")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    from transformers.utils import logging as hf_logging

    from orchard.agents.llamacpp import build
    from orchard.config import settings
    from orchard.train.pipeline import load_config, run_recipe
    from orchard.train.smollm import smollm2_folder

    hf_logging.set_verbosity_error()  # as `orchard train` does: the stages report themselves
    hf_logging.disable_progress_bar()
    started = time.monotonic()
    print(f"SmolLM2-135M-Instruct: {smollm2_folder()}")
    print(f"llama.cpp: {build()}")
    tasks = settings().cache_dir / "learning-tasks"
    wanted = {"train": args.train, "held_out": args.held_out, "seed": args.seed}
    stamp = tasks / "generated.json"
    if not stamp.is_file() or json.loads(stamp.read_text()) != wanted:
        generate = [sys.executable, str(ROOT / "examples/tasks/generate.py"), str(tasks), "--force"]
        generate += ["--train", str(args.train), "--held-out", str(args.held_out), "--seed", str(args.seed)]
        subprocess.run(generate, check=True)
        stamp.write_text(json.dumps(wanted))
    prepared = time.monotonic() - started
    config = load_config(args.config)
    run_recipe(config, recipe="swe")
    report = Path(config.work_dir) / "report.md"
    print(report.read_text())
    print(f"set-up {prepared:.0f} s; everything {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
