"""Mamba-2's state-space layer, SSD (Dao and Gu 2024, "Transformers are SSMs: Generalized Models and Efficient
Algorithms Through Structured State Space Duality").

A selective state space with one scalar decay per head and token: for head h with inputs x_t (its P channels),

    S_t = exp(-dt_t A_h) S_{t-1} + dt_t B_t x_t^T,   y_t = S_t^T C_t + D_h x_t

dt_t = softplus(w_h . u_t + dt_bias_h) the step size, B_t, C_t (N each) shared by the heads, S an N x P state
per head. In the layer as Mamba-2 builds it: one input projection to (z, x, B, C, dt), a short causal
convolution and SiLU over (x, B, C), the SSD above, then RMSNorm(y * swish(z)) and the output projection.
The inner width is expand * dim (Mamba-2's expand = 2), split over `heads` heads. In the terms of
linear_recurrence.py it is a decayed sum with q = C, k = dt B, v = x and a per-head decay, trained in chunks
and decoded with an N x P state per head plus the convolution's last inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention.deltanet import decay_parameters
from zoo.attention.dot_product import autocast_off
from zoo.attention.linear_recurrence import RecurrentState, chunked_decayed_sum
from zoo.attention.recurrent import RecurrentAttention, heads_first, no_write
from zoo.utils.checks import integer


class SSDAttention(RecurrentAttention):
    """Mamba-2's SSD layer (Dao and Gu 2024): a state space with a scalar, data-dependent decay per head.

    Takes x (batch, length, dim) and an optional `key_padding_mask` (batch, length), True for real tokens;
    returns (batch, length, dim), zero at padded positions. Decodes with `y, state = layer.step(x_new, state)`
    from a RecurrentState: one state_dim x (expand * dim / heads) state per head and the convolution's last
    conv_width - 1 inputs.

    Args:
        dim: the token width, an int >= 1 divisible by `heads`.
        heads: the number of heads, an int >= 1 (default 1).
        causal: must be True (the default).
        state_dim: N, the state size per head, an int >= 1 (default 64).
        expand: the inner width as a multiple of dim, an int >= 1 (default 2, Mamba-2's).
        conv_width: the short convolution over (x, B, C), an int in [2, 64], or 0 for none (default 4).
    """

    def __init__(self, dim: int, heads: int = 1, causal: bool = True, state_dim: int = 64, expand: int = 2,
                 conv_width: int = 4):
        super().__init__(dim, heads, causal)
        owner = type(self).__name__
        self.state_dim = integer(state_dim, "state_dim", owner)
        self.expand = integer(expand, "expand", owner, 1, 16)
        self.inner = self.expand * dim
        self.memory_shape = (self.state_dim, self.inner // heads)
        self.in_proj = nn.Linear(dim, 2 * self.inner + 2 * self.state_dim + heads, bias=False)
        self.conv = self._short_conv(conv_width, self.inner + 2 * self.state_dim)
        self.A_log, self.dt_bias = decay_parameters(heads)
        self.D = nn.Parameter(torch.ones(heads))
        self.norm = nn.RMSNorm(self.inner, eps=1e-5)
        self.proj = nn.Linear(self.inner, dim, bias=False)

    def _run(self, x: torch.Tensor, state: RecurrentState | None, real: torch.Tensor | None):
        b, n, _ = x.shape
        z, xbc, dt = self.in_proj(x).split([self.inner, self.inner + 2 * self.state_dim, self.heads], -1)
        xbc, tail = self._convolve(xbc, state, real)
        if self.conv is None:
            xbc = F.silu(xbc)
        u, B, C = xbc.split([self.inner, self.state_dim, self.state_dim], -1)
        step = no_write(F.softplus(dt.float() + self.dt_bias).transpose(1, 2), real)  # dt_t (b, heads, n); 0: none
        u = heads_first(u, self.heads)  # (b, heads, n, P)
        k = B.float()[:, None] * step[..., None]  # dt_t B_t per head
        q = C.float()[:, None].expand(b, self.heads, n, self.state_dim)
        y, memory = chunked_decayed_sum(q, k, u, -torch.exp(self.A_log)[:, None] * step,
                                        None if state is None else state.memory)
        y = y + self.D[:, None, None] * u.float()
        y = y.transpose(1, 2).reshape(b, n, self.inner)
        # Mamba-2 gates before its norm (norm_before_gate=False): RMSNorm(y * swish(z))
        with autocast_off(x.device):
            y = F.rms_norm(y * F.silu(z.float()), self.norm.normalized_shape, self.norm.weight.float(), self.norm.eps)
        return self.proj(y.to(x.dtype)), RecurrentState(memory, tail)
