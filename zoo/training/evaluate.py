"""Loss, perplexity and bits per byte of any text file under a language model, with the model's own tokenizer."""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from zoo.utils.modes import evaluating

SPLITS = ("all", "train", "validation")
# The largest text file scored: room for any corpus a zoo model is scored on (enwik9's 10^9 bytes fit), and a
# bound on what is read: /dev/zero was read until the memory ran out.
MAX_TEXT_BYTES = 2**30
TRAIN_FRACTION = 0.9  # CharText's default: "train" is the first 90% of the characters, "validation" the rest


def evaluate_text(source, file, context_length: int | None = None, batch_size: int = 16, split: str = "all",
                  train_fraction: float = TRAIN_FRACTION) -> dict:
    """Score `file` under the language model `source` (a name.tag, a release folder, hf-hub:org/repo, or a
    TextTransformer), encoded with the model's tokenizer.

    The tokens are cut into consecutive, non-overlapping windows of `context_length` (default: the model's
    context) and every token but the first is predicted once, from the tokens before it in its window (the
    last window may be shorter). Windows do not overlap, so a token early in a window sees little context:
    the loss is that of nanoGPT's and `zoo test`'s windows, not of a sliding window (lower, and slower).

    split: "all" the whole file; "train" / "validation" the first `train_fraction` of its characters / the
    rest, as CharText splits a file. Returns the mean loss in nats per token, perplexity exp(loss), bits per
    byte (the summed loss in bits over the UTF-8 bytes of the predicted tokens, each counted whole, which makes
    tokenizers comparable), and the counts.

    `file` must be a regular file of at most MAX_TEXT_BYTES (1 GiB); a device, FIFO or socket is refused
    before it is opened.
    """
    from zoo.models.tokenizer import describe, encode_text

    model, name = _model(source)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    context = model.context_length
    if context_length is not None:  # positions a model learned bound its window; micro and elita have none
        context = _count(context_length, f"context_length ({name}'s window)",
                         model.context_length if model.pos_kind == "learned" else None)
    batch_size = _count(batch_size, "batch_size")
    text = _read(file)
    if split != "all":
        if isinstance(train_fraction, bool) or not isinstance(train_fraction, (int, float)) or not (
                0 < train_fraction < 1):
            raise ValueError(f"train_fraction must be a number between 0 and 1, got {train_fraction!r}")
        cut = int(len(text) * train_fraction)
        text = text[:cut] if split == "train" else text[cut:]
    ids = encode_text(model.tokenizer, text, str(file))
    if len(ids) < 2:
        raise ValueError(f"{file} ({split}) gives {len(ids)} token(s) under {name}'s tokenizer; scoring needs at "
                         "least 2 (one to predict from, one to predict)")
    scored_bytes = _token_bytes(model.tokenizer, ids[1:])  # the first token is never predicted: not counted
    total = _summed_loss(model, torch.tensor(ids, dtype=torch.long), context, batch_size)
    predicted = len(ids) - 1
    loss = total / predicted
    return {"source": name, "file": str(file), "split": split, "loss": loss, "perplexity": math.exp(loss),
            "bits_per_byte": total / math.log(2) / max(scored_bytes, 1), "tokens": predicted, "bytes": scored_bytes,
            "context_length": context, "windows": "non-overlapping", "tokenizer": describe(model.tokenizer)}


@torch.no_grad()
def _summed_loss(model: nn.Module, ids: torch.Tensor, context: int, batch_size: int) -> float:
    """The summed next-token loss (nats, accumulated in float64) over consecutive windows of `context` tokens."""
    device = next(model.parameters()).device
    whole = (len(ids) - 1) // context  # windows of `context` predictions; then one shorter window, if any is left
    starts = [i * context for i in range(whole)]
    total = 0.0
    with evaluating(model):
        for b in range(0, len(starts), batch_size):
            rows = torch.stack([ids[s : s + context + 1] for s in starts[b : b + batch_size]]).to(device)
            total += _window_loss(model, rows)
        tail = ids[whole * context :]
        if len(tail) > 1:
            total += _window_loss(model, tail[None].to(device))
    return total


def _window_loss(model: nn.Module, rows: torch.Tensor) -> float:
    logits = model(rows[:, :-1]).float()
    return float(F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten(), reduction="sum").double())


def _model(source) -> tuple[nn.Module, str]:
    from zoo.models.pretrained import load

    if isinstance(source, nn.Module):
        model, name = source, getattr(source, "model_name", None) or type(source).__name__
    elif isinstance(source, (str, os.PathLike)):
        model, name = load(source), str(source)
    else:
        raise TypeError(f"evaluate_text takes a language model or where to load one (name.tag, a release folder, "
                        f"hf-hub:org/repo), got {type(source).__name__}")
    if getattr(model, "tokenizer", None) is None or not hasattr(model, "context_length"):
        raise ValueError(f"{name} ({type(model).__name__}) is not a language model that carries its tokenizer; "
                         "evaluate_text scores text under a TextTransformer (`zoo models '*gpt*' --pretrained`)")
    return model, name


def _token_bytes(tokenizer, ids: list[int]) -> int:
    """The UTF-8 bytes the tokens `ids` stand for, each token counted whole: a byte-level BPE token may end inside
    a multi-byte character, and decoding it alone gives U+FFFD (3 bytes) instead of its own bytes."""
    from zoo.models.tokenizer import BPETokenizer

    if not isinstance(tokenizer, BPETokenizer):  # characters: the text the tokens decode to is theirs
        return len(tokenizer.decode(ids).encode("utf-8"))
    from tokenizers import decoders, pre_tokenizers

    library = tokenizer.tokenizer
    byte_level = isinstance(library.decoder, decoders.ByteLevel)
    alphabet, added = set(pre_tokenizers.ByteLevel.alphabet()), library.get_added_tokens_decoder()
    sizes = []
    for i in range(tokenizer.vocab_size):  # once per vocabulary entry, not per token of the text
        piece = library.id_to_token(i)
        if byte_level and i not in added and piece is not None and set(piece) <= alphabet:
            sizes.append(len(piece))  # byte-level BPE spells each byte as one character of its alphabet
        else:  # an added token, or another tokenizer's piece: the text it decodes to
            sizes.append(len(tokenizer.decode([i]).encode("utf-8")))
    return int(torch.tensor(sizes, dtype=torch.long)[torch.tensor(ids, dtype=torch.long)].sum()) if ids else 0


def _count(value, what: str, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or (maximum is not None and value > maximum):
        limit = f" and at most {maximum}" if maximum is not None else ""
        raise ValueError(f"{what} must be an integer of at least 1{limit}, got {value!r}")
    return value


def _read(file) -> str:
    from zoo.data.text_files import read_text

    if not isinstance(file, (str, os.PathLike)):
        raise TypeError(f"file must be a path to a UTF-8 text file, got {type(file).__name__}")
    path = Path(file).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no text file at {file}")
    info = path.stat()
    limit = f"{MAX_TEXT_BYTES // 2**30} GiB ({MAX_TEXT_BYTES:,} bytes)" if MAX_TEXT_BYTES % 2**30 == 0 else \
        f"{MAX_TEXT_BYTES:,} bytes"
    # before opening: a FIFO's open() waits for a writer, and a device (/dev/zero) never ends
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):  # read_text names a folder
        raise ValueError(f"{file} is not a regular file ({_file_kind(info.st_mode)}); expected a UTF-8 text file of "
                         f"at most {limit}")
    if info.st_size > MAX_TEXT_BYTES:
        raise ValueError(f"{file} holds {info.st_size:,} bytes, more than the limit of {limit} for a text file to "
                         "score; split it, or score a part of it")
    return read_text(path)


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a file")
