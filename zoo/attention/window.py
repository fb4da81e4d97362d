"""Sliding-window attention: softmax attention over the last W tokens only.

The local attention of Longformer (Beltagy et al. 2020) and Mistral 7B (Jiang et al. 2023), and the
sliding-window baseline of Zoology (Arora et al. 2023) and Based: token i attends to keys i - W + 1 .. i
(causal) or to keys within W - 1 of it on either side (bidirectional). Its decoding state is the last
W - 1 keys and values, O(W) however long the sequence, and a token's work is O(W).

Training a causal layer runs in blocks of W queries, each against its own block and the one before
(2W keys): O(L W) time and memory, never an L x L mask. A bidirectional layer, or a call with an
attn_mask, builds the band as a mask over all keys (O(L^2), the softmax family's explicit path).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from zoo.attention.dot_product import attend, check_attn_mask
from zoo.attention.positions import alibi_bias, alibi_slopes
from zoo.attention.softmax import SoftmaxAttention
from zoo.utils.checks import check_padding_mask, check_state, check_tokens, flag, integer, zero_padding


@dataclass
class WindowCache:
    """The decoding state of a causal WindowAttention: the last (at most) W - 1 keys and values.

    Args:
        keys: (batch, heads, kept, head_dim), the keys of the last `kept` tokens, rotated where positions="rope".
        values: (batch, heads, kept, head_dim).
        mask: (batch, kept) bool, True for real tokens, or None: all real.
        seen: how many tokens came before (the position of the next one).
    """

    keys: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor | None = None
    seen: int = 0


def band(lq: int, lk: int, window: int, causal: bool, device) -> torch.Tensor:
    """(Lq, Lk) bool, True where query i (aligned to the end of the keys) may see key j: within `window` tokens,
    j <= i when causal."""
    offset = lk - lq
    distance = (torch.arange(lq, device=device)[:, None] + offset) - torch.arange(lk, device=device)
    near = distance < window
    return near & (distance >= 0) if causal else near & (distance > -window)


class WindowAttention(SoftmaxAttention):
    """Multi-head softmax attention over a sliding window of W tokens (Longformer's and Mistral's local attention).

        head_h(i) = softmax_j(q_i . k_j / sqrt(d) + B_h(i, j)) over i - W < j <= i (causal), |i - j| < W (not)

    Same weights (qkv, proj), options and inputs as SoftmaxAttention, whose q, k, v `swap` keeps; positions
    ("rope", "alibi") and a learned bias work as there. A causal layer decodes with `step` from a WindowCache of
    the last W - 1 keys and values.

    Args:
        dim: the token width, an int >= 1 divisible by `heads`.
        heads: the number of heads, an int >= 1 (default 1).
        causal: True: the W tokens up to and including each one, and `step` decodes; default False: the tokens
            within W - 1 on either side.
        window: W, an int >= 1 (default 64).
        **kwargs (Any): SoftmaxAttention's other options: `bias`, `dropout`, `max_len`, `learned_bias`,
            `positions` ("rope", "alibi"), `rope_base`, `alibi_bias_max`.
    """

    def __init__(self, dim: int, heads: int = 1, causal: bool = False, window: int = 64, **kwargs):
        window = integer(window, "window", type(self).__name__)
        super().__init__(dim, heads=heads, causal=causal, **kwargs)
        self.window = window

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, *,
                context: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None,
                is_causal: bool = False) -> torch.Tensor:
        """As SoftmaxAttention.forward, each query seeing only its window; cross-attention (`context`) is refused:
        a window is defined within one sequence."""
        owner = type(self).__name__
        if context is not None:
            raise ValueError(f"{owner} attends within one sequence (a window of its own tokens); cross-attention to "
                             "a context needs softmax, quiet, clipped or gated")
        check_tokens(x, self.dim, owner)
        causal = self.causal or flag(is_causal, "is_causal", owner)
        n = x.shape[1]
        attn_mask = check_attn_mask(attn_mask, x.shape[0], self.heads, n, n, x.device, owner)
        # an exported graph takes the band over all keys at every length (no branch on the length)
        if torch.compiler.is_exporting() or not causal or attn_mask is not None or n <= 2 * self.window:
            near = band(n, n, self.window, causal, x.device)
            if attn_mask is None:
                attn_mask = near
            elif attn_mask.dtype == torch.bool:
                attn_mask = attn_mask & near
            else:
                attn_mask = attn_mask.masked_fill(~near, float("-inf"))
            return super().forward(x, key_padding_mask, attn_mask=attn_mask, is_causal=causal)
        key_padding_mask = check_padding_mask(key_padding_mask, x, owner)
        x = zero_padding(x, key_padding_mask)
        q, k, v = self._split_heads(x)
        out = self._blocked(q, k, v, key_padding_mask)
        return zero_padding(self._merge_heads(self._gated(out, x)), key_padding_mask)

    def _blocked(self, q, k, v, key_padding_mask):
        """Causal attention in blocks of W queries, each over its own block and the one before."""
        b, h, n, d = q.shape
        w = self.window
        pad = -n % w
        blocks = (n + pad) // w
        q, k, v = (F.pad(t, (0, 0, 0, pad)).view(b, h, blocks, w, d) for t in (q, k, v))
        k = torch.cat([F.pad(k, (0, 0, 0, 0, 1, 0))[:, :, :-1], k], 3)  # (b, h, blocks, 2w, d): previous, own
        v = torch.cat([F.pad(v, (0, 0, 0, 0, 1, 0))[:, :, :-1], v], 3)
        real = torch.ones(b, n, dtype=torch.bool, device=q.device) if key_padding_mask is None else key_padding_mask
        real = F.pad(real, (w, pad)).view(b, blocks + 1, w)  # the block before the first is not there
        keys_real = torch.cat([real[:, :-1], real[:, 1:]], 2)  # (b, blocks, 2w)
        allowed = band(w, 2 * w, w, True, q.device) & keys_real[:, None, :, None, :]  # (b, 1, blocks, w, 2w)
        # a padded query sees its own key besides (its row stays finite; its output is zeroed), as attend does
        own = torch.eye(w, dtype=torch.bool, device=q.device)
        allowed = allowed | (F.pad(own, (w, 0)) & ~real[:, 1:, :, None])[:, None]
        mask = allowed
        bias = self._window_bias(torch.arange(n + pad, device=q.device).view(blocks, w))
        if bias is not None:
            mask = torch.where(allowed, bias.to(q.dtype), float("-inf"))
        out = attend(q.flatten(1, 2), k.flatten(1, 2), v.flatten(1, 2),
                     attn_mask=mask.expand(b, h, blocks, w, 2 * w).flatten(1, 2),
                     dropout_p=self.dropout if self.training else 0.0)
        return out.view(b, h, blocks * w, d)[:, :, :n]

    def _window_bias(self, queries: torch.Tensor) -> torch.Tensor | None:
        """The additive logits (learned bias and ALiBi's) of queries at positions `queries` (blocks, w) over the
        2w keys before and in their block, (heads, blocks, w, 2w); None without either."""
        keys = torch.cat([queries - self.window, queries], 1)  # (blocks, 2w); negative ones are masked out
        bias = None
        if self.attn_bias is not None:
            if int(queries.max()) >= self.max_len:
                raise ValueError(f"{type(self).__name__} has a learned bias for at most max_len={self.max_len} "
                                 f"tokens, got {int(queries.max()) + 1}")
            bias = self.attn_bias[:, queries[:, :, None], keys.clamp(min=0)[:, None, :]]
        if self.positions == "alibi":
            slopes = alibi_slopes(self.heads, bias_max=self.alibi_bias_max, dtype=torch.float32, device=queries.device)
            alibi = alibi_bias(slopes, queries, keys, causal=True)  # (blocks, heads, w, 2w)
            alibi = alibi.transpose(0, 1)
            bias = alibi if bias is None else bias + alibi
        return bias

    def step(self, x: torch.Tensor, state: WindowCache | None = None,
             key_padding_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, WindowCache]:
        """Attend from the new tokens x (batch, new, dim) to the window's cached tokens and themselves.

        Args:
            x: the new tokens, (batch, new, dim), following those in `state`.
            state: the WindowCache the previous call returned, or None to start a sequence.
            key_padding_mask: (batch, new) bool, True for real tokens; padding is never attended.

        Returns:
            The outputs (batch, new, dim), zero at padding, and the cache of the last W - 1 tokens.
        """
        owner = type(self).__name__
        if not self.causal:
            raise RuntimeError(f"{owner}.step needs causal=True: a bidirectional window sees the future")
        check_tokens(x, self.dim, owner)
        key_padding_mask = check_padding_mask(key_padding_mask, x, owner)
        x = zero_padding(x, key_padding_mask)
        q, k, v = self._project(x)
        cached = (x.shape[0], self.heads, None, self.head_dim)
        check_state(state, WindowCache, {"keys": cached, "values": cached}, k.dtype, k.device, owner)
        seen = 0 if state is None else state.seen
        if self.attn_bias is not None and seen and (key_padding_mask is not None or state.mask is not None):
            raise ValueError(f"{owner} has a learned bias over absolute positions, which padded decoding would shift: "
                             "decode sequences of different lengths one at a time")
        q, k = self._rotate(q, k, seen)
        n = x.shape[1]
        if state is not None and state.keys.shape[-2]:
            kept = state.keys.shape[-2]
            k, v = torch.cat([state.keys, k], -2), torch.cat([state.values, v], -2)
            if state.mask is not None or key_padding_mask is not None:
                old = state.mask if state.mask is not None else x.new_ones(x.shape[0], kept, dtype=torch.bool)
                new = key_padding_mask if key_padding_mask is not None else x.new_ones(x.shape[0], n, dtype=torch.bool)
                mask = torch.cat([old, new], 1)
            else:
                mask = None
        else:
            kept, mask = 0, key_padding_mask
        m = k.shape[-2]
        queries = torch.arange(seen, seen + n, device=x.device)
        keys = torch.arange(seen - kept, seen + n, device=x.device)
        bias = None
        if self.attn_bias is not None:
            if seen + n > self.max_len:
                raise ValueError(f"{owner} has a learned bias for at most max_len={self.max_len} tokens, got "
                                 f"{seen + n}")
            bias = self.attn_bias[:, queries[:, None], keys[None, :]]
        if self.positions == "alibi":
            slopes = alibi_slopes(self.heads, bias_max=self.alibi_bias_max, dtype=torch.float32, device=x.device)
            alibi = alibi_bias(slopes, queries, keys, causal=True)
            bias = alibi if bias is None else bias + alibi
        out = attend(q, k, v, key_padding_mask=mask, bias=bias, attn_mask=band(n, m, self.window, True, x.device))
        keep = min(self.window - 1, m)
        cache = WindowCache(k[:, :, m - keep:], v[:, :, m - keep:], None if mask is None else mask[:, m - keep:],
                            seen + n)
        return zero_padding(self._merge_heads(self._gated(out, x)), key_padding_mask), cache
