"""Zoo's softmax-family attention as Hugging Face transformers attention functions: one keyword away.

    model = AutoModelForCausalLM.from_config(config, attn_implementation="zoo_quiet")

transformers (5.x) routes every layer written against its `AttentionInterface` (GPT-2, Llama, Mistral, Qwen2,
ViT, ...) through the function registered under the model's `attn_implementation`. This module writes zoo's
normalizers as such functions and registers them, with transformers' SDPA mask builder beside each (so the
model hands them the masks it hands `sdpa`: a (batch, 1, queries, keys) boolean mask, or None where a plain
causal or bidirectional problem needs none):

    zoo_softmax      softmax, through PyTorch's fused kernels: the same numbers as transformers' "sdpa"
    zoo_quiet        softmax_one, exp(s_j) / (1 + sum exp(s)): a head may attend to nothing (quiet.py)
    zoo_clipped      the clipped softmax, gamma = -alpha / (keys the row sees), alpha 4, zeta 1 (clipped.py)
    zoo_alibi        softmax plus ALiBi's -m_h (i - j) (positions.py), for models with no positions of their own
    zoo_quiet_alibi  softmax_one plus ALiBi

Everything transformers' `sdpa` honours is honoured the same way: the causal, padding and sliding-window
masks the model builds, grouped-query attention (`module.num_key_value_groups`), `dropout`, `scaling`, a
`position_bias` (T5-style models), half precision; like `sdpa` they return no weights (None). `softcap` is
refused, as `sdpa` refuses it. ALiBi counts a key's position as its slot in the key/value tensor and the
queries as the last slots, as transformers' DynamicCache lays them out (generate's default); a StaticCache,
whose empty slots trail the queries, would shift the distances.

Registration: `register_attention_functions()` (idempotent). `import zoo` calls it when transformers is
already imported; when transformers is imported after zoo, its import hook in zoo (or the user) calls it.
transformers itself is never imported by this module until then, so zoo works without it.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from zoo.attention.normalizers import clipped_softmax
from zoo.attention.positions import alibi_bias, alibi_slopes, check_alibi_bias_max
from zoo.utils.checks import number, shown

NORMALIZERS = ("softmax", "quiet", "clipped")


def _repeat_kv(t: torch.Tensor, groups: int) -> torch.Tensor:
    """(batch, kv_heads, length, d) -> (batch, kv_heads * groups, length, d), each kv head for its query heads."""
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def _prepend_zero(t: torch.Tensor) -> torch.Tensor:
    return torch.cat([t.new_zeros(*t.shape[:-2], 1, t.shape[-1]), t], dim=-2)


def _allowed(mask: torch.Tensor) -> torch.Tensor:
    """A transformers mask as booleans, True where the query may attend: a bool mask as it is, an additive one
    (eager's: 0 or the dtype's lowest number, or -inf) wherever it is above half the dtype's lowest."""
    return mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2


def _zoo_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                   is_causal: bool | None = None, position_bias: torch.Tensor | None = None, *,
                   normalizer: str, alibi: bool, alpha: float, zeta: float, alibi_bias_max: float,
                   **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: q (B, H, Lq, d), k and v (B, H_kv, Lk, d), the model's mask;
    returns (B, Lq, H, d_v) and no weights."""
    if kwargs.get("softcap") is not None:
        raise ValueError(f"zoo's attention functions take no softcap (transformers' sdpa refuses it too), got "
                         f"softcap={shown(kwargs['softcap'])}; use attn_implementation='eager'")
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    q_len = query.shape[-2]
    layer_causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # As transformers' sdpa decides: a prompt with no mask is causal by the flag; a mask, or one query, says all
    causal = q_len > 1 and attention_mask is None and bool(layer_causal)
    if causal and key.shape[-2] > q_len:
        # sdpa's reading of the flag is top-left aligned: a prefill into an empty StaticCache, whose trailing
        # slots are empty, sees only the first q_len keys (transformers crops them the same way)
        key, value = key[..., :q_len, :], value[..., :q_len, :]
        if position_bias is not None:
            position_bias = position_bias[..., :q_len]
    kv_len = key.shape[-2]
    bias = position_bias
    if alibi:
        slopes = alibi_slopes(query.shape[1], bias_max=alibi_bias_max, dtype=torch.float32, device=query.device)
        positions = torch.arange(kv_len, device=query.device)
        table = alibi_bias(slopes, positions[kv_len - q_len:], positions, causal=bool(layer_causal))[None]
        bias = table if bias is None else bias + table
    if normalizer == "clipped":
        out = _clipped(query, key, value, attention_mask, bias, causal, dropout, scaling, alpha, zeta)
        return out.transpose(1, 2).contiguous(), None
    mask = attention_mask
    if bias is not None:  # one additive mask: the bias where the key is allowed, the dtype's lowest elsewhere
        lowest = torch.finfo(query.dtype).min
        if mask is None and causal:
            mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril()
        mask = bias.to(query.dtype) if mask is None else torch.where(_allowed(mask), bias.to(query.dtype), lowest)
        causal = False
    if normalizer == "quiet":
        # softmax_one in the fused kernels: a key of zeros with a value of zeros adds exp(0) = 1 to each row's
        # denominator and nothing to its numerator, whatever the scaling (dot_product.py)
        if causal:  # a zero query in front keeps the problem square for the causal flag; its row is dropped
            out = F.scaled_dot_product_attention(_prepend_zero(query), _prepend_zero(key), _prepend_zero(value),
                                                 dropout_p=dropout, is_causal=True, scale=scaling)
            return out[..., 1:, :].transpose(1, 2).contiguous(), None
        key, value = _prepend_zero(key), _prepend_zero(value)
        if mask is not None:
            mask = F.pad(mask, (1, 0), value=True if mask.dtype == torch.bool else 0.0)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, is_causal=causal,
                                         scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def _clipped(query, key, value, mask, bias, causal: bool, dropout: float, scaling: float | None,
             alpha: float, zeta: float) -> torch.Tensor:
    """The clipped softmax, built explicitly in at least float32 (no fused kernel computes it): gamma counts the
    keys each row may see, as ClippedSoftmaxAttention counts them, so a padded batch row gets its own gamma."""
    q_len, kv_len = query.shape[-2], key.shape[-2]
    wide = torch.promote_types(query.dtype, torch.float32)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    logits = (query.to(wide) @ key.to(wide).transpose(-1, -2)) * scaling
    allowed = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device)
    if causal:
        allowed = allowed.tril()
    if mask is not None:
        allowed = allowed & _allowed(mask)
        if mask.dtype != torch.bool:  # an additive mask may carry more than 0 and the lowest (a bias)
            logits = logits + torch.where(_allowed(mask), mask.to(wide), 0.0)
    if bias is not None:
        logits = logits + bias.to(wide)
    logits = logits.masked_fill(~allowed, float("-inf"))
    seen = allowed.sum(-1, keepdim=True, dtype=wide).clamp(min=1)
    # A row with no key at all is softmax's NaN; it attends to nothing here, as the clip lets any row do
    weights = clipped_softmax(logits.nan_to_num(nan=0.0), -1, zeta, -alpha / seen) * allowed
    weights = weights.nan_to_num(nan=0.0)
    if dropout:
        weights = F.dropout(weights, dropout)
    return weights.to(value.dtype) @ value


def attention_function(normalizer: str = "softmax", alibi: bool = False, alpha: float = 4.0, zeta: float = 1.0,
                       alibi_bias_max: float = 8.0) -> Callable:
    """A transformers attention function (the `AttentionInterface` contract) normalizing with zoo's `normalizer`.

    Register it under a name of your own to change the clipped softmax's alpha or ALiBi's slopes:
    `AttentionInterface.register("zoo_clipped_half", attention_function("clipped", alpha=0.5))` (and
    `AttentionMaskInterface.register("zoo_clipped_half", sdpa_mask)` so that the model builds its masks).

    Args:
        normalizer: "softmax", "quiet" (softmax_one) or "clipped" (the clipped softmax).
        alibi: add ALiBi's linear position bias, -m_h (i - j) for causal layers, -m_h |i - j| otherwise
            (default False).
        alpha: the clipped softmax's gamma = -alpha / (keys the row sees), a number >= 0 (default 4, as
            ClippedSoftmaxAttention's); read with normalizer="clipped" only.
        zeta: the clipped softmax's upper stretch, a number >= 1 (default 1); read with normalizer="clipped" only.
        alibi_bias_max: the exponent of ALiBi's slowest slope, a number in (0, 126] (default 8); other than 8
            only with alibi=True.

    Returns:
        f(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
        position_bias=None, **kwargs) -> (output (batch, queries, heads, head_dim), None).
    """
    owner = "attention_function"
    if not isinstance(normalizer, str) or normalizer not in NORMALIZERS:
        raise ValueError(f"{owner} expects normalizer as one of {list(NORMALIZERS)}, got {shown(normalizer)}")
    if not isinstance(alibi, bool):
        raise TypeError(f"{owner} expects alibi as a bool, got {shown(alibi)}")
    alpha, zeta = number(alpha, "alpha", owner), number(zeta, "zeta", owner, minimum=1.0)
    alibi_bias_max = check_alibi_bias_max("alibi" if alibi else None, alibi_bias_max, owner)
    function = functools.partial(_zoo_attention, normalizer=normalizer, alibi=alibi, alpha=alpha, zeta=zeta,
                                 alibi_bias_max=alibi_bias_max)
    functools.update_wrapper(function, _zoo_attention)
    return function


# The names registered, after transformers' own ("sdpa", "flash_attention_2", "flex_attention"): lowercase words
ATTENTION_FUNCTIONS: dict[str, Callable] = {
    "zoo_softmax": attention_function("softmax"),
    "zoo_quiet": attention_function("quiet"),
    "zoo_clipped": attention_function("clipped"),
    "zoo_alibi": attention_function("softmax", alibi=True),
    "zoo_quiet_alibi": attention_function("quiet", alibi=True),
}


def register_attention_functions() -> list[str]:
    """Register zoo's attention functions with transformers, so that `attn_implementation="zoo_quiet"` works.

    Each name in ATTENTION_FUNCTIONS goes into transformers' `AttentionInterface`, and transformers' SDPA mask
    builder under the same name into its `AttentionMaskInterface` (without one, transformers would hand the
    function no mask at all, padding included). Calling it again re-registers the same functions: harmless.

    Returns:
        The names registered: zoo_softmax, zoo_quiet, zoo_clipped, zoo_alibi, zoo_quiet_alibi.
    """
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError as error:
        raise ImportError("register_attention_functions needs transformers >= 5 (pip install "
                          f"'attention-zoo[hf]'): {error}") from error
    for name, function in ATTENTION_FUNCTIONS.items():
        AttentionInterface.register(name, function)
        AttentionMaskInterface.register(name, sdpa_mask)
    return list(ATTENTION_FUNCTIONS)


def register_if_imported() -> bool:
    """Register when transformers is already (fully) imported, and never import it: for `import zoo`.

    Returns:
        Whether the functions were registered.
    """
    module = sys.modules.get("transformers")
    spec = getattr(module, "__spec__", None)
    if module is None or getattr(spec, "_initializing", False):  # absent, or half-way through its own import
        return False
    register_attention_functions()
    return True
