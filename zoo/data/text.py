"""Character-level text from any file: first 90% to train, last 10% to validate, random windows."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from zoo.data.sampling import EpochSampler, epoch_generator
from zoo.tokenizer import TOKENIZERS


class RandomWindows(Dataset):
    """`samples` windows of `context + 1` tokens at random offsets, drawn anew each epoch from a seed."""

    def __init__(self, tokens: torch.Tensor, context: int, samples: int, seed: int):
        if len(tokens) <= context:
            raise ValueError(f"text of {len(tokens)} tokens is too short for context_length={context}")
        self.tokens, self.context, self.samples, self.seed = tokens, context, samples, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self):
        return self.samples

    def __getitem__(self, i):
        g = epoch_generator(self.seed, self.epoch, i)
        start = int(torch.randint(0, len(self.tokens) - self.context, (1,), generator=g))
        chunk = self.tokens[start : start + self.context + 1]
        return chunk[:-1], chunk[1:]


class FixedWindows(Dataset):
    """Consecutive non-overlapping windows, for a deterministic validation loss."""

    def __init__(self, tokens: torch.Tensor, context: int, limit: int | None):
        self.tokens, self.context = tokens, context
        self.count = (len(tokens) - 1) // context
        if limit:
            self.count = min(self.count, limit)

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        chunk = self.tokens[i * self.context : (i + 1) * self.context + 1]
        return chunk[:-1], chunk[1:]


HUB_DATASETS = {"tinyshakespeare": "karpathy/tiny_shakespeare"}


class CharText(L.LightningDataModule):
    """path: a UTF-8 text file (tiny-shakespeare's input.txt by default, under root).

    tokenizer: "char" (one token per distinct character) or "bpe" (byte-level BPE with
    `vocab_size` tokens, trained on the training part only, from the `tokenizers` library).
    """

    def __init__(self, path: str = "data/tinyshakespeare/input.txt", context_length: int = 64, batch_size: int = 12,
                 train_samples: int = 24_000, val_windows: int | None = None, train_fraction: float = 0.9,
                 seed: int = 0, num_workers: int = 0, tokenizer: str = "char", vocab_size: int = 512):
        super().__init__()
        file = Path(path).expanduser()
        if not file.is_file():
            raise FileNotFoundError(f"text file not found: {file}; set data.path to a UTF-8 text file "
                                    "(tiny-shakespeare: github.com/karpathy/char-rnn, data/tinyshakespeare/input.txt)")
        self.text = file.read_text(encoding="utf-8")
        self.dataset = file.parent.name if file.stem == "input" else file.stem
        self.file_name, self.train_fraction = f"{file.parent.name}/{file.name}", train_fraction
        if tokenizer not in TOKENIZERS:
            raise ValueError(f"tokenizer must be one of {sorted(TOKENIZERS)}, got {tokenizer!r}")
        split = int(len(self.text) * train_fraction)
        if tokenizer == "bpe":  # learned merges must not see the validation text
            self.tokenizer = TOKENIZERS["bpe"].from_text(self.text[:split], vocab_size)
        else:
            self.tokenizer = TOKENIZERS["char"].from_text(self.text)
        self.context_length, self.batch_size, self.num_workers = context_length, batch_size, num_workers
        self.train_samples, self.val_windows, self.seed = train_samples, val_windows, seed
        self.tokenizer_kind, self.vocab_size = tokenizer, self.tokenizer.vocab_size
        self.train_tokens = torch.tensor(self.tokenizer.encode(self.text[:split]), dtype=torch.long)
        self.val_tokens = torch.tensor(self.tokenizer.encode(self.text[split:]), dtype=torch.long)

    @property
    def data_info(self) -> dict:
        return {"vocab_size": self.tokenizer.vocab_size, "tokenizer": self.tokenizer.to_dict()}

    def describe(self) -> dict:
        """The data set and its splits in the words of a model card."""
        args = {"context_length": self.context_length, "batch_size": self.batch_size,
                "val_windows": self.val_windows, "train_fraction": self.train_fraction, "seed": self.seed,
                "tokenizer": self.tokenizer_kind, "vocab_size": self.vocab_size}
        return {"name": self.dataset, "hub_id": HUB_DATASETS.get(self.dataset), "file": self.file_name,
                "class_path": f"{type(self).__module__}.{type(self).__qualname__}", "init_args": args,
                "splits": f"first {len(self.train_tokens):,} tokens training, last {len(self.val_tokens):,} "
                          f"validation ({self.tokenizer_kind} tokenizer, {self.vocab_size} tokens; metrics are on "
                          "validation, as nanoGPT reports them)"}

    def train_dataloader(self):
        windows = RandomWindows(self.train_tokens, self.context_length, self.train_samples, self.seed)
        sampler = EpochSampler(windows, shuffle=False)  # passes each epoch on to the windows
        return DataLoader(windows, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers)

    def val_dataloader(self):
        windows = FixedWindows(self.val_tokens, self.context_length, self.val_windows)
        return DataLoader(windows, batch_size=self.batch_size * 4, num_workers=self.num_workers)

    def test_dataloader(self):
        return self.val_dataloader()  # tiny-shakespeare has no test split; nanoGPT reports validation
