"""Clipped softmax attention (Bondarenko, Nagel and Blankevoort 2023, "Quantizable Transformers:
removing outliers by helping attention heads do nothing"), the paper's first control for outliers:

    clipped_softmax(x; zeta, gamma) = clip((zeta - gamma) * softmax(x) + gamma, 0, 1),   zeta >= 1, gamma <= 0

With gamma < 0 a weight reaches exactly 0 at a finite logit, so a head can attend to nothing
without pushing its logits towards infinity, which is what grows outliers; with zeta > 1 a
weight can reach exactly 1. The paper sets gamma = -alpha / T for T keys; here T is the
number of keys each row sees, alpha a constructor argument (4 by default: our choice, the
paper tunes it per model), and zeta = 1. Gradients are zero where the clip is active, as the
formula says. No fused kernel computes it: the weights are built and applied (attend.py).

Caution: a uniform row (1/T each) becomes (1 - alpha + alpha/T) / T, below zero once alpha
exceeds T / (T - 1), a little above 1, and is then clipped to zero entirely, with no gradient.
A freshly initialized model attends almost uniformly, so it starts with almost every row empty
(clipped-vit-tiny at init: 99-100% of rows in every block; bench/clipped_rows.py) and attention
learns only through the few weights above alpha / (T + alpha). On MNIST two of three seeds
escaped (99.25% and 99.20%), the third did not: three of its four blocks still attended to
nothing after 15 epochs, and it reached 59.24%. alpha < 1 keeps uniform rows alive.
"""

from __future__ import annotations

import torch

from zoo.attention.softmax import SoftmaxAttention


def clipped_softmax(x: torch.Tensor, dim: int = -1, zeta: float = 1.0, gamma: float = 0.0) -> torch.Tensor:
    """clip((zeta - gamma) softmax(x) + gamma, 0, 1) along `dim`; gamma may be a tensor that broadcasts."""
    if not x.is_floating_point():
        raise ValueError(f"clipped_softmax expects a floating-point tensor, got dtype {x.dtype}")
    return ((zeta - gamma) * torch.softmax(x, dim) + gamma).clamp(0.0, 1.0)


class ClippedSoftmaxAttention(SoftmaxAttention):
    """Multi-head attention whose weights are a clipped softmax, gamma = -alpha / (keys seen), zeta."""

    def __init__(self, dim: int, heads: int = 1, causal: bool = False, alpha: float = 4.0, zeta: float = 1.0,
                 **kwargs):
        super().__init__(dim, heads=heads, causal=causal, **kwargs)
        if not alpha >= 0 or not zeta >= 1:
            raise ValueError(f"{type(self).__name__} needs alpha >= 0 and zeta >= 1, got alpha={alpha}, zeta={zeta}")
        self.alpha, self.zeta = float(alpha), float(zeta)

    def clip(self, keys: int, queries: int, device) -> tuple[float, float | torch.Tensor]:
        """(zeta, gamma) for queries aligned to the end of `keys` keys: gamma = -alpha / keys seen by each row
        (all of them, or those up to the query when causal), shaped to broadcast over (..., queries, keys)."""
        if not self.causal:
            return self.zeta, -self.alpha / keys  # (a number: no size of the graph is turned into a constant)
        seen = torch.arange(queries, device=device, dtype=torch.float32) + (keys - queries + 1)
        return self.zeta, (-self.alpha / seen)[:, None]
