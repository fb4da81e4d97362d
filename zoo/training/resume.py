"""A run resumed in the middle of an epoch goes on with the batches it had not trained on.

Lightning restores the weights, the optimizer and its loops' counts from a checkpoint, but it starts the
epoch's data loader again from its first batch: a run resumed from a checkpoint saved mid-epoch (every N
steps, as the long recipes keep one) trains on the epoch's first batches twice and never sees its last ones.
zoo's samplers (`EpochSampler`) draw each epoch's order from (seed, epoch), so the order is known again after a
restart; this callback tells the training loader's sampler how many of its indices the epoch had already used,
and the resumed run sees exactly the batches an uninterrupted one would have.

Lightning then warns that the loader "is not resumable" and that results may be unreliable (it knows only
loaders with a `state_dict`): for a loader this callback resumed that is not so, and the warning is held back
for that run, with a line saying what was done instead. Any other loader keeps Lightning's warning.
"""

from __future__ import annotations

import warnings

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from zoo.data.sampling import EpochSampler

# Lightning's warning (lightning.pytorch.loops.training_epoch_loop) when a run restarts mid-epoch with a loader
# that has no state_dict
NOT_RESUMABLE = r"You're resuming from a checkpoint that ended before the epoch ended"


class ResumeMidEpoch(Callback):
    """Added by zoo's Trainer: on the epoch a checkpoint resumed in the middle of, skip what it already trained.

    One process only: a distributed run's sampler is Lightning's wrapper, which shuffles its split of our order
    again, and it resumes as Lightning does, from the epoch's first batch."""

    def __init__(self) -> None:
        self._holding_back: warnings.catch_warnings | None = None

    def on_train_start(self, trainer, pl_module) -> None:
        # the batches of this epoch whose optimizer step the checkpoint holds (saved at a step's end, the last
        # one is processed but not yet counted completed)
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        loader = trainer.train_dataloader
        if not trainer.fit_loop.restarted_mid_epoch or not done or loader is None:
            return
        sampler = getattr(loader, "sampler", None)
        if not isinstance(sampler, EpochSampler):  # another sampler: Lightning's way, the epoch from its start
            return
        sampler.resume(trainer.current_epoch, done * loader.batch_size)
        rank_zero_info(f"Resuming epoch {trainer.current_epoch} after its batch {done} of {len(loader)}: the "
                       "epoch's other batches follow, in their order")
        # the epoch loop warns as it starts, after this hook and before the first batch
        self._holding_back = warnings.catch_warnings()
        self._holding_back.__enter__()
        warnings.filterwarnings("ignore", message=NOT_RESUMABLE)

    def _release(self) -> None:
        if self._holding_back is not None:
            self._holding_back.__exit__(None, None, None)
            self._holding_back = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._release()

    def on_train_end(self, trainer, pl_module) -> None:
        self._release()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._release()
