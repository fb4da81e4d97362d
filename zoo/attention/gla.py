"""Gated linear attention (GLA; Yang, Wang, Shen, Panda and Kim 2024, "Gated Linear Attention Transformers with
Hardware-Efficient Training"), and RetNet's retention (Sun et al. 2023) as its special case of a fixed decay.

Linear attention with a forget gate: per head a matrix memory S (key width x value width),

    S_t = diag(a_t) S_{t-1} + k_t v_t^T,   o_t = S_t^T q_t,   y_t = W_o (RMSNorm(o_t) * swish(W_g x_t))

with a_t in (0, 1)^{d_k} from the token itself, a_t = sigmoid(W_a2 W_a1 x_t + b)^(1/16) (a rank-16 map; the
1/16 keeps the gates near 1, GLA's "normalizer"). decay="fixed" is RetNet's retention: one decay per head,
a_h = 1 - 2^(-5 - h), for every token. Keys are half the token width (GLA's expand_k = 0.5), values the whole
width, q scaled by d_k^-1/2; no feature map. Trained in chunks (linear_recurrence.py), decoded with one
d_k x d_v memory per head: O(1) state.

One choice of ours: a per-channel log decay is clamped at -5 per token (a gate that keeps under 0.7% of the
memory in one step keeps 0.7%), which bounds the chunked form's factors within float32; GLA's gates reach it
only for gate logits below -80.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention.linear_recurrence import MIN_LOG_DECAY, RecurrentState, chunked_decayed_sum
from zoo.attention.recurrent import RecurrentAttention, gated_rms_norm, heads_first, no_write
from zoo.utils.checks import integer, number, shown

DECAYS = ("data", "fixed")


class GatedLinearAttention(RecurrentAttention):
    """Gated linear attention (Yang et al. 2024): linear attention whose matrix memory forgets through a
    data-dependent gate per key channel; decay="fixed" gives RetNet's retention.

    Takes x (batch, length, dim) and an optional `key_padding_mask` (batch, length), True for real tokens;
    returns (batch, length, dim), zero at padded positions. Decodes with `y, state = layer.step(x_new, state)`
    from a RecurrentState of one (dim * expand_k / heads) x (dim / heads) memory per head.

    Args:
        dim: the token width, an int >= 1 divisible by `heads`.
        heads: the number of heads, an int >= 1 (default 1).
        causal: must be True (the default): the memory runs over the tokens before each one.
        expand_k: the keys' width as a fraction of dim, a number in (0, 4] giving a multiple of heads
            (default 0.5, GLA's).
        decay: "data" (default: GLA's gate from each token) or "fixed" (RetNet: a_h = 1 - 2^(-5 - h) per head).
        gate_rank: the rank of the gate's map, an int >= 1 (default 16).
        gate_normalizer: the gate's exponent 1 / gate_normalizer, a number >= 1 (default 16).
    """

    def __init__(self, dim: int, heads: int = 1, causal: bool = True, expand_k: float = 0.5, decay: str = "data",
                 gate_rank: int = 16, gate_normalizer: float = 16.0):
        super().__init__(dim, heads, causal)
        owner = type(self).__name__
        expand_k = number(expand_k, "expand_k", owner, 0.0, 4.0, include_minimum=False)
        key_dim = int(round(dim * expand_k))
        if key_dim < heads or key_dim % heads:
            raise ValueError(f"{owner} needs dim * expand_k = {dim} * {expand_k} = {key_dim} keys to be a positive "
                             f"multiple of heads={heads}")
        if not isinstance(decay, str) or decay not in DECAYS:
            raise ValueError(f"{owner} decay must be one of {list(DECAYS)}, got {shown(decay)}")
        self.key_dim, self.decay = key_dim, decay
        self.gate_normalizer = number(gate_normalizer, "gate_normalizer", owner, 1.0)
        self.memory_shape = (key_dim // heads, self.head_dim)
        self.q = nn.Linear(dim, key_dim, bias=False)
        self.k = nn.Linear(dim, key_dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.g = nn.Linear(dim, dim, bias=False)
        if decay == "data":
            rank = integer(gate_rank, "gate_rank", owner)
            self.gate = nn.Sequential(nn.Linear(dim, rank, bias=False), nn.Linear(rank, key_dim))
            fixed = None
        else:
            self.gate = None
            fixed = torch.tensor([math.log1p(-2.0 ** (-5 - h)) for h in range(heads)])
        self.register_buffer("fixed_log_decay", fixed, persistent=False)  # follows from heads
        self.norm = nn.RMSNorm(self.head_dim, eps=1e-5)
        self.proj = nn.Linear(dim, dim, bias=False)

    def _run(self, x: torch.Tensor, state: RecurrentState | None, real: torch.Tensor | None):
        b, n, _ = x.shape
        q = heads_first(self.q(x), self.heads) * self.memory_shape[0] ** -0.5
        k = no_write(heads_first(self.k(x), self.heads), real)
        v = heads_first(self.v(x), self.heads)
        if self.gate is None:
            log_decay = self.fixed_log_decay.to(q.device)[None, :, None].expand(b, self.heads, n)
        else:
            logits = self.gate(x).float()
            log_decay = (F.logsigmoid(logits) / self.gate_normalizer).clamp(min=MIN_LOG_DECAY)
            log_decay = heads_first(log_decay, self.heads)
        o, memory = chunked_decayed_sum(q, k, v, no_write(log_decay, real),
                                        None if state is None else state.memory)
        return self.proj(gated_rms_norm(self.norm, o, self.g(x), self.heads).to(x.dtype)), RecurrentState(memory)
