"""Callbacks that tests pass to `zoo fit` on its command line."""

import os
import signal

import lightning as L


class KillAtStep(L.Callback):
    """SIGKILL this process after optimizer step `step`: a crash that no handler can soften."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
