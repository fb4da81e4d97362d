"""Multi-head softmax self-attention (sciformer.md), with a KV cache for decoding.

sciformer.md normalizes its weights with a sum "from j = 1 to k" (k, the token width)
and scales by the square root of the token width; the sum runs over the n tokens and
the scale is the square root of the per-head width, as in "Attention Is All You Need".
Its "trainable mask" is an additive bias over (query, key) positions, one per head:
`learned_bias=True` with the model's `max_len`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from zoo.attention.attend import attend
from zoo.attention.checks import (
    check_heads,
    check_padding_mask,
    check_state,
    check_tokens,
    zero_padding,
)


@dataclass
class KVCache:
    """Keys and values of every token seen so far, each (batch, heads, length, head_dim)."""

    keys: torch.Tensor
    values: torch.Tensor

    @property
    def length(self) -> int:
        return self.keys.shape[-2]


class SoftmaxAttention(nn.Module):
    """Scaled dot-product attention through `torch.nn.functional.scaled_dot_product_attention`."""

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
    ):
        super().__init__()
        self.head_dim = check_heads(dim, heads, type(self).__name__)
        self.dim, self.heads, self.causal, self.dropout = dim, heads, causal, dropout
        self.qkv = nn.Linear(dim, 3 * dim, bias=bias)
        self.proj = nn.Linear(dim, dim, bias=bias)
        self.max_len = max_len
        if learned_bias:
            if max_len is None:
                raise ValueError(f"{type(self).__name__}(learned_bias=True) needs max_len, got None")
            self.attn_bias = nn.Parameter(torch.zeros(heads, max_len, max_len))
        else:
            self.attn_bias = None

    def _split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q, k, v

    def _merge_heads(self, out: torch.Tensor) -> torch.Tensor:
        b, _, n, _ = out.shape
        return self.proj(out.transpose(1, 2).reshape(b, n, self.dim))

    def _bias(self, start: int, stop: int) -> torch.Tensor | None:
        if self.attn_bias is None:
            return None
        if stop > self.max_len:
            raise ValueError(
                f"{type(self).__name__} has a learned bias for at most max_len={self.max_len} tokens, got {stop}"
            )
        return self.attn_bias[:, start:stop, :stop]

    def clip(self, keys: int, queries: int, device) -> tuple[float, torch.Tensor] | None:
        """The clipped softmax's (zeta, gamma); None: a plain softmax (ClippedSoftmaxAttention overrides)."""
        return None

    def gates(self, x: torch.Tensor) -> torch.Tensor | None:
        """Per-token, per-head gates on the heads' outputs; None: ungated (GatedAttention overrides)."""
        return None

    def _gated(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        gates = self.gates(x)
        return out if gates is None else out * gates.to(out.dtype)

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        check_tokens(x, self.dim, type(self).__name__)
        key_padding_mask = check_padding_mask(key_padding_mask, x, type(self).__name__)
        x = zero_padding(x, key_padding_mask)
        q, k, v = self._split_heads(x)
        n = x.shape[1]
        out = attend(
            q, k, v,
            causal=self.causal,
            key_padding_mask=key_padding_mask,
            bias=self._bias(0, n),
            quiet=self.quiet,
            clip=self.clip(n, n, x.device),
            dropout_p=self.dropout if self.training else 0.0,
        )
        return zero_padding(self._merge_heads(self._gated(out, x)), key_padding_mask)

    def step(self, x: torch.Tensor, state: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
        """Attend from the new tokens x (batch, new, dim) to the cache and themselves."""
        if not self.causal:
            raise RuntimeError(f"{type(self).__name__}.step needs causal=True: a bidirectional layer has no cache")
        owner = type(self).__name__
        check_tokens(x, self.dim, owner)
        q, k, v = self._split_heads(x)
        cached = (x.shape[0], self.heads, None, self.head_dim)  # any number of cached tokens
        check_state(state, KVCache, {"keys": cached, "values": cached}, k.dtype, k.device, owner)
        if state is not None and state.keys.shape != state.values.shape:
            raise ValueError(f"{owner} state.keys and state.values must have one shape, got "
                             f"{tuple(state.keys.shape)} and {tuple(state.values.shape)}")
        start = 0
        if state is not None:
            start = state.length
            k = torch.cat([state.keys, k], dim=-2)
            v = torch.cat([state.values, v], dim=-2)
        out = attend(q, k, v, causal=True, bias=self._bias(start, start + x.shape[1]), quiet=self.quiet,
                     clip=self.clip(k.shape[-2], x.shape[1], x.device))
        return self._merge_heads(self._gated(out, x)), KVCache(k, v)
