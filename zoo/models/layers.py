"""Building blocks shared by the three families: the transformer block and position encodings."""

from __future__ import annotations

import difflib
import inspect
import json
import math
import numbers
from collections.abc import Sequence

import torch
from torch import nn

from zoo.attention import KV_CACHED, MECHANISMS, FeedForward2, build
from zoo.models.short_conv import ConvState, ShortConv
from zoo.utils.checks import shown

MLPS = ("mlp", "ffn2")
POSITIONS = ("learned", "sincos", "none")


def sincos_encoding(length: int, dim: int, start: int | torch.Tensor = 0) -> torch.Tensor:
    """The fixed sine-cosine position encoding of "Attention Is All You Need" at positions start..start +
    length - 1, (length, dim); a start per row, (batch, 1), gives (batch, length, dim), on its device."""
    device = start.device if isinstance(start, torch.Tensor) else None
    position = (torch.arange(length, dtype=torch.float64, device=device) + start)[..., None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64, device=device) * (-math.log(10000.0) / dim))
    table = torch.zeros(*position.shape[:-1], dim, dtype=torch.float64, device=device)
    table[..., 0::2] = torch.sin(position * freq)
    table[..., 1::2] = torch.cos(position * freq[: dim // 2])
    return table.float()


def sincos_encoding_2d(height: int, width: int, dim: int) -> torch.Tensor:
    """Half the channels encode the row, half the column (as in MAE), (height * width, dim)."""
    if dim % 4:
        raise ValueError(f"2-D sin-cos position encoding needs embed_dim divisible by 4, got {dim}")
    rows = sincos_encoding(height, dim // 2)[:, None].expand(height, width, dim // 2)
    cols = sincos_encoding(width, dim // 2)[None].expand(height, width, dim // 2)
    return torch.cat([rows, cols], dim=-1).reshape(height * width, dim)


def is_int_or_ints(value) -> bool:
    def integer(v):
        return isinstance(v, numbers.Integral) and not isinstance(v, bool)

    return integer(value) or (isinstance(value, (list, tuple)) and all(map(integer, value)))


def take_indices(count: int, indices: int | Sequence[int] | None, owner: str) -> tuple[list[int], int]:
    """Which of `count` blocks `forward_intermediates` returns, by timm's convention: None for all, an int n
    for the last n, a sequence for those blocks (negative ones counted from the end); and the last of them."""
    if indices is None:
        indices = count
    if not is_int_or_ints(indices):  # 0.5, "1" and True would pick blocks silently, or fail deep inside
        raise TypeError(f"{owner} indices must be an int or a sequence of ints, got {indices!r}")
    if isinstance(indices, numbers.Integral):
        if not 0 < indices <= count:
            raise ValueError(f"{owner} has {count} blocks; indices={indices} asks for the last {indices}")
        take = list(range(count - indices, count))
    else:
        take = [int(i) + count if int(i) < 0 else int(i) for i in indices]
        if not take or not all(0 <= i < count for i in take):
            raise ValueError(f"{owner} has {count} blocks (indices 0..{count - 1} or -{count}..-1), "
                             f"got indices={list(indices)}")
    return take, max(take)


def drop_path_rates(rate: float, depth: int) -> list[float]:
    """Stochastic depth rising linearly from 0 at the first block to `rate` at the last, as timm's
    `calculate_drop_path_rates` (computed in Python: models are also built on the meta device)."""
    return [rate * i / max(depth - 1, 1) for i in range(depth)]


def check_choice(value, choices, what: str, owner: str):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{owner} {what} must be one of {list(choices)}, got {shown(value)}")
    return value


def check_options(attention: str, options: dict) -> dict:
    """A mechanism's own options (micro's num_queries, clipped's alpha, ...), refused by name where its class
    takes no such argument; the arguments the block itself sets (dim, heads, causal) are refused too."""
    accepted = []
    for cls in MECHANISMS[attention].__mro__:  # through **kwargs to the base class: clipped's dropout is softmax's
        if "__init__" not in vars(cls):
            continue
        parameters = inspect.signature(cls.__init__).parameters.values()
        accepted += [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                     and p.name not in ("self", "dim", "heads", "causal", *accepted)]
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(f"attention_options {unknown[0]!r} is not an option of the {attention} attention; it takes "
                         f"{', '.join(accepted) or 'none'}")
    return options


def per_block(value, depth: int, choices, what: str, owner: str) -> list[str]:
    """One name for every block, from one name or a list of `depth` names (e.g. attention=[micro, softmax]),
    each checked against `choices`; a wrong one is refused naming its block and the closest choices."""
    if not isinstance(value, (list, tuple)):  # one name for all: refused as before, even at depth 0
        return [check_choice(value, choices, what, owner)] * depth
    names = value
    if len(names) != depth:
        raise ValueError(f"{owner} {what} lists {len(names)} names, but depth={depth}: give one name per block, "
                         f"or one name for all")
    for index, name in enumerate(names):
        if not isinstance(name, str) or name not in choices:
            close = difflib.get_close_matches(name, list(choices), n=3) if isinstance(name, str) else []
            hint = f" (closest: {', '.join(close)})" if close else ""
            raise ValueError(f"{owner} {what}[{index}] (block {index}) must be one of {list(choices)}, got "
                             f"{shown(name)}{hint}")
    return list(names)


def per_block_options(options, depth: int, owner: str) -> list[dict]:
    """attention_options for every block: None, one dict for all, or a list of `depth` dicts (None for none)."""
    if options is None or isinstance(options, dict):
        options = [options] * depth
    if not isinstance(options, (list, tuple)) or len(options) != depth:
        raise ValueError(f"{owner} attention_options must be a dict, or a list of {depth} dicts (one per block), "
                         f"got {shown(options)}")
    for index, item in enumerate(options):
        if item is not None and not (isinstance(item, dict) and all(isinstance(k, str) for k in item)):
            raise TypeError(f"{owner} attention_options[{index}] (block {index}) must be a dict of option names, "
                            f"got {shown(item)}")
    return [dict(item or {}) for item in options]


def checked_block_options(options, attentions: list[str], owner: str) -> list[dict]:
    """attention_options for every block (per_block_options), each checked against its block's mechanism, and
    held to JSON values: the config is written as JSON, and a tensor or a set among the options would otherwise
    fail only when the model is saved."""
    per_block = per_block_options(options, len(attentions), owner)
    for index, (name, given) in enumerate(zip(attentions, per_block)):
        try:
            check_options(name, given)
        except ValueError as error:
            raise ValueError(f"{owner} block {index}: {error}") from None
    try:
        json.dumps(options, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{owner} attention_options must hold JSON values (numbers, strings, booleans, lists) to be "
                        f"saved with the model, got {shown(options)}: {error}") from None
    return per_block


class Mlp(nn.Sequential):
    def __init__(self, dim: int, ratio: float = 4.0, dropout: float = 0.0):
        hidden = int(dim * ratio)
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim), nn.Dropout(dropout))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)); with short_conv=w (causal
    blocks), first x + conv(norm(x)), a causal convolution over the last w tokens (zoo/models/short_conv.py)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        attention: str = "softmax",
        causal: bool = False,
        mlp: str = "mlp",
        mlp_ratio: float = 4.0,
        max_len: int | None = None,
        learned_bias: bool = False,
        dropout: float = 0.0,
        drop_path: float = 0.0,
        attention_options: dict | None = None,
        short_conv: int = 0,
    ):
        super().__init__()
        check_choice(mlp, MLPS, "mlp", "Block")
        if short_conv and not causal:
            raise ValueError(f"Block short_conv={short_conv} is a causal convolution; it needs causal=True")
        self.short_conv = ShortConv(dim, short_conv) if short_conv else None
        extra = {}
        if attention in KV_CACHED:
            extra = {"max_len": max_len, "learned_bias": learned_bias, "dropout": dropout}
        elif learned_bias:
            raise ValueError(f"learned_bias needs one of {list(KV_CACHED)} attentions, got attention={attention!r}")
        if attention == "elita":
            extra = {"max_len": max_len or 1024}
        if attention == "incontext":  # softmax attention with a bias: its weights take the dropout as the family's
            extra = {"dropout": dropout}
        extra.update(check_options(attention, attention_options or {}))
        self.norm1 = nn.LayerNorm(dim)
        self.attn = build(attention, dim, heads=heads, causal=causal, **extra)
        # The residual stream between the two halves, which norm2 and the second sum both read:
        # an identity, so that a hook (fake quantization, activation statistics) can see and replace it.
        self.after_attn = nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, mlp_ratio, dropout) if mlp == "mlp" else FeedForward2(dim)
        self.drop_path = nn.Identity()
        if drop_path > 0:  # stochastic depth: timm's DropPath, imported only where it is used
            from timm.layers import DropPath

            self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.short_conv is not None:
            x = self.short_conv(x, key_padding_mask)[0]
        x = self.after_attn(x + self.drop_path(self.attn(self.norm1(x), key_padding_mask=key_padding_mask)))
        return x + self.drop_path(self.mlp(self.norm2(x)))

    def step(self, x: torch.Tensor, state=None, key_padding_mask: torch.Tensor | None = None):
        if self.short_conv is None:
            y, state = self.attn.step(self.norm1(x), state, key_padding_mask=key_padding_mask)
        else:  # a ConvState: the convolution's last inputs (ShortConv checks them), and the attention's own state
            if state is not None and not isinstance(state, ConvState):
                want = (x.shape[0], self.short_conv.width - 1, x.shape[2])
                raise ValueError(f"Block.step of a block with a short convolution expects state=None or the "
                                 f"ConvState it returned (a tail of shape {want}), got {type(state).__name__}")
            tail, inner = (None, None) if state is None else (state.tail, state.attention)
            x, tail = self.short_conv(x, key_padding_mask, tail)
            y, inner = self.attn.step(self.norm1(x), inner, key_padding_mask=key_padding_mask)
            state = ConvState(tail, inner)
        x = self.after_attn(x + y)
        return x + self.mlp(self.norm2(x)), state
