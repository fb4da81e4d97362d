"""Gated attention (Bondarenko, Nagel and Blankevoort 2023, "Quantizable Transformers"), the paper's
second control for outliers:

    head_h(x) = sigmoid(G_h(x)) * softmax(q_h k_h^T / sqrt(d)) v_h

A per-token, per-head gate lets a head switch its update off without the softmax having to
put all its weight on an uninformative token. G_h here is a linear map of the head's own
slice of the layer's input (d_head -> 1), its bias started at `gate_bias` (0: every gate at
0.5), one of the gating functions the paper describes. The gated heads then go through the
output projection as usual. The attention itself is softmax's, through attend.py's fused path.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.attention.softmax import SoftmaxAttention


class GatedAttention(SoftmaxAttention):
    def __init__(self, dim: int, heads: int = 1, causal: bool = False, gate_bias: float = 0.0, **kwargs):
        super().__init__(dim, heads=heads, causal=causal, **kwargs)
        # one (d_head -> 1) map per head, as a grouped weight (heads, d_head) and bias (heads,)
        self.gate_weight = nn.Parameter(torch.zeros(heads, self.head_dim))
        nn.init.normal_(self.gate_weight, std=self.head_dim**-0.5)
        self.gate_bias = nn.Parameter(torch.full((heads,), float(gate_bias)))

    def gates(self, x: torch.Tensor) -> torch.Tensor:
        """sigmoid(G_h(x)) for every token and head, (batch, heads, length, 1)."""
        b, n, _ = x.shape
        per_head = x.view(b, n, self.heads, self.head_dim)
        logits = (per_head * self.gate_weight.to(x.dtype)).sum(-1) + self.gate_bias.to(x.dtype)
        return torch.sigmoid(logits).transpose(1, 2)[..., None]
