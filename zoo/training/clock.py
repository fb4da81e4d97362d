"""The wall-clock seconds a run has trained, carried in its checkpoint across `--ckpt_path last` resumes.

Lightning saves a callback's `state_dict` in each checkpoint and hands it back to `load_state_dict` when a run
resumes from that checkpoint. A callback that reports training time (zoo.training.timeline's, the exported
release's) keeps one of these and forwards both calls to it, so that a run killed and resumed reports its whole
training time (up to its last checkpoint), not the part after the resume.
"""

from __future__ import annotations

import math
import time


class TrainingClock:
    def __init__(self):
        # seconds trained before this fit started, from the checkpoint; None: no record (a fresh run, or a
        # checkpoint that did not carry it)
        self.before: float | None = None
        self.started: float | None = None  # time.monotonic() at this fit's start

    def start(self) -> None:
        self.started = time.monotonic()

    def seconds(self) -> float:
        """Seconds trained so far, the part before a resume included where it was recorded."""
        return (self.before or 0.0) + (time.monotonic() - self.started if self.started is not None else 0.0)

    def state_dict(self) -> dict:
        return {"seconds": self.seconds()}

    def load_state_dict(self, state_dict) -> None:
        # a checkpoint zoo did not write may hold anything here: what is not a finite, non-negative number of
        # seconds is taken as no record (not a traceback)
        seconds = state_dict.get("seconds") if isinstance(state_dict, dict) else None
        ok = isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and math.isfinite(seconds) \
            and seconds >= 0
        self.before = float(seconds) if ok else None
