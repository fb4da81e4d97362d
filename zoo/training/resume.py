"""A run resumed in the middle of an epoch goes on with the batches it had not trained on.

Lightning restores the weights, the optimizer and its loops' counts from a checkpoint, but it starts the
epoch's data loader again from its first batch: a run resumed from a checkpoint saved mid-epoch (every N
steps, as the long recipes keep one) trains on the epoch's first batches twice and never sees its last ones.
zoo's samplers (`EpochSampler`) draw each epoch's order from (seed, epoch), so the order is known again after a
restart; this callback tells the training loader's sampler how many of its indices the epoch had already used,
and the resumed run sees exactly the batches an uninterrupted one would have.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

from zoo.data.sampling import EpochSampler


class ResumeMidEpoch(Callback):
    """Added by zoo's Trainer: on the epoch a checkpoint resumed in the middle of, skip what it already trained.

    One process only: a distributed run's sampler is Lightning's wrapper, which shuffles its split of our order
    again, and it resumes as Lightning does, from the epoch's first batch."""

    def on_train_start(self, trainer, pl_module) -> None:
        # the batches of this epoch whose optimizer step the checkpoint holds (saved at a step's end, the last
        # one is processed but not yet counted completed)
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        loader = trainer.train_dataloader
        if not trainer.fit_loop.restarted_mid_epoch or not done or loader is None:
            return
        sampler = getattr(loader, "sampler", None)
        if isinstance(sampler, EpochSampler):  # another sampler: Lightning's way, the epoch from its start
            sampler.resume(trainer.current_epoch, done * loader.batch_size)
