"""Training: the recipe's stages for tasks of any kind (collection is `orchard.eval`), each on TRL or
transformers, each taking its config from `orchard.train.config`."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def quiet(trainer: Any) -> Any:
    """No per-step printing or progress bars: Orchard reports stages itself, metrics go to the store."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


def shared_args() -> dict[str, Any]:
    """Training arguments every Orchard trainer takes: log each step (to the store through
    `StoreMetrics`), save only at the end, report nowhere else, keep the log level of replicas
    (a multi-process launch), and run on the CPU where there is no GPU."""
    import torch

    return {
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "log_level_replica": "passive",
        "use_cpu": not torch.cuda.is_available(),
    }


def lora_config(rank: int, task_type: str = "CAUSAL_LM") -> Any:
    """LoRA on every linear layer of the model (peft, the `lora` extra)."""
    try:
        from peft import LoraConfig
    except ImportError:
        from orchard.errors import ConfigError

        raise ConfigError("lora: true needs peft: pip install 'orchard-agents[lora]'") from None
    return LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", task_type=task_type)


def save_trained(trainer: Any, output_dir: str | Path) -> None:
    """The trained model and its tokenizer as a full checkpoint in `output_dir`, written by the main process.

    LoRA adapters are merged into the base weights first, so the next stage, `orchard eval --model
    hf:DIR` and vLLM all load the folder as an ordinary model."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(model, "merge_and_unload"):  # a peft model
        merged = model.merge_and_unload()
        if trainer.accelerator.is_main_process:
            merged.save_pretrained(str(output_dir))
    else:
        trainer.save_model(str(output_dir))
    if trainer.accelerator.is_main_process:
        trainer.processing_class.save_pretrained(str(output_dir))
    trainer.accelerator.wait_for_everyone()
