"""The one place that decides how dot-product attention runs.

Softmax attention, quiet attention and fused attention all end here, so the choice
between PyTorch's fused kernels (`is_causal` or no mask: O(L) memory, causal block
skipping) and an explicit mask is made once.

Quiet attention (softmax_one) needs no kernel of its own: prepending a key of zeros
with a value of zeros adds exp(q . 0) = 1 to every row's denominator and nothing to
its numerator, which is exactly exp(s_j) / (1 + sum_j exp(s_j)). The fused kernels
then do the work unchanged.

On the CPU, PyTorch's flash kernel is slow in half precision on short sequences when
training: at L = 49 in bf16 its backward pass takes about 3x as long as the math
kernel's (its forward is faster). Short half-precision problems that need a gradient
therefore go through the math kernel on the CPU; everything else keeps the kernel that
PyTorch picks.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHORT_KEYS = 128  # up to this many keys the math kernel trains faster on the CPU in half precision


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    if (q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and k.shape[-2] <= SHORT_KEYS
            and torch.is_grad_enabled() and q.requires_grad):
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def autocast_off(device: torch.device):
    """A context that turns autocast off on `device`: for small projections whose input precision matters.
    Autocast knows no meta device (timm builds and checks models there), and there is nothing to turn off."""
    return torch.autocast(device.type, enabled=False) if device.type != "meta" else contextlib.nullcontext()


def _prepend_zero(t: torch.Tensor) -> torch.Tensor:
    return torch.cat([t.new_zeros(*t.shape[:-2], 1, t.shape[-1]), t], dim=-2)


def allowed_keys(lq: int, lk: int, device, causal: bool = False,
                 key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Which key each query may see, (Lq, Lk) or (B, 1, Lq, Lk) with padding: queries aligned to the
    end of the keys (as with a KV cache), causal ones up to their own position, padded keys never."""
    allowed = torch.ones(lq, lk, dtype=torch.bool, device=device)
    offset = lk - lq
    if causal:
        allowed = allowed.tril(diagonal=offset)
    if key_padding_mask is not None:
        allowed = allowed & key_padding_mask[:, None, None, :]
        # A padded query with no real key before it would get an empty softmax row (NaN);
        # letting every token see itself keeps those rows finite and touches no real query.
        own_key = torch.arange(lk, device=device) == torch.arange(lq, device=device)[:, None] + offset
        allowed = allowed | own_key
    return allowed


def attention_weights(q: torch.Tensor, k: torch.Tensor, *, causal: bool = False,
                      key_padding_mask: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                      quiet: bool = False, clip: tuple[float, float] | None = None) -> torch.Tensor:
    """The weights `attend` applies, (B, H, Lq, Lk), built explicitly in at least float32: for pictures
    (zoo.viz.capture), and for the normalization no fused kernel computes (clipped softmax).
    With quiet, rows sum to less than 1: the rest is the weight of "nothing"."""
    from zoo.attention.clipped import clipped_softmax
    from zoo.attention.quiet import softmax_one

    wide = torch.promote_types(q.dtype, torch.float32)
    logits = (q.to(wide) @ k.to(wide).transpose(-1, -2)) * q.shape[-1] ** -0.5
    if bias is not None:
        logits = logits + bias.to(wide)
    allowed = allowed_keys(q.shape[-2], k.shape[-2], q.device, causal, key_padding_mask)
    logits = logits.masked_fill(~allowed, float("-inf"))
    if clip is not None:
        return clipped_softmax(logits, -1, *clip)
    return softmax_one(logits, dim=-1) if quiet else logits.softmax(-1)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    key_padding_mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    quiet: bool = False,
    clip: tuple[float, float] | None = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Multi-head attention over q (B, H, Lq, d) and k, v (B, H, Lk, d).

    causal: query i (aligned to the end of the keys, as with a KV cache) sees keys up
        to its own position.
    key_padding_mask: (B, Lk) bool, True for real tokens; padded keys are never attended.
    bias: (H, Lq, Lk) additive logits (sciformer's trainable mask).
    quiet: normalize with softmax_one instead of softmax.
    clip: (zeta, gamma) of the clipped softmax (zoo/attention/clipped.py), on the explicit path.
    """
    lq, lk = q.shape[-2], k.shape[-2]
    if clip is not None:  # no fused kernel computes it: the weights are built, then applied
        weights = attention_weights(q, k, causal=causal, key_padding_mask=key_padding_mask, bias=bias, clip=clip)
        weights = F.dropout(weights, dropout_p) if dropout_p else weights
        return weights.to(v.dtype) @ v
    if key_padding_mask is None and bias is None and (not causal or lq == lk):
        if quiet and causal:
            # A dummy query in front keeps the problem square, so is_causal stays valid:
            # row i+1 then sees the zero key and real keys 0..i.
            out = _sdpa(
                _prepend_zero(q), _prepend_zero(k), _prepend_zero(v), dropout_p=dropout_p, is_causal=True
            )
            return out[..., 1:, :]
        if quiet:
            k, v = _prepend_zero(k), _prepend_zero(v)
        return _sdpa(q, k, v, dropout_p=dropout_p, is_causal=causal)

    allowed = allowed_keys(lq, lk, q.device, causal, key_padding_mask)
    if quiet:
        k, v = _prepend_zero(k), _prepend_zero(v)
        allowed = F.pad(allowed, (1, 0), value=True)
        if bias is not None:
            bias = F.pad(bias, (1, 0))
    mask = allowed
    if bias is not None:
        mask = torch.where(allowed, bias.to(q.dtype), float("-inf"))
    return _sdpa(q, k, v, attn_mask=mask, dropout_p=dropout_p)
