"""Gated attention (Bondarenko, Nagel and Blankevoort 2023, "Quantizable Transformers"), the paper's
second control for outliers:

    head_h(x) = sigmoid(G_h(x)) * softmax(q_h k_h^T / sqrt(d)) v_h

A per-token, per-head gate lets a head switch its update off without the softmax having to
put all its weight on an uninformative token. G_h here is a linear map of the head's own
slice of the layer's input (d_head -> 1), its bias started at `gate_bias` (0: every gate at
0.5), one of the gating functions the paper describes. The gated heads then go through the
output projection as usual. The attention itself is softmax's, through dot_product.py's fused path.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from zoo.attention.softmax import SoftmaxAttention
from zoo.utils.checks import number


class GatedAttention(SoftmaxAttention):
    """Multi-head softmax attention with a per-token, per-head output gate (Bondarenko et al. 2023).

    For each head h, with q, k, v the head's slices of W_qkv x, d = dim / heads and x_h the head's own
    slice of the layer's input (d channels):

        head_h = sigmoid(w_h . x_h + b_h) * softmax(q k^T / sqrt(d) + B_h) v,   y = W_o concat_h(head_h)

    so a head can switch its update off for a token without putting all its softmax weight on an
    uninformative token. Same inputs, outputs and KVCache decoding as SoftmaxAttention; the attention
    itself runs through the fused SDPA kernels.

    Args:
        dim: the token width, an int >= 1 divisible by `heads`.
        heads: the number of heads, an int >= 1 (default 1); each head is dim / heads wide.
        causal: True: token i attends to tokens 0..i only, and `step` decodes; default False (bidirectional).
        gate_bias: the gates' starting bias b_h, a finite number (default 0: a gate of 0.5 for a zero input;
            the weights w_h start random, with standard deviation d^-0.5).
        **kwargs (Any): SoftmaxAttention's other options: `bias`, `dropout`, `max_len`, `learned_bias`,
            `positions` ("rope", "alibi"), `rope_base`, `alibi_bias_max`.
    """

    def __init__(self, dim: int, heads: int = 1, causal: bool = False, gate_bias: float = 0.0, **kwargs):
        gate_bias = number(gate_bias, "gate_bias", type(self).__name__, -math.inf)
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
