"""Multi-head softmax self-attention (after SciFormer's write-up), with a KV cache for decoding.

SciFormer's write-up normalizes its weights with a sum "from j = 1 to k" (k, the token width)
and scales by the square root of the token width; the sum runs over the n tokens and
the scale is the square root of the per-head width, as in "Attention Is All You Need".
Its "trainable mask" is an additive bias over (query, key) positions, one per head:
`learned_bias=True` with the model's `max_len`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention.dot_product import attend, check_attn_mask
from zoo.attention.positions import alibi_bias, alibi_slopes, check_alibi_bias_max, rotate
from zoo.utils.checks import (
    check_heads,
    check_padding_mask,
    check_state,
    check_tokens,
    flag,
    integer,
    number,
    zero_padding,
)

POSITIONS = (None, "rope", "alibi")


@dataclass
class KVCache:
    """Keys and values of every token seen so far, in buffers (batch, heads, capacity, head_dim) filled up to
    `length`; QuietAttention's slot 0 holds its zero key and value, stored once.

    The state of a causal SoftmaxAttention (and QuietAttention, ClippedSoftmaxAttention, GatedAttention)
    between calls of `step`: pass None to start, then the cache each call returns. `step` writes the new
    tokens into the buffers in place while they have room and doubles them when they do not, so a token
    costs no copy of the cache. A cache stepped twice (two continuations of one prefix) is copied the
    second time, never overwritten under the first.

    Args:
        keys: the keys of the tokens seen so far, (batch, heads, capacity, head_dim), in the layer's dtype and
            on its device.
        values: their values, of the same shape, dtype and device as `keys`.
        filled: how many slots hold tokens; None: all of them.
        mask: (batch, capacity) bool, True where a slot holds a real token (False: padding, never attended);
            None: every token is real.
        written: internal, left None: how far any cache sharing these buffers has written them, a one-item
            list that `step` keeps, so that it writes in place only at that end.
    """

    keys: torch.Tensor
    values: torch.Tensor
    filled: int | None = None
    mask: torch.Tensor | None = None
    # How far any cache sharing these buffers has written them: step writes in place only at that end.
    written: list[int] | None = field(default=None, repr=False, compare=False)

    @property
    def length(self) -> int:
        return self.keys.shape[-2] if self.filled is None else self.filled

    def append(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> KVCache:
        """The cache with k, v (batch, heads, new, head_dim) after its tokens, `mask` (batch, new) saying which
        of them are real (None: all)."""
        start, stop = self.length, self.length + k.shape[-2]
        old_mask = self.mask
        if old_mask is None and mask is not None:
            old_mask = mask.new_ones(mask.shape[0], self.keys.shape[-2])
        if mask is None and old_mask is not None:
            mask = old_mask.new_ones(k.shape[0], k.shape[-2])
        if torch.compiler.is_compiling() or (torch.is_grad_enabled() and (k.requires_grad or v.requires_grad)):
            # graphs (torch.export, ONNX) and autograd want tensors that are never written after they are read
            return KVCache(torch.cat([self.keys[:, :, :start], k], -2), torch.cat([self.values[:, :, :start], v], -2),
                           mask=None if mask is None else torch.cat([old_mask[:, :start], mask], 1))
        keys, values, written = self.keys, self.values, self.written
        if written is None or written[0] != start or stop > keys.shape[-2]:
            # a cache the caller built, one that another step wrote past, or a full one: new buffers, doubled,
            # so that growing to n tokens copies each token about twice in all
            capacity = max(stop, 2 * keys.shape[-2])
            keys = keys.new_empty(*keys.shape[:2], capacity, keys.shape[-1])
            values = values.new_empty(keys.shape)
            keys[:, :, :start], values[:, :, :start] = self.keys[:, :, :start], self.values[:, :, :start]
            if mask is not None:
                grown = mask.new_ones(mask.shape[0], capacity)
                grown[:, :start] = old_mask[:, :start]
                old_mask = grown
            written = [start]
        keys[:, :, start:stop], values[:, :, start:stop] = k, v
        if mask is not None:
            old_mask[:, start:stop] = mask
        written[0] = stop
        return KVCache(keys, values, stop, old_mask, written)


class SoftmaxAttention(nn.Module):
    """Multi-head scaled dot-product attention (after SciFormer's write-up), through PyTorch's fused SDPA kernels.

    For each head h, with q, k, v the head's slices of W_qkv x and d = dim / heads:

        head_h = softmax(q k^T / sqrt(d) + B_h) v,    y = W_o concat_h(head_h)

    B_h is the learned (query, key) bias when `learned_bias=True`, else 0. Fixed from SciFormer's write-up: the
    softmax sums over the n tokens (it wrote j = 1..k, k the token width) and scales by the square root of
    the per-head width d, not of the token width.

    Positions (`positions`, zoo/attention/positions.py), beside or instead of the learned bias:
    "rope" rotates q and k by their positions before the logits (RoPE, Su et al. 2021), so q_i . k_j
    depends on i - j only; "alibi" adds -m_h (i - j) to head h's logits (Press et al. 2022; -m_h |i - j|
    for a bidirectional layer). Token t of x is at position t, padding included, as for the learned
    bias; `step` continues from the number of tokens in the cache, which keeps rotated keys. Both are
    relative, so left padding (a batch of prompts of different lengths) shifts no distance between real
    tokens, and padded decoding, which the learned bias refuses, is allowed. Neither has a table: a
    layer runs at any length. QuietAttention's zero key (its "nothing") keeps its logit of 0: it is
    neither rotated (a rotated zero is zero) nor biased.

    Takes x (batch, length, dim) and an optional `key_padding_mask` (batch, length), True for real tokens;
    returns (batch, length, dim), zero at padded positions. A causal layer also decodes with
    `y, cache = layer.step(x_new, cache)` and a KVCache, starting from `cache=None`.

    Args:
        dim: the token width, an int >= 1 divisible by `heads`.
        heads: the number of heads, an int >= 1 (default 1); each head is dim / heads wide.
        causal: True: token i attends to tokens 0..i only, and `step` decodes; default False (bidirectional).
        bias: whether the qkv and output projections have biases (default True).
        dropout: the dropout probability on the attention weights while training, in [0, 1) (default 0).
        max_len: the longest sequence the learned bias covers, an int >= 1; needed with `learned_bias`,
            otherwise unused (default None).
        learned_bias: add a trainable bias per head over (query, key) positions, (heads, max_len, max_len),
            started at zero (SciFormer's "trainable mask"); default False.
        positions: None (default: none, positions come from outside, e.g. the model's embedding), "rope"
            (rotary; needs an even head width) or "alibi" (linear biases).
        rope_base: RoPE's frequency base, a finite number > 1 (default 10000); used with positions="rope".
        alibi_bias_max: the exponent of ALiBi's slowest slope, 2^-alibi_bias_max, a number in (0, 126] (default 8,
            the paper's); used with positions="alibi". See `alibi_slopes`.
    """

    quiet = False  # QuietAttention flips this to normalize with softmax_one

    def __init__(
        self,
        dim: int,
        heads: int = 1,
        causal: bool = False,
        bias: bool = True,
        dropout: float = 0.0,
        max_len: int | None = None,
        learned_bias: bool = False,
        positions: str | None = None,
        rope_base: float = 10000.0,
        alibi_bias_max: float = 8.0,
    ):
        super().__init__()
        owner = type(self).__name__
        self.head_dim = check_heads(dim, heads, owner)
        if positions is not None and (not isinstance(positions, str) or positions not in POSITIONS):
            raise ValueError(f"{owner} positions must be one of {POSITIONS}, got {positions!r}")
        rope_base = number(rope_base, "rope_base", owner, minimum=1.0, include_minimum=False)
        if positions == "rope" and self.head_dim % 2:
            raise ValueError(f"{owner}(positions='rope') rotates channel pairs and needs an even head width "
                             f"dim / heads, got {dim} / {heads} = {self.head_dim}")
        self.positions, self.rope_base = positions, rope_base
        self.alibi_bias_max = check_alibi_bias_max(positions, alibi_bias_max, owner)
        causal, bias = flag(causal, "causal", owner), flag(bias, "bias", owner)
        learned_bias = flag(learned_bias, "learned_bias", owner)
        dropout = number(dropout, "dropout", owner, maximum=1.0, include_maximum=False)
        if max_len is not None:
            max_len = integer(max_len, "max_len", owner)
        self.dim, self.heads, self.causal, self.dropout = dim, heads, causal, dropout
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)
        self.max_len = max_len if learned_bias else None  # only the learned bias reads it
        if learned_bias:
            if max_len is None:
                raise ValueError(f"{type(self).__name__}(learned_bias=True) needs max_len, got None")
            self.attn_bias = nn.Parameter(torch.zeros(heads, max_len, max_len))
        else:
            self.attn_bias = None

    def _split_heads(self, x: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (batch, heads, length, head_dim) of the tokens x at positions start, start + 1, ..."""
        q, k, v = self._project(x)
        q, k = self._rotate(q, k, start)
        return q, k, v

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q, k, v

    def _rotate(self, q: torch.Tensor, k: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k rotated by RoPE at positions start, start + 1, ... (unchanged without positions="rope")."""
        if self.positions != "rope":
            return q, k
        positions = torch.arange(start, start + q.shape[-2], device=q.device)
        return rotate(q, positions, self.rope_base), rotate(k, positions, self.rope_base)

    def _cross_heads(self, x: torch.Tensor, context: torch.Tensor):
        """q from x, k and v from the context, through the query rows and the key and value rows of qkv."""
        weight, bias = self.qkv.weight, self.qkv.bias
        q = F.linear(x, weight[: self.dim], None if bias is None else bias[: self.dim])
        kv = F.linear(context, weight[self.dim:], None if bias is None else bias[self.dim:])
        b, n, m = x.shape[0], x.shape[1], context.shape[1]
        k, v = kv.view(b, m, 2, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q.view(b, n, self.heads, self.head_dim).transpose(1, 2), k, v

    def _merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        b, _, n, _ = out.shape
        return self.proj(out.transpose(1, 2).reshape(b, n, self.dim))

    def _bias(self, start: int, stop: int) -> torch.Tensor | None:
        """The additive logits (heads, stop - start, stop) of queries start..stop-1 over keys 0..stop-1: the
        learned bias, ALiBi's, their sum, or None."""
        bias = None
        if self.attn_bias is not None:
            if stop > self.max_len:
                raise ValueError(
                    f"{type(self).__name__} has a learned bias for at most max_len={self.max_len} tokens, got {stop}"
                )
            bias = self.attn_bias[:, start:stop, :stop]
        if self.positions == "alibi":
            device = self.qkv.weight.device
            slopes = alibi_slopes(self.heads, bias_max=self.alibi_bias_max, dtype=torch.float32, device=device)
            alibi = alibi_bias(slopes, torch.arange(start, stop, device=device), torch.arange(stop, device=device),
                               causal=self.causal)
            bias = alibi if bias is None else bias + alibi
        return bias

    def clip(self, keys: int, queries: int, device, key_padding_mask: torch.Tensor | None = None
             ) -> tuple[float, torch.Tensor] | None:
        """The clipped softmax's (zeta, gamma); None: a plain softmax (ClippedSoftmaxAttention overrides)."""
        return None

    def gates(self, x: torch.Tensor) -> torch.Tensor | None:
        """Per-token, per-head gates on the heads' outputs; None: ungated (GatedAttention overrides)."""
        return None

    def _gated(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        gates = self.gates(x)
        return out if gates is None else out * gates.to(out.dtype)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, *,
                context: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None,
                is_causal: bool = False) -> torch.Tensor:
        """Self-attention over x (batch, length, dim), or cross-attention from x to `context`.

        Args:
            x: the tokens, (batch, length, dim); the queries, and without `context` the keys and values too.
            key_padding_mask: (batch, keys) bool, True for real tokens (PyTorch's nn.MultiheadAttention has it
                the other way round). Self-attention: x's padding, whose outputs are zero. Cross-attention:
                the context's padding, never attended; every query is computed.
            context: (batch, context length, dim), the tokens the keys and values come from, through the same
                qkv weights (the query rows on x, the key and value rows on the context); None: x itself.
            attn_mask: as timm and F.scaled_dot_product_attention take it, (length, keys) or
                (batch or 1, heads or 1, length, keys): bool, True where the query may attend, or float,
                added to the logits (-inf forbids).
            is_causal: True: attend causally for this call, as a causal layer always does (self-attention only).

        Returns:
            (batch, length, dim).
        """
        owner = type(self).__name__
        check_tokens(x, self.dim, owner)
        causal = self.causal or flag(is_causal, "is_causal", owner)
        keys = x
        if context is not None:
            check_tokens(context, self.dim, f"{owner} context")
            if context.shape[0] != x.shape[0] or context.dtype != x.dtype or context.device != x.device:
                raise ValueError(f"{owner} expects a context of x's batch size, dtype and device "
                                 f"({x.shape[0]}, {x.dtype}, {x.device}), got ({context.shape[0]}, "
                                 f"{context.dtype}, {context.device})")
            if causal or self.attn_bias is not None or self.positions is not None:
                raise ValueError(f"{owner} attends to a context only as a bidirectional layer without learned_bias "
                                 "and positions: causality and the positions are defined within one sequence")
            keys = context
        key_padding_mask = check_padding_mask(key_padding_mask, keys, owner)
        lq, lk = x.shape[1], keys.shape[1]
        attn_mask = check_attn_mask(attn_mask, x.shape[0], self.heads, lq, lk, x.device, owner)
        if context is None:
            x = zero_padding(x, key_padding_mask)
            q, k, v = self._split_heads(x)
        else:
            q, k, v = self._cross_heads(x, zero_padding(context, key_padding_mask))
        padding = key_padding_mask
        if context is not None and key_padding_mask is not None:
            # as a mask of keys: attend's padding lets each token see itself, which across sequences is another
            padding, keep = None, key_padding_mask[:, None, None, :]
            attn_mask = keep if attn_mask is None else (
                attn_mask & keep if attn_mask.dtype == torch.bool else attn_mask.masked_fill(~keep, float("-inf")))
        out = attend(
            q, k, v,
            causal=causal,
            key_padding_mask=padding,
            bias=self._bias(0, lq),
            quiet=self.quiet,
            clip=self.clip(lk, lq, x.device, key_padding_mask),
            dropout_p=self.dropout if self.training else 0.0,
            attn_mask=attn_mask,
        )
        out = self._merge_heads(self._gated(out, x))
        return out if context is not None else zero_padding(out, key_padding_mask)

    def step(self, x: torch.Tensor, state: KVCache | None = None,
             key_padding_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, KVCache]:
        """Attend from the new tokens x (batch, new, dim) to the cache and themselves.

        Args:
            x: the new tokens, (batch, new, dim), following those in `state`.
            state: the KVCache returned by the previous call, or None to start a sequence.
            key_padding_mask: (batch, new) bool, True for real tokens; padding (False: the left padding of a
                batch of prompts of different lengths) is remembered in the cache and never attended.

        Returns:
            The outputs for the new tokens (batch, new, dim), zero at padding, and the cache grown by them.
        """
        if not self.causal:
            raise RuntimeError(f"{type(self).__name__}.step needs causal=True: a bidirectional layer has no cache")
        owner = type(self).__name__
        check_tokens(x, self.dim, owner)
        key_padding_mask = check_padding_mask(key_padding_mask, x, owner)
        x = zero_padding(x, key_padding_mask)
        q, k, v = self._project(x)
        cached = (x.shape[0], self.heads, None, self.head_dim)  # any number of cached tokens
        check_state(state, KVCache, {"keys": cached, "values": cached}, k.dtype, k.device, owner)
        if state is not None:
            check_cache(state, owner)
        n, zero = x.shape[1], int(self.quiet)  # quiet attention's zero key sits in slot 0 of its cache
        q, k = self._rotate(q, k, 0 if state is None else state.length - zero)  # the cache keeps rotated keys
        if state is None:
            out = attend(q, k, v, causal=True, key_padding_mask=key_padding_mask, bias=self._bias(0, n),
                         quiet=self.quiet, clip=self.clip(n, n, x.device, key_padding_mask))
            mask = key_padding_mask
            if zero:  # stored once here, not prepended again at every step
                k, v = F.pad(k, (0, 0, 1, 0)), F.pad(v, (0, 0, 1, 0))
                mask = None if mask is None else F.pad(mask, (1, 0), value=True)
            cache = KVCache(k, v, mask=mask, written=[k.shape[-2]])
        else:
            if self.attn_bias is not None and (state.mask is not None or key_padding_mask is not None):
                raise ValueError(f"{owner} has a learned bias over absolute positions, which padded decoding "
                                 "would shift: decode sequences of different lengths one at a time")
            cache = state.append(k, v, key_padding_mask)
            keys, values = cache.keys[:, :, :cache.length], cache.values[:, :, :cache.length]
            mask = None if cache.mask is None else cache.mask[:, :cache.length]
            start = state.length - zero  # tokens seen
            bias = self._bias(start, start + n)
            # One new token sees every cached key: no causal mask, so SDPA's unmasked kernels run.
            out = attend(q, keys, values, causal=n > 1, key_padding_mask=mask,
                         bias=None if bias is None else F.pad(bias, (zero, 0)),
                         clip=self.clip(keys.shape[-2], n, x.device, mask))
        return zero_padding(self._merge_heads(self._gated(out, x)), key_padding_mask), cache


def check_cache(state: KVCache, owner: str) -> None:
    """What check_state cannot say of a KVCache: its two buffers, its filled length and its mask agree."""
    if state.keys.shape != state.values.shape:
        raise ValueError(f"{owner} state.keys and state.values must have one shape, got "
                         f"{tuple(state.keys.shape)} and {tuple(state.values.shape)}")
    capacity = state.keys.shape[-2]
    if state.filled is not None and (isinstance(state.filled, bool) or not isinstance(state.filled, int)
                                     or not 0 <= state.filled <= capacity):
        raise ValueError(f"{owner} state.filled must be None or an int in [0, {capacity}], got {state.filled!r}")
    mask = state.mask
    if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool
                             or mask.shape != (state.keys.shape[0], capacity) or mask.device != state.keys.device):
        got = f"{tuple(mask.shape)} {mask.dtype} on {mask.device}" if isinstance(mask, torch.Tensor) else repr(mask)
        raise ValueError(f"{owner} state.mask must be None or a bool tensor of shape "
                         f"{(state.keys.shape[0], capacity)} on {state.keys.device}, got {got}")
