"""A short causal convolution: each token mixed with the few before it, the local half of Based.

Linear-time attention keeps a summary of the whole history, in which the token just before is one among
thousands; recall needs exactly that token (MQAR's value must carry the key before it). Based (Arora et
al. 2024, "Simple linear attention language models balance the recall-throughput tradeoff") and H3 (Fu et
al. 2023, "Hungry Hungry Hippos") pair linear attention with a short convolution over the last few tokens
for this. Here it is a sublayer of its own at the start of a block, with its own norm and residual, so its
output reaches the residual stream directly rather than through the attention's running mean:

    x_t <- x_t + b + sum_{k=0}^{w-1} c_k * LayerNorm(x)_{t-k}      (one weight per channel: c_k, b (dim,))

Tokens before the first count as zeros. Decoding keeps the last w - 1 normalized inputs (ConvState.tail),
a constant-size state; padding is zeroed first, so a left-padded row decodes as the same row unpadded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from zoo.utils.checks import check_padding_mask, check_tokens, integer, zero_padding

MAX_WIDTH = 64


@dataclass
class ConvState:
    """A block's decoding state when it has a short convolution: the convolution's last w - 1 inputs
    (batch, w - 1, dim), and its attention's own state (a KVCache, MicroState, ElitaState, ...)."""

    tail: torch.Tensor
    attention: object


class ShortConv(nn.Module):
    """A causal depthwise convolution of width `width` over the token axis, with a pre-norm and a residual.

    Args:
        dim: the token width, an int >= 1.
        width: how many tokens each output sees (itself and width - 1 before it), an int in [2, 64].
    """

    def __init__(self, dim: int, width: int):
        super().__init__()
        self.dim = integer(dim, "dim", "ShortConv")
        self.width = integer(width, "width", "ShortConv", 2, MAX_WIDTH)
        self.norm = nn.LayerNorm(dim)
        self.conv = nn.Conv1d(dim, dim, width, groups=dim)  # its weights and initialization; applied by hand

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None,
                tail: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x (batch, length, dim) plus the convolution of its last tokens; returns (x, tail after x).

        tail: the last width - 1 normalized inputs before x (from the previous call), or None: zeros.
        Padded tokens (key_padding_mask False) enter as zeros and get nothing added.
        """
        check_tokens(x, self.dim, "ShortConv")
        key_padding_mask = check_padding_mask(key_padding_mask, x, "ShortConv")
        want = (x.shape[0], self.width - 1, self.dim)
        if tail is not None and not (isinstance(tail, torch.Tensor) and tuple(tail.shape) == want):
            got = f"a tail of shape {tuple(tail.shape)}" if isinstance(tail, torch.Tensor) else type(tail).__name__
            raise ValueError(f"ShortConv expects tail=None or the tail of shape {want} it returned for these "
                             f"tokens, got {got}")
        h = zero_padding(self.norm(x), key_padding_mask)
        if tail is None:
            tail = h.new_zeros(want)
        h = torch.cat([tail.to(h), h], dim=1)  # (batch, width - 1 + length, dim)
        n, taps = x.shape[1], self.conv.weight[:, 0]  # taps (dim, width): the last multiplies the token itself
        if n == 1:  # a decoding step: the window times the taps at once (timed, 1 thread: 7 us against 25 below)
            wide = torch.promote_types(h.dtype, taps.dtype)  # as the products below promote (vecdot does not)
            mixed = torch.linalg.vecdot(h.unsqueeze(1).transpose(-1, -2).to(wide), taps.to(wide)) + self.conv.bias
        else:
            # w shifted products, not F.conv1d: the same numbers, as fast at training lengths; unfolding the
            # windows would be as fast as one step here but 2-3x slower to train (it materializes each window)
            mixed = self.conv.bias + h[:, :n] * taps[:, 0]
            for k in range(1, self.width):
                mixed = mixed + h[:, k:k + n] * taps[:, k]  # position t sees t - w + 1 + k
        return x + zero_padding(mixed, key_padding_mask), h[:, h.shape[1] - (self.width - 1):].clone()
