"""Several training processes (`accelerate launch`, `torchrun`, DeepSpeed): one does the sandbox work, all train.

Under `accelerate launch --num_processes N -m orchard train swe --config FILE` every process runs the
pipeline. Building images, collection, credit assignment, evaluation and the store's run records
happen once, on the main process, while the others wait for its result; the trainers (SFT, RL,
value) run on every process, data-parallel through accelerate. In RL each process rolls out the
BAR groups of its own share of the batch in its own sandboxes, and the BAR figures are summed over
processes before they are recorded.

The processes wait for the main one in `once` for as long as it collects (hours, days for a big
task set), so those waits go through a gloo group of their own with a long timeout, while the
trainers' collectives keep a timeout that still catches a hang: `TRAINING`, long enough for one
process to finish its rollouts while the others wait at the step's gather. A failure on the main
process is passed to the others, which stop with it instead of hanging.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from orchard.errors import OrchardError

T = TypeVar("T")
WAIT = timedelta(days=7)
"""How long the other processes wait for the main one (building images, collection, credit)."""
TRAINING = timedelta(hours=2)
"""The trainers' collectives: a hang shows after this long."""


class Launch:
    """The processes of this launch: one (a plain `orchard train swe`) or several."""

    def __init__(self, processes: int | None = None) -> None:
        """The launch this process belongs to; `processes=1`: this process on its own, no collectives."""
        self.processes = processes or int(os.environ.get("WORLD_SIZE", "1"))
        self._state: Any = None
        self._group: Any = None
        if self.processes > 1:
            import torch
            from accelerate import PartialState

            self._state = PartialState(cpu=not torch.cuda.is_available(), timeout=TRAINING)
            self._group = torch.distributed.new_group(backend="gloo", timeout=WAIT)

    @property
    def is_main(self) -> bool:
        return self._state is None or bool(self._state.is_main_process)

    def once(self, body: Callable[[], T]) -> T:
        """`body()` on the main process; its result, or its failure, on every process."""
        if self._state is None:
            return body()
        import torch

        outcome: list[Any] = [None]
        failure: BaseException | None = None
        if self.is_main:
            try:
                outcome = [("ok", body())]
            except BaseException as exc:  # passed on, then raised here
                failure = exc
                outcome = [("failed", f"{type(exc).__name__}: {exc}")]
        torch.distributed.broadcast_object_list(outcome, src=0, group=self._group)
        if failure is not None:
            raise failure
        kind, value = outcome[0]
        if kind == "failed":
            raise OrchardError(f"stopped: the main process failed ({value})")
        return value

    def close(self) -> None:
        """Leave the process group (a launch that ran to its end)."""
        if self._state is not None:
            import torch

            torch.distributed.destroy_process_group()

    def log(self, write: Callable[[str], None]) -> Callable[[str], None]:
        """`write` on the main process; silence on the others, so each line shows once."""
        return write if self.is_main else lambda _line: None
