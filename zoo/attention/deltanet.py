"""DeltaNet with the gated delta rule (Schlag, Irie and Schmidhuber 2021, "Linear Transformers Are Secretly Fast
Weight Programmers"; Yang, Wang, Zhang, Shen and Kim 2024, "Parallelizing Linear Transformers with the Delta
Rule over Sequence Length"; Yang, Kautz and Hatamizadeh 2025, "Gated Delta Networks").

Linear attention writes k v^T on top of whatever the memory already holds under k; the delta rule first
takes out what the memory would read for k, then writes v, with a strength b_t:

    S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,   o_t = S_t^T q_t

so a key written twice holds the newer value, the way a recall task needs. a_t in (0, 1] is the gate of Gated
DeltaNet (Mamba-2's form: a_t = exp(-exp(A_log) softplus(W_a x_t + dt_bias)), per head); gated=False is the
plain delta rule (a_t = 1). As the layer is usually built: q, k, v through a short causal convolution and
SiLU, q and k of unit length (so each update is a contraction), b_t = sigmoid(W_b x_t), and the output
RMSNorm(o_t) * swish(W_g x_t) before W_o. Trained in chunks (linear_recurrence.py's WY form), decoded with one
d x d memory per head and the convolution's last inputs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention.linear_recurrence import RecurrentState, chunked_delta_rule
from zoo.attention.recurrent import RecurrentAttention, gated_rms_norm, heads_first, no_write
from zoo.utils.checks import flag


def decay_parameters(heads: int) -> tuple[nn.Parameter, nn.Parameter]:
    """Mamba-2's decay rates, A_log = log A with A ~ U(1, 16), and dt_bias, the inverse softplus of a step dt
    log-uniform in [0.001, 0.1]: a_t = exp(-A softplus(logit_t + dt_bias))."""
    a_log = nn.Parameter(torch.log(torch.empty(heads).uniform_(1, 16)))
    dt = torch.exp(torch.empty(heads).uniform_(math.log(1e-3), math.log(1e-1)))
    dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
    return a_log, dt_bias


class DeltaNetAttention(RecurrentAttention):
    """DeltaNet with the gated delta rule (Yang et al. 2025): a matrix memory that overwrites what a key held.

    Takes x (batch, length, dim) and an optional `key_padding_mask` (batch, length), True for real tokens;
    returns (batch, length, dim), zero at padded positions. Decodes with `y, state = layer.step(x_new, state)`
    from a RecurrentState: one (dim / heads) x (dim / heads) memory per head and the convolution's last
    conv_width - 1 inputs.

    Args:
        dim: the token width, an int >= 1 divisible by `heads`.
        heads: the number of heads, an int >= 1 (default 1).
        causal: must be True (the default).
        conv_width: the short convolution over q, k, v, an int in [2, 64], or 0 for none (default 4).
        gated: True (default): Gated DeltaNet's decay a_t; False: the plain delta rule.
    """

    def __init__(self, dim: int, heads: int = 1, causal: bool = True, conv_width: int = 4, gated: bool = True):
        super().__init__(dim, heads, causal)
        self.gated = flag(gated, "gated", type(self).__name__)
        self.memory_shape = (self.head_dim, self.head_dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.conv = self._short_conv(conv_width, 3 * dim)
        self.beta = nn.Linear(dim, heads)
        if self.gated:
            self.decay = nn.Linear(dim, heads, bias=False)
            self.A_log, self.dt_bias = decay_parameters(heads)
        self.g = nn.Linear(dim, dim, bias=False)
        self.norm = nn.RMSNorm(self.head_dim, eps=1e-5)
        self.proj = nn.Linear(dim, dim, bias=False)

    def _run(self, x: torch.Tensor, state: RecurrentState | None, real: torch.Tensor | None):
        b, n, _ = x.shape
        h, tail = self._convolve(self.qkv(x), state, real)
        if self.conv is None:
            h = F.silu(h)
        q, k, v = (heads_first(t, self.heads) for t in h.chunk(3, -1))
        q = F.normalize(q.float(), dim=-1) * self.head_dim ** -0.5
        k = F.normalize(k.float(), dim=-1)
        beta = no_write(heads_first(torch.sigmoid(self.beta(x).float()), self.heads)[..., 0], real)
        log_decay = None
        if self.gated:
            rate = F.softplus(self.decay(x).float() + self.dt_bias)  # (b, n, heads)
            log_decay = no_write((-torch.exp(self.A_log) * rate).transpose(1, 2), real)
        o, memory = chunked_delta_rule(q, k, v, beta, log_decay, None if state is None else state.memory)
        out = gated_rms_norm(self.norm, o, self.g(x), self.heads).to(x.dtype)
        return self.proj(out), RecurrentState(memory, tail)
