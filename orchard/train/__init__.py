"""Training: the SWE recipe's stages (collection is `orchard.eval`), each on TRL or transformers."""

from __future__ import annotations

from typing import Any


def quiet(trainer: Any) -> Any:
    """No per-step printing or progress bars: Orchard reports stages itself, metrics go to the store."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer
