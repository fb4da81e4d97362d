"""Clipped softmax attention (Bondarenko, Nagel and Blankevoort 2023, "Quantizable Transformers:
removing outliers by helping attention heads do nothing"), the paper's first control for outliers:

    clipped_softmax(x; zeta, gamma) = clip((zeta - gamma) * softmax(x) + gamma, 0, 1),   zeta >= 1, gamma <= 0

With gamma < 0 a weight reaches exactly 0 at a finite logit, so a head can attend to nothing
without pushing its logits towards infinity, which is what grows outliers; with zeta > 1 a
weight can reach exactly 1. The paper sets gamma = -alpha / T for T keys; here T is the
number of keys each row sees, alpha a constructor argument (4 by default: our choice, the
paper tunes it per model), and zeta = 1. Gradients are zero where the clip is active, as the
formula says. No fused kernel computes it: the weights are built and applied (dot_product.py).

Caution: a uniform row (1/T each) becomes (1 - alpha + alpha/T) / T, below zero once alpha
exceeds T / (T - 1), a little above 1, and is then clipped to zero entirely, with no gradient.
A freshly initialized model attends almost uniformly, so it starts with almost every row empty
(bench/clipped_rows.py counts them) and attention learns only through the few weights above
alpha / (T + alpha), so whether training escapes depends on the seed (the outlier study's pages
give the runs). alpha < 1 keeps uniform rows alive.
"""

from __future__ import annotations

import torch

from zoo.attention.normalizers import clipped_softmax as clipped_softmax  # re-exported: it lives below the mechanisms
from zoo.attention.softmax import SoftmaxAttention
from zoo.utils.checks import number


class ClippedSoftmaxAttention(SoftmaxAttention):
    """Multi-head attention whose weights are a clipped softmax, gamma = -alpha / (keys seen), zeta.

    For each head h, with q, k, v the head's slices of W_qkv x, d = dim / heads and T the number of keys
    the row sees (all of them, or keys 0..i for query i when causal):

        head_h = clip((zeta - gamma) * softmax(q k^T / sqrt(d) + B_h) + gamma, 0, 1) v,   gamma = -alpha / T

    The weights are built explicitly (no fused kernel computes them). Same inputs, outputs and KVCache
    decoding as SoftmaxAttention. Caution: a uniform row is clipped to all zeros (no gradient) once alpha
    exceeds T / (T - 1), which a freshly initialized model is close to; alpha < 1 keeps such rows alive
    (see the module's docstring).

    Args:
        dim: the token width, an int >= 1 divisible by `heads`.
        heads: the number of heads, an int >= 1 (default 1); each head is dim / heads wide.
        causal: True: token i attends to tokens 0..i only, and `step` decodes; default False (bidirectional).
        alpha: gamma's numerator, a number >= 0 (default 4, our choice; 0 gives a plain softmax when zeta = 1).
        zeta: the stretch's upper end, a number >= 1 (default 1).
        **kwargs (Any): SoftmaxAttention's other options: `bias`, `dropout`, `max_len`, `learned_bias`,
            `positions` ("rope", "alibi"), `rope_base`, `alibi_bias_max`.
    """

    def __init__(self, dim: int, heads: int = 1, causal: bool = False, alpha: float = 4.0, zeta: float = 1.0,
                 **kwargs):
        alpha, zeta = number(alpha, "alpha", type(self).__name__), number(zeta, "zeta", type(self).__name__, 1.0)
        super().__init__(dim, heads=heads, causal=causal, **kwargs)
        self.alpha, self.zeta = alpha, zeta

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, *,
                attn_mask: torch.Tensor | None = None, is_causal: bool = False, **kwargs) -> torch.Tensor:
        """SoftmaxAttention's forward, without attn_mask and is_causal: gamma = -alpha / (keys seen) counts the
        keys that the layer's own causality and the padding leave, which a mask from outside would change."""
        if attn_mask is not None or (is_causal is not False and not self.causal):
            raise ValueError(f"{type(self).__name__} takes no attn_mask and no is_causal=True (its gamma counts the "
                             "keys each row sees): build it with causal=True, pass padding as key_padding_mask")
        return super().forward(x, key_padding_mask, **kwargs)

    def clip(self, keys: int, queries: int, device, key_padding_mask: torch.Tensor | None = None
             ) -> tuple[float, float | torch.Tensor]:
        """(zeta, gamma) for queries aligned to the end of `keys` keys: gamma = -alpha / keys seen by each row
        (all of them, or those up to the query when causal), shaped to broadcast over (..., queries, keys)."""
        if key_padding_mask is not None:  # only real keys count: a padded sequence gets the gamma it gets alone
            seen = key_padding_mask.cumsum(-1, dtype=torch.float32)[:, keys - queries:] if self.causal else \
                key_padding_mask.sum(-1, keepdim=True, dtype=torch.float32)
            return self.zeta, (-self.alpha / seen.clamp(min=1))[:, None, :, None]
        if not self.causal:
            return self.zeta, -self.alpha / keys  # (a number: no size of the graph is turned into a constant)
        seen = torch.arange(queries, device=device, dtype=torch.float32) + (keys - queries + 1)
        return self.zeta, (-self.alpha / seen)[:, None]
