"""What the matrix-memory layers (gla, deltanet, ssd) share: the calling contract, padding and decoding.

Each is causal only: its memory runs over the tokens before each one. A subclass says how tokens become a
recurrence (`_mix`: queries, keys, values, decays) and how the memory's reads become outputs; this class
checks inputs, keeps padding out of the memory (a padded token writes nothing and decays nothing, so a
left-padded row computes what the row computes unpadded), and decodes: `step` runs the same chunked
recurrence from the state the previous call returned, so decoding equals the parallel forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention.dot_product import autocast_off, refuse_attn_mask
from zoo.attention.linear_recurrence import CausalConv, RecurrentState
from zoo.utils.checks import check_heads, check_padding_mask, check_state, check_tokens, flag, integer, zero_padding


class RecurrentAttention(nn.Module):
    """The base of GatedLinearAttention, DeltaNetAttention and SSDAttention (not built by itself).

    Subclasses set `memory_shape` (key width, value width per head) and implement
    `_run(x, state, real) -> (out, state)` over (batch, length, dim) tokens already zeroed at padding, with
    `real` the (batch, length) padding mask or None, `state` a RecurrentState or None.
    """

    def __init__(self, dim: int, heads: int, causal: bool):
        super().__init__()
        # the short convolution where a subclass has one (an instance attribute: a class attribute of None would
        # shadow the submodule that nn.Module keeps in _modules)
        self.conv: CausalConv | None = None
        owner = type(self).__name__
        self.head_dim = check_heads(dim, heads, owner)
        if not flag(causal, "causal", owner):
            raise ValueError(f"{owner} is causal only (its memory runs over the tokens before each one), "
                             "got causal=False")
        self.dim, self.heads, self.causal = dim, heads, True

    def _short_conv(self, width, channels: int) -> CausalConv | None:
        """The short convolution in front of the recurrence, or None for width 0."""
        width = integer(width, "conv_width", type(self).__name__, 0, 64)
        if width == 1:
            raise ValueError(f"{type(self).__name__} conv_width must be 0 (none) or in [2, 64], got 1")
        return CausalConv(channels, width) if width else None

    def _convolve(self, h: torch.Tensor, state: RecurrentState | None, real: torch.Tensor | None):
        """h through the short convolution (SiLU after it, as Mamba and DeltaNet have it), zero at padding;
        returns (h, the convolution's tail for the next call or None)."""
        if self.conv is None:
            return h, None
        h, tail = self.conv(zero_padding(h, real), None if state is None else state.conv)
        return F.silu(h), tail

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, *,
                attn_mask: None = None, is_causal: bool = False) -> torch.Tensor:
        """x (batch, length, dim) -> (batch, length, dim), zero at padding (key_padding_mask True = real token);
        is_causal is accepted (the layer is causal); an attn_mask is refused: there are no query-key weights."""
        owner = type(self).__name__
        check_tokens(x, self.dim, owner)
        key_padding_mask = check_padding_mask(key_padding_mask, x, owner)
        refuse_attn_mask(attn_mask, owner)
        flag(is_causal, "is_causal", owner)
        out, _ = self._run(zero_padding(x, key_padding_mask), None, key_padding_mask)
        return zero_padding(out, key_padding_mask)

    def step(self, x: torch.Tensor, state: RecurrentState | None = None,
             key_padding_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, RecurrentState]:
        """Continue over new tokens x (batch, new, dim) from the state the previous call returned (None to start).

        Returns:
            The outputs for the new tokens (batch, new, dim), zero at padding, and the state after them: the
            memory (batch, heads, key width, value width) and the short convolution's last inputs.
        """
        owner = type(self).__name__
        check_tokens(x, self.dim, owner)
        b, wide = x.shape[0], torch.promote_types(x.dtype, torch.float32)
        check_state(state, RecurrentState, {"memory": (b, self.heads, *self.memory_shape)}, wide, x.device, owner)
        if state is not None and (self.conv is None) != (state.conv is None):
            raise ValueError(f"{owner}.step expects the RecurrentState it returned (conv "
                             f"{'None' if self.conv is None else 'a tensor'}), got conv={type(state.conv).__name__}")
        if state is not None and self.conv is not None:
            check_state(state, RecurrentState, {"conv": (b, self.conv.width - 1, self.conv.channels)}, x.dtype,
                        x.device, owner)
        key_padding_mask = check_padding_mask(key_padding_mask, x, owner)
        out, state = self._run(zero_padding(x, key_padding_mask), state, key_padding_mask)
        return zero_padding(out, key_padding_mask), state


def heads_first(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(batch, length, heads * width) -> (batch, heads, length, width)."""
    b, n, _ = t.shape
    return t.reshape(b, n, heads, -1).transpose(1, 2)


def no_write(t: torch.Tensor, real: torch.Tensor | None) -> torch.Tensor:
    """t (batch, heads, length, ...) zeroed at padded tokens: a key or a write strength that writes nothing,
    a log decay that decays nothing."""
    if real is None:
        return t
    mask = real[:, None, :]
    return t * mask.view(*mask.shape, *([1] * (t.dim() - 3))).to(t.dtype)


def gated_rms_norm(norm: nn.RMSNorm, o: torch.Tensor, gate: torch.Tensor, heads: int | None = None) -> torch.Tensor:
    """RMSNorm over each head's channels of o (batch, heads, length, width) or over all of o (batch, length,
    width) with heads=None, then times swish(gate) (batch, length, heads * width): in float32 whatever autocast
    would pick, as the norm divides by a mean of squares. Returns (batch, length, heads * width)."""
    with autocast_off(o.device):
        o = F.rms_norm(o.float(), norm.normalized_shape, norm.weight.float(), norm.eps)
        if heads is not None:
            o = o.transpose(1, 2).flatten(2)
        return o * F.silu(gate.float())
