"""The attention a model applied to an input, captured only inside `with capture(model) as maps:`.

Outside the context nothing is different: no hook is registered and the fused SDPA path runs
as always. Inside, a forward hook on every attention layer recomputes from the layer's own
input the weights it applied (the fused kernels never materialize them) and appends one
`AttentionMap` per call, in the order the layers ran. The model's outputs are untouched: the
hooks only read.

What each mechanism gives, per layer (B: batch, H: heads, L: tokens):
- softmax, quiet, clipped, gated: `weights` (B, H, L, L), softmax, softmax_one or the clipped
  softmax of the logits with the layer's mask and learned bias; for quiet and clipped, `nothing`
  (B, H, L) = 1 - each row's sum; for gated, `gate` (B, H, L), each head's gate per token.
- micro: `scores` s_t (B, H, L), and `weights` (B, H, L, L), each token's weight in the mean a
  query subtracts: s_j / sum_k s_k over the keys it sees (all, or those up to it when causal).
- elita: `weights` (B, H, L, L), the convex mix the output is: g_i on the token itself plus
  (1 - g_i) e^{l_j - A_i} on the tokens j <= i of the running mean.
- fused: `alpha` (B, H, L), the weight of each token in the pooled vector.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn

from zoo.attention import ElitaAttention, FusedAttention, InContextAttention, MicroAttention, SoftmaxAttention
from zoo.attention.dot_product import allowed_keys, attention_weights
from zoo.attention.elita import _PAD_LOGIT
from zoo.utils.checks import zero_padding


@dataclass
class AttentionMap:
    layer: str  # the module's name in the model, e.g. "blocks.2.attn"
    kind: str  # softmax, quiet, clipped, gated, micro, elita, incontext or fused
    weights: torch.Tensor | None = None  # (B, H, L, L)
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # nothing, scores, alpha, or bias and positions


@torch.no_grad()
def _softmax(module: SoftmaxAttention, x, mask) -> AttentionMap:
    x = zero_padding(x, mask)
    q, k, _ = module._split_heads(x)
    n = x.shape[1]
    clip = module.clip(n, n, x.device)
    weights = attention_weights(q, k, causal=module.causal, key_padding_mask=mask, bias=module._bias(0, n),
                                quiet=module.quiet, clip=clip)
    extra, gates = {}, module.gates(x)
    if module.quiet or clip is not None:  # rows that may sum to less than 1
        extra["nothing"] = 1 - weights.sum(-1)
    if gates is not None:
        extra["gate"] = gates[..., 0]  # (B, H, L): how much of each head's output passes
    kind = "quiet" if module.quiet else "clipped" if "nothing" in extra else "gated" if gates is not None else "softmax"
    return AttentionMap("", kind, weights, extra)


@torch.no_grad()
def _incontext(module: InContextAttention, x, mask) -> AttentionMap:
    """Its weights, and in `extra` the bias the activations made (B, H, L, L) and the contextual positions."""
    x = zero_padding(x, mask)
    q, k, _ = module._split_heads(x)
    positions = module._positions(module._gates(x, mask))  # once, for the bias and for the picture
    bias = module._interpolate(module._tables(x), positions)
    weights = attention_weights(q, k, causal=module.causal, key_padding_mask=mask, bias=bias)
    return AttentionMap("", "incontext", weights, {"bias": bias, "positions": positions})


@torch.no_grad()
def _micro(module: MicroAttention, x, mask) -> AttentionMap:
    scores, _ = module._scores_and_tokens(zero_padding(x, mask), mask)  # (B, L, H), zero at padding
    s = scores.transpose(1, 2)  # (B, H, L)
    n = s.shape[-1]
    per_key = s[:, :, None, :] * allowed_keys(n, n, s.device, module.causal)  # (B, H, queries, keys)
    total = per_key.sum(-1, keepdim=True)
    weights = per_key / torch.where(total > 0, total, 1.0)  # a query that has seen only zeros averages nothing
    return AttentionMap("", "micro", weights, {"scores": s})


@torch.no_grad()
def _elita(module: ElitaAttention, x, mask) -> AttentionMap:
    history, own, offset, _ = module._terms(zero_padding(x, mask), 0)
    if mask is not None:
        history = history.masked_fill(~mask[..., None], _PAD_LOGIT)
    log_norm = history.logcumsumexp(1)  # A_i
    gate = torch.sigmoid(own - offset - log_norm).transpose(1, 2)  # g_i (B, H, L)
    l, a = history.transpose(1, 2), log_norm.transpose(1, 2)
    n = l.shape[-1]
    seen = allowed_keys(n, n, l.device, causal=True)
    mean = (l[..., None, :] - a[..., :, None]).masked_fill(~seen, float("-inf")).exp()  # e^{l_j - A_i}
    weights = (1 - gate)[..., None] * mean + torch.diag_embed(gate)
    return AttentionMap("", "elita", weights, {"gate": gate})


@torch.no_grad()
def _fused(module: FusedAttention, x, mask) -> AttentionMap:
    return AttentionMap("", "fused", None, {"alpha": module.alpha(x, mask)})


READERS = ((FusedAttention, _fused), (MicroAttention, _micro), (ElitaAttention, _elita),
           (InContextAttention, _incontext), (SoftmaxAttention, _softmax))


@contextlib.contextmanager
def capture(model: nn.Module):
    """Record every attention layer's weights while the model runs inside the context (see above)."""
    maps: list[AttentionMap] = []
    handles = []
    for name, module in model.named_modules():
        reader = next((r for cls, r in READERS if isinstance(module, cls)), None)
        if reader is None:
            continue

        def hook(module, args, kwargs, output, name=name, reader=reader):
            x = args[0]
            mask = kwargs.get("key_padding_mask", args[1] if len(args) > 1 else None)
            found = reader(module, x, mask)
            found.layer = name
            maps.append(found)

        handles.append(module.register_forward_hook(hook, with_kwargs=True))
    try:
        yield maps
    finally:
        for handle in handles:
            handle.remove()
