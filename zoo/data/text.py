"""Text from any file: first 90% to train, last 10% to validate, random windows; tested on either split or all."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from zoo.data.arrays import check_fraction
from zoo.data.sampling import EpochSampler, epoch_generator
from zoo.data.text_files import read_text
from zoo.models.tokenizer import TOKENIZERS, describe, encode_text, tokenizer_from_dict


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


log = logging.getLogger(__name__)
HUB_DATASETS = {"tinyshakespeare": "karpathy/tiny_shakespeare"}


TEST_SPLITS = ("validation", "all")


class CharText(L.LightningDataModule):
    """Character-level (or byte-level BPE) language modelling on any UTF-8 text file: the first
    `train_fraction` trains in random windows, the rest validates in consecutive ones.

    A task that starts from a checkpoint hands its model's tokenizer over in `use_tokenizer`, so a
    text is never scored with another's.

    Args:
        path: a UTF-8 text file (tiny-shakespeare's input.txt by default).
        context_length: tokens per training window (the model's context).
        batch_size: windows per batch.
        train_samples: random training windows drawn per epoch.
        val_windows: at most this many validation windows (None: all of them).
        train_fraction: the share of the text to train on, strictly between 0 and 1.
        seed: draws the training windows (from seed and epoch, so a resumed run draws the same).
        num_workers: DataLoader worker processes.
        tokenizer: "char" (one token per distinct character) or "bpe" (byte-level BPE with `vocab_size`
            tokens, trained on the training part only, from the `tokenizers` library), both trained here
            for a model trained from scratch; or a checkpoint (a shipped name.tag, a release folder,
            hf-hub:org/repo) whose tokenizer encodes the text.
        vocab_size: the BPE vocabulary size (tokenizer "bpe" only).
        test_split: what `zoo test` scores: "validation" (the last 1 - train_fraction, as nanoGPT
            reports) or "all" (the whole file, in consecutive windows of context_length).
    """

    def __init__(self, path: str = "data/tinyshakespeare/input.txt", context_length: int = 64, batch_size: int = 12,
                 train_samples: int = 24_000, val_windows: int | None = None, train_fraction: float = 0.9,
                 seed: int = 0, num_workers: int = 0, tokenizer: str = "char", vocab_size: int = 512,
                 test_split: str = "validation"):
        super().__init__()
        file = Path(path).expanduser()
        if not file.is_file():
            raise FileNotFoundError(f"text file not found: {file}; set data.path to a UTF-8 text file "
                                    "(tiny-shakespeare: github.com/karpathy/char-rnn, data/tinyshakespeare/input.txt)")
        check_fraction("train_fraction", train_fraction, "the share of the text to train on; the rest validates")
        if test_split not in TEST_SPLITS:
            raise ValueError(f"test_split must be one of {TEST_SPLITS} (what `zoo test` scores), got {test_split!r}")
        if not isinstance(tokenizer, str):
            raise TypeError(f"tokenizer must be 'char', 'bpe' or a checkpoint whose tokenizer to use, got "
                            f"{type(tokenizer).__name__}")
        self.text = read_text(file)
        self.dataset = file.parent.name if file.stem == "input" else file.stem
        self.file, self.file_name, self.train_fraction = file, f"{file.parent.name}/{file.name}", train_fraction
        self.split = int(len(self.text) * train_fraction)
        self.context_length, self.batch_size, self.num_workers = context_length, batch_size, num_workers
        self.train_samples, self.val_windows, self.seed, self.test_split = train_samples, val_windows, seed, test_split
        self.fixed = tokenizer not in TOKENIZERS  # a checkpoint's tokenizer: the data's, not to be replaced
        if tokenizer == "bpe":  # learned merges must not see the validation text
            made = TOKENIZERS["bpe"].from_text(self.text[: self.split], vocab_size)
        elif tokenizer == "char":
            made = TOKENIZERS["char"].from_text(self.text)
        else:
            made = checkpoint_tokenizer(tokenizer)
        self._encode(made, tokenizer if tokenizer in TOKENIZERS else f"{tokenizer}'s")

    def _encode(self, tokenizer, kind: str) -> None:
        where = str(self.file)
        train = encode_text(tokenizer, self.text[: self.split], where)
        val = encode_text(tokenizer, self.text[self.split :], where)
        if min(len(train), len(val)) <= self.context_length:  # no whole window in a split
            raise ValueError(f"{self.file} gives {len(train):,} training and {len(val):,} validation tokens "
                             f"(train_fraction={self.train_fraction}); each split needs more than "
                             f"context_length={self.context_length}: use a longer text or a shorter context")
        self.tokenizer, self.tokenizer_kind, self.vocab_size = tokenizer, kind, tokenizer.vocab_size
        self.train_tokens = torch.tensor(train, dtype=torch.long)
        self.val_tokens = torch.tensor(val, dtype=torch.long)

    def use_tokenizer(self, tokenizer, owner: str) -> None:
        """Encode the text with `tokenizer` (the model's, named by `owner`) instead of this module's own; refused
        when this module was given a checkpoint's tokenizer that is another, or the text holds characters
        `tokenizer` lacks."""
        if tokenizer.to_dict() == self.tokenizer.to_dict():
            return
        if self.fixed:
            raise ValueError(f"data.tokenizer is {self.tokenizer_kind} tokenizer ({describe(self.tokenizer)}), but the "
                             f"model's is another ({describe(tokenizer)}): name the model's checkpoint as "
                             "data.tokenizer, or leave it 'char' or 'bpe' to take the model's")
        self._encode(tokenizer, owner)
        log.warning("%s is encoded with %s tokenizer, not one trained on the file", self.file, owner)

    @property
    def data_info(self) -> dict:
        return {"vocab_size": self.tokenizer.vocab_size, "tokenizer": self.tokenizer.to_dict()}

    def describe(self) -> dict:
        """The data set and its splits in the words of a model card."""
        args = {"context_length": self.context_length, "batch_size": self.batch_size,
                "val_windows": self.val_windows, "train_fraction": self.train_fraction, "seed": self.seed,
                "tokenizer": self.tokenizer_kind, "vocab_size": self.vocab_size, "test_split": self.test_split}
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
        """The validation split (tiny-shakespeare has no test split; nanoGPT reports validation), or with
        test_split="all" the whole file, encoded in one piece, in consecutive windows (a last part shorter than
        a window is left out; `zoo evaluate` scores every token)."""
        if self.test_split == "validation":
            return self.val_dataloader()
        tokens = torch.tensor(encode_text(self.tokenizer, self.text, str(self.file)), dtype=torch.long)
        windows = FixedWindows(tokens, self.context_length, None)
        return DataLoader(windows, batch_size=self.batch_size * 4, num_workers=self.num_workers)


def checkpoint_tokenizer(source: str):
    """The tokenizer of a language model checkpoint (read from its config.json; no weights are read)."""
    from zoo.models.pretrained import is_checkpoint, read_folder_config, source_folder
    from zoo.models.tokenizer import TOKENIZERS

    if not is_checkpoint(source):
        raise ValueError(f"tokenizer must be one of {sorted(TOKENIZERS)} (trained on the file) or a "
                         f"language model checkpoint (name.tag, a release folder, hf-hub:org/repo) whose tokenizer "
                         f"to use, got {source!r}")
    saved = read_folder_config(source_folder(source))["args"].get("tokenizer")
    if saved is None:
        raise ValueError(f"tokenizer={source!r}: that checkpoint has no tokenizer (it is not a language model "
                         "that carries one)")
    return tokenizer_from_dict(saved)
