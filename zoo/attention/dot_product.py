"""The one place that decides how dot-product attention runs.

Softmax attention, quiet attention and fused attention all end here, so the choice
between PyTorch's fused kernels (`is_causal` or no mask: O(L) memory, causal block
skipping) and an explicit mask is made once.

Quiet attention (softmax_one) needs no kernel of its own: prepending a key of zeros
with a value of zeros adds exp(q . 0) = 1 to every row's denominator and nothing to
its numerator, which is exactly exp(s_j) / (1 + sum_j exp(s_j)). The fused kernels
then do the work unchanged.

On the CPU, PyTorch's flash kernel is slow in half precision on short sequences when
training: its bf16 backward takes 2-4x as long as its float32 one up to a few hundred
keys. Short half-precision problems that need a gradient therefore run the flash kernel
in float32 (q, k and v cast up, the output cast back), which also beats the math kernel
in bf16 (forward and backward, 1 thread, AVX-512 with bf16 and no AMX: 2.0 against 3.0 ms
at gpt-tiny's shapes, 64 keys; 6.9 against 8.8 at a ViT's 50; 31 against 40 (bf16 flash)
at 256; bf16 flash is faster from about 1,000 keys). Everything else keeps the kernel
that PyTorch picks.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from zoo.attention.normalizers import clipped_softmax, softmax_one

SHORT_KEYS = 256  # up to this many keys float32's flash kernel trains faster on the CPU than half precision's


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
          **kwargs) -> torch.Tensor:
    if attn_mask is not None and attn_mask.dim() == 3:
        # A per-head mask (H, Lq, Lk), ALiBi's or a learned bias, broadcasts as (1, H, Lq, Lk), but PyTorch's CPU
        # flash kernel takes 2-D and 4-D masks only: given 3-D it falls back to the math kernel, which builds every
        # B x H x Lq x Lk weight (gpt-tiny:alibi's training step at 784 tokens 1.95x gpt-tiny's there, 1.27x on the
        # flash kernel: python bench/capabilities.py --estimate --only 'pixel_mnist_permuted/gpt-tiny:alibi/0')
        attn_mask = attn_mask.unsqueeze(0)
    if attn_mask is not None:
        kwargs["attn_mask"] = attn_mask
    if (q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and k.shape[-2] <= SHORT_KEYS
            and torch.is_grad_enabled() and q.requires_grad):
        mask = kwargs.get("attn_mask")
        if mask is not None and mask.is_floating_point():
            kwargs["attn_mask"] = mask.float()
        with autocast_off(q.device):  # autocast would cast float32 inputs straight back to bf16 for SDPA
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kwargs).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def autocast_off(device: torch.device):
    """A context that turns autocast off on `device`: for small projections whose input precision matters.
    Autocast knows no meta device (timm builds and checks models there); where it is off there is nothing to turn
    off, and entering a context costs a decoding step more than its arithmetic."""
    if device.type == "meta" or not torch.is_autocast_enabled(device.type):
        return contextlib.nullcontext()
    return torch.autocast(device.type, enabled=False)


def _prepend_zero(t: torch.Tensor) -> torch.Tensor:
    return torch.cat([t.new_zeros(*t.shape[:-2], 1, t.shape[-1]), t], dim=-2)


def check_attn_mask(mask, batch: int, heads: int, lq: int, lk: int, device, owner: str) -> torch.Tensor | None:
    """Require an attn_mask as timm and F.scaled_dot_product_attention take it: (Lq, Lk) or
    (batch or 1, heads or 1, Lq, Lk), boolean (True = may attend) or floating point (added to the logits)."""
    if mask is None:
        return None
    expected = f"({lq}, {lk}) or (batch {batch} or 1, heads {heads} or 1, {lq}, {lk})"
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{owner} expects attn_mask as a torch.Tensor of shape {expected} or None, "
                        f"got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise ValueError(f"{owner} expects attn_mask as bool (True = may attend) or float (added to the logits), "
                         f"got dtype {mask.dtype}")
    shape = tuple(mask.shape)
    if not (shape == (lq, lk) or len(shape) == 4 and shape[0] in (1, batch) and shape[1] in (1, heads)
            and shape[2:] == (lq, lk)):
        raise ValueError(f"{owner} expects attn_mask of shape {expected}, got {shape}")
    if mask.device != device:
        raise ValueError(f"{owner} expects attn_mask on the input's device ({device}), got {mask.device}")
    return mask


def refuse_attn_mask(attn_mask, owner: str) -> None:
    """For the mechanisms with no query-key weights (micro, elita), which no arbitrary mask can act on."""
    if attn_mask is not None:
        raise ValueError(f"{owner} cannot apply an attn_mask: it has no query-key weights to mask; pass "
                         "key_padding_mask (True = real token) and is_causal=True instead")


def _split_mask(attn_mask: torch.Tensor | None, bias: torch.Tensor | None):
    """An attn_mask as (the keys it allows, or None; the bias with its additive logits, or None)."""
    if attn_mask is None or attn_mask.dtype == torch.bool:
        return attn_mask, bias
    return None, attn_mask if bias is None else bias + attn_mask


def allowed_keys(lq: int, lk: int, device, causal: bool = False,
                 key_padding_mask: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Which key each query may see, (Lq, Lk), or (B, H or 1, Lq, Lk) with padding or a boolean attn_mask:
    queries aligned to the end of the keys (as with a KV cache), causal ones up to their own position,
    keys the attn_mask forbids and padded keys never (a padded query sees its own key besides)."""
    allowed = torch.ones(lq, lk, dtype=torch.bool, device=device)
    offset = lk - lq
    if causal:
        allowed = allowed.tril(diagonal=offset)
    if attn_mask is not None:
        allowed = allowed & attn_mask
    if key_padding_mask is not None:
        allowed = allowed & key_padding_mask[:, None, None, :]
        # A padded query with no real key before it would get an empty softmax row (NaN); letting each padded
        # query see itself keeps those rows finite. Only padded queries: a real query's own key stays as the
        # attn_mask left it (a mask that forbids it is obeyed, as nn.MultiheadAttention obeys it).
        own_key = torch.arange(lk, device=device) == torch.arange(lq, device=device)[:, None] + offset
        padded_query = ~key_padding_mask[:, offset:]  # (B, Lq): queries sit at the last Lq keys' positions
        allowed = allowed | (own_key & padded_query[:, None, :, None])
    return allowed


def attention_weights(q: torch.Tensor, k: torch.Tensor, *, causal: bool = False,
                      key_padding_mask: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                      quiet: bool = False, clip: tuple[float, float] | None = None,
                      attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The weights `attend` applies, (B, H, Lq, Lk), built explicitly in at least float32: for pictures
    (zoo.viz.capture), and for the normalization no fused kernel computes (clipped softmax).
    With quiet, rows sum to less than 1: the rest is the weight of "nothing"."""
    attn_mask, bias = _split_mask(attn_mask, bias)
    wide = torch.promote_types(q.dtype, torch.float32)
    logits = (q.to(wide) @ k.to(wide).transpose(-1, -2)) * q.shape[-1] ** -0.5
    if bias is not None:
        logits = logits + bias.to(wide)
    allowed = allowed_keys(q.shape[-2], k.shape[-2], q.device, causal, key_padding_mask, attn_mask)
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
    attn_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Multi-head attention over q (B, H, Lq, d) and k, v (B, H, Lk, d).

        out = norm(q k^T / sqrt(d) + bias, masked) v

    with norm softmax, softmax_one (`quiet`) or the clipped softmax (`clip`). The one place that picks
    PyTorch's fused SDPA kernels (no mask, or a square causal problem) or an explicit mask; softmax_one runs
    in the fused kernels by a prepended key and value of zeros, which adds exactly 1 to each denominator.

    Args:
        q: the queries, (B, H, Lq, d).
        k: the keys, (B, H, Lk, d); the queries are aligned to the end of the keys (as with a KV cache).
        v: the values, (B, H, Lk, d_v), usually d_v = d.
        causal: query i (aligned to the end of the keys) sees keys up to its own position only;
            default False: every key.
        key_padding_mask: (B, Lk) bool, True for real tokens; padded keys are never attended (a padded query
            with no real key before it sees itself, so its row stays finite). Default None: all real.
        bias: (H, Lq, Lk) additive logits (SciFormer's trainable mask), or None (default).
        quiet: normalize with softmax_one instead of softmax (default False).
        clip: (zeta, gamma) of the clipped softmax (zoo/attention/clipped.py), computed on the explicit path;
            gamma a number or a tensor broadcasting over (Lq, Lk). Default None: no clipping.
        dropout_p: the dropout probability on the weights, in [0, 1) (default 0; pass 0 at evaluation).
        attn_mask: as F.scaled_dot_product_attention takes it, broadcasting over (B, H, Lq, Lk): bool, True
            where the query may attend, or float, added to the logits (-inf forbids). A row it forbids
            entirely is NaN with softmax, as in PyTorch, and zero with softmax_one. Default None.

    Returns:
        The attention outputs, (B, H, Lq, d_v).
    """
    lq, lk = q.shape[-2], k.shape[-2]
    if clip is not None:  # no fused kernel computes it: the weights are built, then applied
        weights = attention_weights(q, k, causal=causal, key_padding_mask=key_padding_mask, bias=bias, clip=clip,
                                    attn_mask=attn_mask)
        weights = F.dropout(weights, dropout_p) if dropout_p else weights
        return weights.to(v.dtype) @ v
    attn_mask, bias = _split_mask(attn_mask, bias)
    if key_padding_mask is None and bias is None and attn_mask is None and (not causal or lq == lk):
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

    if bias is not None and key_padding_mask is None and attn_mask is None and not causal and not quiet:
        return _sdpa(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=dropout_p)  # nothing to mask: the bias is all
    allowed = allowed_keys(lq, lk, q.device, causal, key_padding_mask, attn_mask)
    if quiet:
        k, v = _prepend_zero(k), _prepend_zero(v)
        allowed = F.pad(allowed, (1, 0), value=True)
        if bias is not None:
            bias = F.pad(bias, (1, 0))
    mask = allowed
    if bias is not None:
        mask = torch.where(allowed, bias.to(q.dtype), float("-inf"))
    return _sdpa(q, k, v, attn_mask=mask, dropout_p=dropout_p)
