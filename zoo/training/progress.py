"""Lightning's progress bar, redrawn by the clock rather than at every step.

Lightning's default bar (Rich's where rich is installed, else TQDM's) redraws after every training step. For a
tiny model on a CPU that is not free: with two threads on two cores, `gpt-tiny`'s recipe took 39 ms a step with
it and 30 ms without it (500 steps, median; one thread: no difference), as the redraw runs while the compute
threads wait. A redraw every quarter second shows the same progress to a person at any step time.
"""

from __future__ import annotations

import time

from lightning.pytorch.callbacks import ProgressBar, RichProgressBar, TQDMProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE

INTERVAL = 0.25  # seconds between two redraws of the training bar


class _ByTheClock:
    """When a bar is due: the first step, then once `interval` seconds have passed, and always at the last."""

    interval = INTERVAL
    _drawn = -float("inf")

    def _due(self, current: int, total: int | float | None) -> bool:
        now = time.monotonic()
        if current == total or now - self._drawn >= self.interval:
            self._drawn = now
            return True
        return False


class TimedProgressBar(_ByTheClock, TQDMProgressBar):
    """TQDMProgressBar that redraws at most once every `interval` seconds, and always at the end of an epoch.

    Args:
        interval: the least time between two redraws, in seconds (default 0.25).
    """

    def __init__(self, interval: float = INTERVAL):
        super().__init__(refresh_rate=1)
        self.interval = interval

    def _should_update(self, current: int, total: int) -> bool:
        return self.is_enabled and self._due(current, total)


class TimedRichProgressBar(_ByTheClock, RichProgressBar):
    """RichProgressBar (Lightning's default where rich is installed) whose training bar redraws at most once every
    `interval` seconds, and always at the end of an epoch.

    Args:
        interval: the least time between two redraws, in seconds (default 0.25).
    """

    def __init__(self, interval: float = INTERVAL):
        super().__init__()
        self.interval = interval

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self._due(batch_idx + 1, self.total_train_batches):  # the bar's position is set, not counted up
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


def with_progress_bar(callbacks, enable_progress_bar: bool | None) -> list:
    """The Trainer's callbacks with a bar redrawn by the clock where Lightning would add its own (the bar is on and
    no ProgressBar was given), of the kind Lightning would pick; as given otherwise."""
    callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [] if callbacks is None else [callbacks]
    if enable_progress_bar is not False and not any(isinstance(c, ProgressBar) for c in callbacks):
        callbacks.append(TimedRichProgressBar() if _RICH_AVAILABLE else TimedProgressBar())
    return callbacks
