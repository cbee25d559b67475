"""One SFT step of SmolLM2-135M-Instruct on this CPU: full fine-tuning or LoRA, fp32 or bf16 (not a test).

    .venv/bin/python bench/sft_step.py [--tokens 768] [--steps 4]

A training step (forward, backward, AdamW) on one sequence of `--tokens` tokens, the length of a
learning-run trajectory, for each of: full fine-tuning and LoRA (rank 16 on every linear layer),
each in float32 and under bf16 autocast. It prints each one's seconds per step (the mean after the
first, which warms up) and its ratio to full fine-tuning in float32, measured in the same run.

Then the same step (full, bf16) through the trainers: TRL's `SFTTrainer` as it ships (its loss
from a chunked fused LM head) against Orchard's CPU trainer (`orchard.train.sft.sft_trainer`: the
model's own cross-entropy), with the ratio between them and each one's first loss (the same).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=768)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from orchard.train.smollm import smollm2_folder

    hf_logging.set_verbosity_error()
    folder = smollm2_folder()
    torch.manual_seed(0)
    ids = torch.randint(0, 49152, (1, args.tokens))
    seconds = {}
    for lora in (False, True):
        for bf16 in (False, True):
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
            if lora:
                model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
            optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
            times = []
            for _ in range(args.steps):
                start = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                times.append(time.perf_counter() - start)
            label = f"{'LoRA' if lora else 'full'} {'bf16' if bf16 else 'fp32'}"
            seconds[label] = statistics.fmean(times[1:])
    baseline = seconds["full fp32"]
    for label, value in seconds.items():
        print(f"{label:10} {value:5.2f} s/step  {baseline / value:4.2f}x full fp32's speed")
    trainers(folder, ids[0].tolist(), args.steps)


def trainers(folder, ids: list[int], steps: int) -> None:
    """Seconds per step of TRL's `SFTTrainer` and of ours, full fine-tuning under bf16, on `ids`."""
    import tempfile

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTTrainer

    from orchard.train import quiet
    from orchard.train.config import SFTConfig
    from orchard.train.sft import sft_trainer, trl_arguments

    class Clock(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []

        def on_step_end(self, *_args, **_kwargs):
            self.ends.append(time.perf_counter())

    rows = [{"input_ids": ids, "labels": ids}] * (steps + 1)
    seconds, losses = {}, {}
    for label, trainer_class in (("TRL SFTTrainer", SFTTrainer), ("Orchard CPU trainer", sft_trainer())):
        clock = Clock()
        with tempfile.TemporaryDirectory() as out:
            trainer = trainer_class(
                model=AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
                args=trl_arguments(SFTConfig(bf16=True, epochs=1), out),
                train_dataset=Dataset.from_list(rows),
                processing_class=AutoTokenizer.from_pretrained(folder),
                callbacks=[clock],
            )
            quiet(trainer).train()
        seconds[label] = statistics.fmean(b - a for a, b in itertools.pairwise(clock.ends))
        losses[label] = next(e["loss"] for e in trainer.state.log_history if "loss" in e)
    slow = seconds["TRL SFTTrainer"]
    for label, value in seconds.items():
        print(f"{label:19} {value:5.2f} s/step  {slow / value:4.2f}x TRL's speed  first loss {losses[label]:.4f}")


if __name__ == "__main__":
    main()
