"""Data order and augmentation as functions of (seed, epoch): a resumed run replays its epochs exactly.

A Lightning checkpoint restores the weights, the optimizer and the loop, but not the
random number generators. Drawing the shuffle (and, through `set_epoch` on the dataset,
any augmentation) from a generator seeded by (seed, epoch) makes epoch e the same
whether the run got there in one go or was killed and resumed. Lightning calls
`set_epoch` at the start of every epoch, also through its DDP sampler wrapper.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Sampler


def epoch_generator(seed: int, epoch: int, index: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch * 100_003 + index)


class EpochSampler(Sampler[int]):
    """Every index once per epoch, in an order drawn from (seed, epoch); in order when shuffle is off.

    `resume(epoch, done)`: the next pass over `epoch` starts at its `done`-th index, after those a run resumed in
    the middle of that epoch has already trained on (zoo.training.resume). Its length stays the epoch's, so
    that Lightning's count of batches is the whole epoch's and the loop stops where an uninterrupted epoch would.
    """

    def __init__(self, dataset, seed: int = 0, shuffle: bool = True):
        self.dataset, self.seed, self.shuffle, self.epoch = dataset, seed, shuffle, 0
        self._resume: tuple[int, int] | None = None

    def resume(self, epoch: int, done: int) -> None:
        self._resume = (epoch, done) if done > 0 else None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.dataset)

    def __iter__(self):
        if self.shuffle:
            order = torch.randperm(len(self.dataset), generator=epoch_generator(self.seed, self.epoch)).tolist()
        else:
            order = list(range(len(self.dataset)))
        if self._resume is not None and self._resume[0] == self.epoch:
            order = order[self._resume[1]:]
            self._resume = None  # once: the epochs after it run whole
        return iter(order)


class RandomShift(Dataset):
    """Translation by up to `pad` samples along every spatial axis (zero padding); optionally a left-right flip.

    Items are (channels, *spatial) tensors of any rank; the shift of item i in epoch e
    is drawn from (seed, e, i).
    """

    def __init__(self, dataset, pad: int, flip: bool = False, seed: int = 0):
        self.dataset, self.pad, self.flip, self.seed, self.epoch = dataset, pad, flip, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        x, y = self.dataset[i]
        size = x.shape[1:]
        padded = F.pad(x, (self.pad,) * 2 * len(size))
        g = epoch_generator(self.seed, self.epoch, i)
        offsets = torch.randint(0, 2 * self.pad + 1, (len(size),), generator=g).tolist()
        x = padded[(slice(None), *(slice(o, o + n) for o, n in zip(offsets, size)))]
        if self.flip and torch.rand((), generator=g) < 0.5:
            x = x.flip(-1)
        return x, y
