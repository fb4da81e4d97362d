"""Sequence-to-sequence data for causal text models: (input ids, target ids), targets -100 where nothing is scored.

`SequenceData` is the base of the tasks generated from a seed (zoo/data/synthetic.py): a fresh
training stream each epoch, and fixed validation and test sets that do not depend on the run's
seed, so that every run of a study is tested on the same sequences. The test set holds one set
per test length: the training length first, then the longer ones (length generalization).

Two tasks here read real data: `PixelMNIST`, Long Range Arena's 'Image' task on MNIST (Tay et
al. 2021), and `LongContextText`, character-level language modelling on a long text whose loss
`zoo.training.SequenceTask` reports by token position.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset, random_split

from zoo.data.arrays import check_fraction
from zoo.data.sampling import EpochSampler
from zoo.data.text import FixedWindows, RandomWindows
from zoo.data.vision import MNIST
from zoo.models.tokenizer import CharTokenizer
from zoo.utils.checks import integer, shown

IGNORE = -100  # F.cross_entropy's default ignore_index: the positions a task does not score
# Seeds of the fixed sets. torch's CPU generator keeps only a seed's low 32 bits (manual_seed(2**62) draws what
# manual_seed(0) draws), so two sequences drawn through it are apart only where their seeds differ there. With 2**61
# and 2**62 they did not: validation was the first sequences of test. Validation sits 2**23 above test in the low
# 32 bits at every length, so the two never share a seed while a set holds at most MAX_FIXED. The training streams
# of seeds 0 to 3 (item_seed, up to ten epochs of 100,000) lie below TRAINING_SEEDS there; test sets at lengths
# that are multiples of 256 (length * 2**24 wraps to 0) landed on them, so test sequence i began as seed 0's
# training sequence i (at another length: for MQAR the same key-value pairs). Such a seed moves up by
# TRAINING_SEEDS, into the room below validation; every other set keeps its seeds.
VAL_SEED, TEST_SEED = 2**61 + 2**23, 2**62
TRAINING_SEEDS = 2**22
MAX_FIXED = 2**22  # so that a set moved up by TRAINING_SEEDS ends below validation's 2**23
# the longest sequence a task draws (training or test length). A sequence is built whole, with float64 weights for
# MQAR's query slots: tens of MB at 2**20, while 10**9 (under the old limit, 2**31 - 1) failed or exhausted memory
# only when the data was drawn. The fixed sets still grow with their sample counts (samples x length x 16 bytes).
MAX_LENGTH = 2**20


def item_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of training item `index` in `epoch` (zoo.data.sampling.epoch_generator's numbering)."""
    return seed * 1_000_003 + epoch * 100_003 + index


def fixed_seed(base: int, length: int, index: int) -> int:
    """The seed of item `index` of the fixed set `base` (VAL_SEED, TEST_SEED) at `length`."""
    seed = base + length * 2**24 + index
    return seed + TRAINING_SEEDS if seed % 2**32 < TRAINING_SEEDS else seed


class Stream(Dataset):
    """`samples` examples drawn anew each epoch: item i of epoch e is example(length, seed of (seed, e, i))."""

    def __init__(self, example, length: int, samples: int, seed: int):
        self.example, self.length, self.samples, self.seed, self.epoch = example, length, samples, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self):
        return self.samples

    def __getitem__(self, i):
        return self.example(self.length, item_seed(self.seed, self.epoch, i))


def fixed_set(example, length: int, samples: int, base: int) -> TensorDataset:
    pairs = [example(length, fixed_seed(base, length, i)) for i in range(samples)]
    return TensorDataset(torch.stack([x for x, _ in pairs]), torch.stack([y for _, y in pairs]))


def check_lengths(test_lengths, train_length: int, owner: str) -> list[int]:
    """The lengths to test at: the training length first, then the given ones (each checked, no repeats)."""
    if test_lengths is None:
        return [train_length]
    if isinstance(test_lengths, (str, bytes)) or not isinstance(test_lengths, (list, tuple)):
        raise TypeError(f"{owner} test_lengths must be a list of integers (e.g. [64, 128, 256]), "
                        f"got {shown(test_lengths)}")
    lengths = [train_length]
    for length in test_lengths:
        length = integer(length, "test_lengths entry", owner, maximum=MAX_LENGTH)
        if length not in lengths:
            lengths.append(length)
    return lengths


class SequenceData(L.LightningDataModule):
    """Generated tasks. Subclasses set `vocab_size`, check their own arguments, and implement
    `check_length(length, name)` (a ValueError naming `name` for a length the task cannot fill) and
    `example(length, seed)` -> (inputs, targets), two int64 tensors of `length`.

    Args:
        sequence_length: the training length, at most MAX_LENGTH (2**20).
        test_lengths: lengths to test at besides sequence_length (length generalization), e.g. 2x to 16x it;
            each at most MAX_LENGTH.
        batch_size: sequences per training batch (test batches at longer lengths hold as many tokens).
        train_samples: training sequences per epoch, drawn anew each epoch from (seed, epoch, index).
        val_samples: sequences of the fixed validation set (at sequence_length).
        test_samples: sequences of the fixed test set at each test length.
        seed: the training stream's seed; the validation and test sets are the same for every seed.
        num_workers: DataLoader worker processes.
    """

    vocab_size: int
    name = ""

    def __init__(self, sequence_length: int, test_lengths: list[int] | None, batch_size: int, train_samples: int,
                 val_samples: int, test_samples: int, seed: int, num_workers: int = 0):
        super().__init__()
        owner = type(self).__name__
        self.sequence_length = integer(sequence_length, "sequence_length", owner, maximum=MAX_LENGTH)
        self.check_length(self.sequence_length, "sequence_length")
        self.test_lengths = check_lengths(test_lengths, self.sequence_length, owner)
        for i, length in enumerate(test_lengths or []):
            self.check_length(length, f"test_lengths[{i}]")
        self.batch_size = integer(batch_size, "batch_size", owner)
        self.train_samples = integer(train_samples, "train_samples", owner)
        self.val_samples = integer(val_samples, "val_samples", owner, 1, MAX_FIXED)
        self.test_samples = integer(test_samples, "test_samples", owner, 1, MAX_FIXED)
        self.seed = integer(seed, "seed", owner, 0, 2**32 - 1)
        self.num_workers = integer(num_workers, "num_workers", owner, 0)
        self.val_set = self.test_sets = None

    def check_length(self, length: int, name: str) -> None:
        raise NotImplementedError

    def example(self, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    @property
    def data_info(self) -> dict:
        return {"vocab_size": self.vocab_size, "context_length": self.sequence_length,
                "test_lengths": list(self.test_lengths)}

    def arguments(self) -> dict:
        """The task's own arguments, for describe()."""
        return {}

    def describe(self) -> dict:
        args = {**self.arguments(), "sequence_length": self.sequence_length, "test_lengths": self.test_lengths,
                "batch_size": self.batch_size, "seed": self.seed}
        return {"name": self.name or type(self).__name__, "hub_id": None,
                "class_path": f"{type(self).__module__}.{type(self).__qualname__}", "init_args": args,
                "splits": f"{self.train_samples:,} training sequences drawn anew each epoch from seed {self.seed}; "
                          f"{self.val_samples:,} validation and {self.test_samples:,} test sequences per length "
                          f"(lengths {', '.join(map(str, self.test_lengths))}), fixed for every seed"}

    def setup(self, stage: str | None = None):
        if self.val_set is None:
            self.val_set = fixed_set(self.example, self.sequence_length, self.val_samples, VAL_SEED)
        if stage in (None, "test") and self.test_sets is None:
            self.test_sets = [fixed_set(self.example, n, self.test_samples, TEST_SEED) for n in self.test_lengths]

    def train_dataloader(self):
        stream = Stream(self.example, self.sequence_length, self.train_samples, self.seed)
        return DataLoader(stream, batch_size=self.batch_size, sampler=EpochSampler(stream, shuffle=False),
                          num_workers=self.num_workers)

    def val_dataloader(self):
        self.setup("validate")
        return DataLoader(self.val_set, batch_size=self.batch_size, num_workers=self.num_workers)

    def test_dataloader(self):
        """One loader per test length, in the order of `test_lengths`."""
        self.setup("test")
        # longer sequences in smaller batches, so that a batch holds about as many tokens at every length
        return [DataLoader(s, batch_size=max(1, self.batch_size * self.sequence_length // n),
                           num_workers=self.num_workers) for s, n in zip(self.test_sets, self.test_lengths)]


class ClassificationSequences(Dataset):
    """Sequences of tokens with one label each, scored at the last position (what a causal model has read
    whole there): targets are -100 everywhere else."""

    def __init__(self, tokens: torch.Tensor, labels: torch.Tensor, order: torch.Tensor | None = None):
        self.tokens, self.labels, self.order = tokens, labels, order

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        x = self.tokens[i].long()
        if self.order is not None:
            x = x[self.order]
        y = torch.full_like(x, IGNORE)
        y[-1] = self.labels[i]
        return x, y


PERMUTATION_SEED = 0  # the one fixed permutation of the permuted task, the same for every run


class PixelMNIST(L.LightningDataModule):
    """MNIST read one pixel at a time: 784 tokens, each pixel's 8-bit value (vocabulary 256), row by row
    or, with `permute`, in one fixed random order (pMNIST). Long Range Arena's 'Image' task (Tay et al.
    2021, there on CIFAR-10) on the real data we have.

    A classification of the whole sequence: a causal model is scored at the last pixel, the first position
    that has read the whole image; its answer is the token id of the class (0-9). 10% of the training
    split, held out with `seed`, validates; the official test split tests.

    Args:
        root: the folder that holds MNIST/ (torchvision's layout).
        permute: read the pixels in one fixed random order (permuted MNIST) instead of row by row.
        batch_size: sequences per training batch (LRA: 50).
        val_fraction: the share of the training split held out for validation, with `seed`.
        seed: the held-out split's and the training order's seed.
        download: fetch MNIST with torchvision when it is not under root.
        num_workers: DataLoader worker processes.
    """

    name = "pixel MNIST"
    vocab_size, length = 256, 784

    def __init__(self, root: str = "data", permute: bool = False, batch_size: int = 50, val_fraction: float = 0.1,
                 seed: int = 0, download: bool = True, num_workers: int = 0):
        super().__init__()
        if not isinstance(permute, bool):
            raise TypeError(f"PixelMNIST permute must be true or false, got {shown(permute)}")
        check_fraction("val_fraction", val_fraction, "the share of the training split held out for validation")
        self.root, self.permute, self.download = root, permute, download
        self.batch_size = integer(batch_size, "batch_size", "PixelMNIST")
        self.seed = integer(seed, "seed", "PixelMNIST", 0, 2**32 - 1)
        self.val_fraction, self.num_workers = val_fraction, num_workers
        self.order = (torch.randperm(self.length, generator=torch.Generator().manual_seed(PERMUTATION_SEED))
                      if permute else None)
        self.train_set = self.val_set = self.test_set = None

    @property
    def data_info(self) -> dict:
        return {"vocab_size": self.vocab_size, "context_length": self.length, "test_lengths": [self.length]}

    def describe(self) -> dict:
        return {"name": "permuted pixel MNIST" if self.permute else self.name, "hub_id": "ylecun/mnist",
                "class_path": f"{type(self).__module__}.{type(self).__qualname__}",
                "init_args": {"permute": self.permute, "batch_size": self.batch_size, "val_fraction": self.val_fraction,
                              "seed": self.seed},
                "splits": f"{len(self.train_set):,} training, {len(self.val_set):,} validation (held out with seed "
                          f"{self.seed}), {len(self.test_set):,} test (official test split)"}

    def _sequences(self, split: str) -> ClassificationSequences:
        images, labels = MNIST(root=self.root, download=self.download, augment=False).load(split)
        pixels = (images.flatten(1) * 255).round().to(torch.uint8)  # back to the stored 8-bit values
        return ClassificationSequences(pixels, labels, self.order)

    def setup(self, stage: str | None = None):
        if self.train_set is None:
            full = self._sequences("train")
            n_val = int(len(full) * self.val_fraction)
            self.train_set, self.val_set = random_split(full, [len(full) - n_val, n_val],
                                                        generator=torch.Generator().manual_seed(self.seed))
            self.test_set = self._sequences("test")

    def train_dataloader(self):
        sampler = EpochSampler(self.train_set, seed=self.seed)
        return DataLoader(self.train_set, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=self.batch_size * 2, num_workers=self.num_workers)

    def test_dataloader(self):
        return [DataLoader(self.test_set, batch_size=self.batch_size * 2, num_workers=self.num_workers)]


STDLIB = "stdlib"
# the standard library's tests hold deliberately broken and non-UTF-8 files; site-packages is not the library
NOT_STDLIB = {"site-packages", "test", "tests", "idle_test"}


def stdlib_text() -> tuple[str, str]:
    """The Python standard library's own .py source, its files in sorted order; and where it came from.
    It differs between Python versions: the description names the version's folder."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not NOT_STDLIB & set(p.relative_to(root).parts[:-1]))
    if not files:
        raise FileNotFoundError(f"no Python source found under {root} (the standard library's folder); "
                                "set data.path to a UTF-8 text file instead")
    text = "".join(f"# file: {p.relative_to(root)}\n{p.read_text(encoding='utf-8', errors='replace')}\n"
                   for p in files)
    return text, f"{len(files)} .py files of {root}"


def encode_chars(tokenizer: CharTokenizer, text: str) -> torch.Tensor:
    """tokenizer.encode(text) as one lookup of code points (its characters are sorted by code point): the
    standard library's 12 M characters in well under a second, not half a minute. Every character of `text`
    must be in the tokenizer (built from the same text)."""
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    vocabulary = np.frombuffer(tokenizer.chars.encode("utf-32-le"), dtype=np.uint32)
    return torch.from_numpy(np.searchsorted(vocabulary, points).astype(np.int64))


class LongContextText(L.LightningDataModule):
    """Character-level language modelling over long windows, scored at every position: SequenceTask
    reports the loss by token position (1, 2-3, 4-7, ... tokens of context before it), so a reader sees
    whether a model uses context 1k, 4k or 16k tokens back.

    path: a UTF-8 text file (War and Peace: ../shared/data/warpeace/warpeace_input.txt), or "stdlib", the
    Python standard library's own source (present on every machine). The first `train_fraction` of the text
    trains (random windows); the rest validates and tests in consecutive windows.

    Args:
        path: a UTF-8 text file, or "stdlib" for the Python standard library's source.
        context_length: tokens per window; the loss is reported by position within it.
        batch_size: windows per batch.
        train_samples: random training windows per epoch.
        val_windows: consecutive validation (and test) windows at most; all when None.
        train_fraction: the share of the text, from its start, to train on.
        seed: the training windows' seed.
        num_workers: DataLoader worker processes.
    """

    def __init__(self, path: str = STDLIB, context_length: int = 1024, batch_size: int = 8,
                 train_samples: int = 8_000, val_windows: int | None = 64, train_fraction: float = 0.9,
                 seed: int = 0, num_workers: int = 0):
        super().__init__()
        owner = "LongContextText"
        self.context_length = integer(context_length, "context_length", owner)
        self.batch_size = integer(batch_size, "batch_size", owner)
        self.train_samples = integer(train_samples, "train_samples", owner)
        if val_windows is not None:
            val_windows = integer(val_windows, "val_windows", owner)
        self.seed = integer(seed, "seed", owner, 0, 2**32 - 1)
        check_fraction("train_fraction", train_fraction, "the share of the text to train on; the rest validates")
        if path == STDLIB:
            text, self.source = stdlib_text()
            self.dataset, self.file_name = "Python standard library source", None
        else:
            file = Path(path).expanduser()
            if not file.is_file():
                raise FileNotFoundError(f"text file not found: {file}; set data.path to a UTF-8 text file or "
                                        f"to {STDLIB!r} (the Python standard library's source)")
            try:  # utf-8-sig: War and Peace starts with a byte-order mark, which is no character of the text
                text = file.read_text(encoding="utf-8-sig")
            except UnicodeDecodeError as e:
                raise ValueError(f"{file} is not UTF-8 text: byte {e.start:,} ({e.reason}); set data.path to a "
                                 "UTF-8 text file") from None
            self.source, self.dataset = str(file), file.stem
            self.file_name = f"{file.parent.name}/{file.name}"  # as CharText: relative to a data root
        self.tokenizer = CharTokenizer.from_text(text)
        split = int(len(text) * train_fraction)
        self.train_tokens, self.val_tokens = encode_chars(self.tokenizer, text[:split]), encode_chars(
            self.tokenizer, text[split:])
        if min(len(self.train_tokens), len(self.val_tokens)) <= self.context_length:
            raise ValueError(f"{self.source} gives {len(self.train_tokens):,} training and {len(self.val_tokens):,} "
                             f"validation characters (train_fraction={train_fraction}); each split needs more than "
                             f"context_length={self.context_length}: use a longer text or a shorter context")
        self.val_windows, self.train_fraction, self.num_workers = val_windows, train_fraction, num_workers

    @property
    def data_info(self) -> dict:
        return {"vocab_size": self.tokenizer.vocab_size, "tokenizer": self.tokenizer.to_dict(),
                "context_length": self.context_length, "test_lengths": [self.context_length],
                "loss_by_position": True}

    def describe(self) -> dict:
        """The data in a model card's words; `zoo check` rebuilds it from these (a file under its data root)."""
        args = {"context_length": self.context_length, "batch_size": self.batch_size,
                "val_windows": self.val_windows, "train_fraction": self.train_fraction, "seed": self.seed}
        if self.file_name:
            where = {"file": self.file_name}
        else:  # it differs between Python versions: the source names the version's folder
            where, args["path"] = {"source": self.source}, STDLIB
        return {"name": self.dataset, "hub_id": None, **where,
                "class_path": f"{type(self).__module__}.{type(self).__qualname__}", "init_args": args,
                "splits": f"first {len(self.train_tokens):,} characters training, last {len(self.val_tokens):,} "
                          f"validation and test (character tokenizer, {self.tokenizer.vocab_size} tokens)"}

    def train_dataloader(self):
        windows = RandomWindows(self.train_tokens, self.context_length, self.train_samples, self.seed)
        return DataLoader(windows, batch_size=self.batch_size, sampler=EpochSampler(windows, shuffle=False),
                          num_workers=self.num_workers)

    def val_dataloader(self):
        windows = FixedWindows(self.val_tokens, self.context_length, self.val_windows)
        return DataLoader(windows, batch_size=self.batch_size, num_workers=self.num_workers)

    def test_dataloader(self):
        return self.val_dataloader()  # as CharText: the held-out end of the text, in one loader
