"""Several training processes (`accelerate launch`, `torchrun`, DeepSpeed): one does the sandbox work, all train.

Under `accelerate launch --num_processes N -m orchard train swe --config FILE` every process runs the
pipeline. Building images, collection, credit assignment, evaluation and the store's run records
happen once, on the main process, while the others wait for its result; the trainers (SFT, RL,
value) run on every process, data-parallel through accelerate. In RL each process rolls out the
BAR groups of its own share of the batch in its own sandboxes, and the BAR figures are summed over
processes before they are recorded.

Waiting processes sit in a collective for as long as the main process collects (hours, for a real
task set), so the process group is created here, before any trainer, with a long timeout. A
failure on the main process is passed to the others, which stop with it instead of hanging.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from orchard.errors import OrchardError

T = TypeVar("T")
WAIT = timedelta(days=2)
"""How long the other processes wait for the main one in a collective (collection, credit, eval)."""


class Launch:
    """The processes of this launch: one (a plain `orchard train swe`) or several."""

    def __init__(self) -> None:
        self.processes = int(os.environ.get("WORLD_SIZE", "1"))
        self._state: Any = None
        if self.processes > 1:
            import torch
            from accelerate import PartialState

            self._state = PartialState(cpu=not torch.cuda.is_available(), timeout=WAIT)

    @property
    def is_main(self) -> bool:
        return self._state is None or bool(self._state.is_main_process)

    def once(self, body: Callable[[], T]) -> T:
        """`body()` on the main process; its result, or its failure, on every process."""
        if self._state is None:
            return body()
        from accelerate.utils import broadcast_object_list

        outcome: list[Any] = [None]
        failure: BaseException | None = None
        if self.is_main:
            try:
                outcome = [("ok", body())]
            except BaseException as exc:  # passed on, then raised here
                failure = exc
                outcome = [("failed", f"{type(exc).__name__}: {exc}")]
        broadcast_object_list(outcome, from_process=0)
        if failure is not None:
            raise failure
        kind, value = outcome[0]
        if kind == "failed":
            raise OrchardError(f"stopped: the main process failed ({value})")
        return value

    def log(self, write: Callable[[str], None]) -> Callable[[str], None]:
        """`write` on the main process; silence on the others, so each line shows once."""
        return write if self.is_main else lambda _line: None
