"""ELiTA's Attention2, causal attention in linear time, and FeedForward2, from the ELiTA write-up.

Attention2 for token i of a sequence, with scalar keys k1, k2, k3 and a position term
p_{r,i} = sin(i a_r / n + b_r), r = 1, 2:

    X_j = exp(k1 . x_j + p_{1,j} . c)
    y_i = (e^{k2 . x_i} V x_i + e^{p_{2,i} . c + k3 . x_i} sum_{j<=i} X_j V x_j)
          / (e^{k2 . x_i} + e^{p_{2,i} . c + k3 . x_i} sum_{j<=i} X_j)

Implemented from the equations (the authors' TensorFlow code is under a
non-commercial licence). Three decisions the write-up leaves open or gets wrong:

- n is the model's fixed `max_len`, never the current input length. With the input
  length a token's output would change as the sequence grows, so a prefix would not
  decode to what the full sequence computes. Positions count from 0, and sequences
  longer than max_len are allowed (the sine simply goes on).
- The sums are computed in log space. With l_j = k1 . x_j + p_{1,j} . c,
  A_i = log sum_{j<=i} e^{l_j} (a log-cumsum-exp) and the running mean
  M_i = sum_{j<=i} e^{l_j - A_i} V x_j, the output is the convex mix
      y_i = g_i V x_i + (1 - g_i) M_i,   g_i = sigmoid(k2 . x_i - p_{2,i} . c - k3 . x_i - A_i),
  in which no exponent is ever positive: 100k-token sequences and large activations
  stay finite with no clipping.
- M is a recurrence, M_i = a_i M_{i-1} + b_i V x_i with a_i = e^{A_{i-1} - A_i} and
  b_i = e^{l_i - A_i} (a_i + b_i = 1). On the CPU a compiled kernel runs it token by
  token in float32 (csrc/elita_scan.cpp, see native.py: one pass forward, two backward).
  The eager route, the reference elsewhere, computes it in chunks (flash-linear-attention
  style): inside a chunk a small lower-triangular matrix of weights e^{l_j - A_i},
  across chunks the same form one level up with weights e^{A_end(k') - A_end(k)}; both
  are matmuls, all exponents <= 0.

Each head has its own k1, k2, k3, a, b, c and its slice of V's output; heads=1 is the
equation as written.

positions="alibi" (ours, not the write-up's) makes the history fade with distance, as ALiBi does
for softmax attention (Press et al. 2022): row i weighs X_j by e^{-m_h (i - j)}, m_h ALiBi's slope of
head h. It is the equation with l_j + m_h j as the history logits and w_i - m_h i as the row offsets,
so the sums, the scan and the state are unchanged. Without it nothing in Attention2 depends on how far
back a token is (the sines read absolute positions). Trained on War and Peace at a context of 2,048
characters, the original reached a held-out loss of 2.35 nats per character and pos_dim=0 2.38, between
a 2-gram (2.44) and a 3-gram model (1.95), and neither did better late in the window than early; with
positions="alibi" (and pos_dim=0) the same budget reached 1.23, and the loss held at 4x the context
(README, "What each attention can do").

FeedForward2 is y = W3 (swish(W1 x + b1) outer swish(W2 x + b2)) + b3 with W3 a d x d x rank kernel
(rank 8 in the write-up).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import zoo.attention.blocks as blocks
import zoo.attention.native as native
from zoo.attention.dot_product import autocast_off, refuse_attn_mask
from zoo.attention.positions import alibi_slopes, check_alibi_bias_max
from zoo.utils.checks import (
    check_heads,
    check_padding_mask,
    check_state,
    check_tokens,
    flag,
    integer,
    shown,
    zero_padding,
)

# Padded tokens get this logit: exp of it vanishes against any real logit, yet unlike
# -inf it never produces -inf - -inf = NaN where no real token has been seen yet.
_PAD_LOGIT = -1e30


@dataclass
class ElitaState:
    """log sum_j X_j (batch, heads), the running mean M (batch, heads, head_dim) and the next position
    (an int; a 0-d tensor in an exported decoding step).

    The state between calls of `ElitaAttention.step`: pass None to start, then the state each call returns.
    The tensors are in float32 (float64 for float64 inputs) whatever the tokens' dtype.

    Args:
        log_norm: A = log sum_{j<i} X_j over the tokens seen so far, (batch, heads).
        mean: the running mean M = sum_{j<i} X_j V x_j / sum_{j<i} X_j, (batch, heads, head_dim).
        position: the position of the next token (the number of tokens seen), an int >= 0, or a 0-d
            integer tensor in an exported decoding step.
    """

    log_norm: torch.Tensor
    mean: torch.Tensor
    position: int | torch.Tensor


def running_mean(logits: torch.Tensor, log_norm: torch.Tensor, values: torch.Tensor, chunk: int) -> torch.Tensor:
    """M_i = sum_{j<=i} exp(logits_j - log_norm_i) values_j along dim 1.

    logits, log_norm: (B, L, H); values: (B, L, H, D). log_norm must be a running
    log-sum-exp of logits (plus any earlier mass), so every exponent is <= 0.
    """
    b, n, h, d = values.shape
    if torch.compiler.is_exporting():
        # An exported graph (torch.export, ONNX, AOTInductor) serves every length, which the chunking
        # below cannot do without branching on it: the whole sequence is one chunk there, the same
        # weights e^{l_j - A_i} <= 1 in an (L, L) matrix. Quadratic in a prompt's length; a decoding
        # step's matrix is (1, 1). torch.compile keeps the chunks (it may specialize and recompile).
        own, total = logits.transpose(1, 2), log_norm.transpose(1, 2)  # (B, H, L)
        future = torch.ones(n, n, dtype=torch.bool, device=values.device).triu(1)
        weights = (own[..., None, :] - total[..., :, None]).masked_fill(future, float("-inf")).exp()
        return (weights @ values.transpose(1, 2)).transpose(1, 2)
    chunk = min(chunk, n)  # a decode step of one token needs no 64-token chunk of padding
    pad = -n % chunk
    if pad:
        logits = F.pad(logits, (0, 0, 0, pad), value=_PAD_LOGIT)
        log_norm = torch.cat([log_norm, log_norm[:, -1:].expand(b, pad, h)], dim=1)
        values = F.pad(values, (0, 0, 0, 0, 0, pad))
    k = (n + pad) // chunk
    # (B, H, chunks, C) and (B, H, chunks, C, D)
    logits = logits.view(b, k, chunk, h).permute(0, 3, 1, 2)
    log_norm = log_norm.view(b, k, chunk, h).permute(0, 3, 1, 2)
    values = values.view(b, k, chunk, h, d).permute(0, 3, 1, 2, 4)

    future = torch.ones(chunk, chunk, dtype=torch.bool, device=values.device).triu(1)
    within = (logits[..., None, :] - log_norm[..., :, None]).masked_fill(future, float("-inf")).exp()
    partial = within @ values  # each position's mean over its own chunk so far

    ends = log_norm[..., -1]  # (B, H, chunks)
    later = torch.ones(k, k, dtype=torch.bool, device=values.device).triu(1)
    across = (ends[..., None, :] - ends[..., :, None]).masked_fill(later, float("-inf")).exp()
    at_ends = across @ partial[..., -1, :]  # M at the end of every chunk
    carried = F.pad(at_ends[..., :-1, :], (0, 0, 1, 0))  # nothing is carried into the first chunk
    # The first chunk's exponent is 0, not (undefined) - log_norm, so no inf ever meets that zero.
    previous_ends = torch.cat([log_norm[..., :1, :], ends[..., :-1, None].expand(-1, -1, -1, chunk)], dim=-2)
    decay = (previous_ends - log_norm).exp()
    out = partial + decay[..., None] * carried[..., None, :]
    return out.permute(0, 2, 3, 1, 4).reshape(b, n + pad, h, d)[:, :n]


class ElitaAttention(nn.Module):
    """ELiTA's Attention2 (the ELiTA write-up): causal softmax attention in linear time, with scalar keys.

    For token i, with scalar keys k1, k2, k3 (vectors of width dim, one set per head), value map V, and
    positions p_{r,i} = sin(i a_r / n + b_r) (r = 1, 2; vectors of width pos_dim) weighted by c:

        X_j = exp(k1 . x_j + p_{1,j} . c)
        y_i = (e^{k2 . x_i} V x_i + e^{p_{2,i} . c + k3 . x_i} sum_{j<=i} X_j V x_j)
              / (e^{k2 . x_i} + e^{p_{2,i} . c + k3 . x_i} sum_{j<=i} X_j)

    Each head has its own k1, k2, k3, a, b, c and its slice of V's output. Memory and time are linear in the
    length; `y, state = layer.step(x_new, state)` decodes from an O(1) ElitaState, starting from None.

    Takes x (batch, length, dim) and an optional `key_padding_mask` (batch, length), True for real tokens;
    returns (batch, length, dim), zero at padded positions.

    What we fixed in the write-up: n is the fixed `max_len`, never the input's length (else a token's output
    would change as the sequence grows); the sums run in log space as a convex mix
    y_i = g_i V x_i + (1 - g_i) M_i in which no exponent is positive, so 65k-token inputs and logits in the
    hundreds stay finite and match a float64 recurrence; the scalar keys are computed in the input's own
    precision even under bf16 autocast.

    Args:
        dim: the token width, an int >= 1 divisible by `heads`.
        heads: the number of heads, an int >= 1 (default 1, the equation as written).
        causal: must be True (the default): the sums run over j <= i; False is a ValueError.
        max_len: n in the positions' i a / n, an int >= 1 (default 1024): the position scale, not a limit;
            longer sequences run, the sines go on.
        pos_dim: the width of the position vectors p_{r,i} and c, an int >= 0 (default 16). 0 drops the
            position term (p . c = 0): the causal sums alone carry order, and no sine is read beyond the
            phases training saw when the layer runs past max_len (README, "What each attention can do").
        chunk_size: the chunk length of the eager route's blockwise running mean, an int >= 1 (default 64);
            it changes speed and memory, not the result.
        positions: None (default: the equation as written) or "alibi": row i weighs token j's history term
            by e^{-m_h (i - j)} with ALiBi's slope m_h per head, added to the sine term (pos_dim=0 for none).
            The logits then grow with the position (m_h i): in float32 they keep about 7 digits, so at 100k
            tokens and m_h = 1/4 the weights are exact to a few parts in a thousand.
        alibi_bias_max: with positions="alibi", the exponent of the slowest slope, 2^-alibi_bias_max, a number
            in (0, 126] (default 8, ALiBi's). See `alibi_slopes`.
    """

    def __init__(
        self,
        dim: int,
        heads: int = 1,
        causal: bool = True,
        max_len: int = 1024,
        pos_dim: int = 16,
        chunk_size: int = 64,
        positions: str | None = None,
        alibi_bias_max: float = 8.0,
    ):
        super().__init__()
        owner = type(self).__name__
        if not flag(causal, "causal", owner):
            raise ValueError("ElitaAttention is causal only (its sums run over j <= i), got causal=False")
        self.head_dim = check_heads(dim, heads, owner)
        if positions is not None and positions != "alibi":
            raise ValueError(f"{owner} positions must be None (the write-up's equation) or 'alibi', "
                             f"got {shown(positions)}")
        # max_len is n in the positions' i / n; 0 would divide by zero and make every output NaN
        max_len, pos_dim = integer(max_len, "max_len", owner), integer(pos_dim, "pos_dim", owner, minimum=0)
        chunk_size = integer(chunk_size, "chunk_size", owner)
        self.dim, self.heads, self.causal = dim, heads, causal
        self.max_len, self.chunk_size = max_len, chunk_size
        # k1 (history), k2 (the token itself), k3 (the row's weight on its history)
        self.keys = nn.Parameter(torch.randn(3, heads, dim) * dim**-0.5 * 0.1)
        # a_r and b_r of p_{r,i} = sin(i a_r / n + b_r), r = 1, 2; a spans slow to fast waves over n
        self.freq = nn.Parameter(
            torch.logspace(0, math.log10(max(max_len, 2) * math.pi), pos_dim).repeat(2, heads, 1)
        )
        self.phase = nn.Parameter(torch.rand(2, heads, pos_dim) * 2 * math.pi)
        self.pos_weight = nn.Parameter(torch.randn(heads, pos_dim) * max(pos_dim, 1) ** -0.5 * 0.1)  # c
        self.value = nn.Linear(dim, dim, bias=False)  # V, one slice of rows per head
        self.positions, self.alibi_bias_max = positions, check_alibi_bias_max(positions, alibi_bias_max, owner)
        # m_h: fixed, as in ALiBi; a buffer that is not saved (it follows from heads and alibi_bias_max)
        slopes = alibi_slopes(heads, bias_max=self.alibi_bias_max, dtype=torch.float32) if positions else None
        self.register_buffer("slopes", slopes, persistent=False)

    def _terms(self, x: torch.Tensor, start: int):
        """History logits l, self logits u, row offsets w (each (B, L, H), at least float32) and
        values V x (B, L, H, D) in the projection's dtype."""
        b, n, _ = x.shape
        wide = torch.promote_types(x.dtype, torch.float32)  # logits and sums in at least float32
        # The scalar keys are 3 * heads wide: run them in x's own precision even under
        # autocast (exponentiated logits want it, and a bf16 copy of x would be kept for the backward).
        with autocast_off(x.device):
            keyed = F.linear(x, self.keys.flatten(0, 1).to(x.dtype)).to(wide).view(b, n, 3, self.heads)
        position = torch.arange(n, device=x.device, dtype=wide) + start  # start: an int, a 0-d or a (B, 1) tensor
        # i a / n in whole turns, the whole turns dropped before the sine (frac, whose gradient is 1): fast waves
        # reach 1e5 rad over long sequences, where sin's own range reduction costs 3-5x more per element.
        turns = torch.frac(position[..., None, None, None] * (self.freq.to(wide) / (2 * math.pi * self.max_len)))
        pos = torch.sin(torch.add(self.phase.to(wide), turns, alpha=2 * math.pi))  # (L, 2, H, P), or (B, L, ...)
        pos = torch.linalg.vecdot(pos, self.pos_weight.to(wide))  # (L, 2, H): p_1 . c and p_2 . c
        # k1 x + p_1 . c and k3 x + p_2 . c, in one sum (a decoding step is a few dozen tiny operations)
        history, offset = (keyed[:, :, ::2] + pos).unbind(2)
        if self.positions == "alibi":  # e^{-m (i - j)} = e^{m j} e^{-m i}: the history gains m j, the row loses m i
            ramp = position[..., None] * self.slopes.to(wide)  # (L, H), or (B, L, H) from per-row starts
            history, offset = history + ramp, offset - ramp
        values = self.value(x).view(b, n, self.heads, self.head_dim)  # widened where they are read
        return history, keyed[:, :, 1], offset, values

    def _continue(self, x, state: ElitaState | None, key_padding_mask=None) -> tuple[torch.Tensor, ElitaState]:
        start = 0 if state is None else state.position
        if state is None and key_padding_mask is not None:  # positions count from each row's first real token
            start = -key_padding_mask.long().argmax(1, keepdim=True)  # (B, 1)
        history, own, offset, values = self._terms(x, start)
        if key_padding_mask is not None:
            history = history.masked_fill(~key_padding_mask[..., None], _PAD_LOGIT)
        if state is None:  # nothing seen yet: a log-normalizer of _PAD_LOGIT carries no mass
            b = x.shape[0]
            state = ElitaState(history.new_full((b, self.heads), _PAD_LOGIT),
                               history.new_zeros(b, self.heads, self.head_dim), 0)
        if x.shape[1] == 1:  # a decoding step: the scan's one update, in fewer operations than a kernel call costs
            out, log_norm, mean = self._one_token(history, own - offset, values.to(history.dtype),
                                                  state.log_norm, state.mean)
        elif native.usable(values, (torch.float32, torch.bfloat16, torch.float16)):
            # the gated running mean y, and the last A and M (csrc/elita_scan.cpp)
            out, log_norm, mean = native.elita_scan(history, own - offset, values, state.log_norm, state.mean)
        else:
            out, log_norm, mean = self._eager_mix(history, own - offset, values.to(history.dtype),
                                                  state.log_norm, state.mean)
        return out.flatten(-2).to(x.dtype), ElitaState(log_norm, mean, start + x.shape[1])

    @staticmethod
    def _one_token(history, gate_logits, values, log_norm0, mean0):
        """_eager_mix for one token: A' = logaddexp(A, l), M' = M + e^{l - A'} (v - M) (the same convex mix, as
        e^{A - A'} = 1 - e^{l - A'}), y = g v + (1 - g) M' with g = sigmoid(r - A')."""
        history, gate_logits, values = history[:, 0], gate_logits[:, 0], values[:, 0]
        log_norm = torch.logaddexp(log_norm0, history)
        mean = torch.lerp(mean0, values, (history - log_norm).exp()[..., None])
        out = torch.lerp(mean, values, torch.sigmoid(gate_logits - log_norm)[..., None])
        return out[:, None], log_norm, mean

    def _eager_mix(self, history, gate_logits, values, log_norm0, mean0):
        """The outputs (B, L, H, D) and the last log-normalizer and mean, from the chunked running mean."""
        log_norm = torch.logaddexp(history.logcumsumexp(1), log_norm0[:, None])
        mean = running_mean(history, log_norm, values, self.chunk_size)
        mean = mean + (log_norm0[:, None] - log_norm).exp()[..., None] * mean0[:, None]
        gate = torch.sigmoid(gate_logits - log_norm)[..., None]
        out = gate * values + (1 - gate) * mean
        return out, log_norm[:, -1].clone(), mean[:, -1].clone()

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, *,
                attn_mask: None = None, is_causal: bool = False) -> torch.Tensor:
        """Always causal, whatever is_causal says (it is accepted for timm's and PyTorch's calls); an attn_mask
        is refused: ELiTA has no query-key weights to mask."""
        check_tokens(x, self.dim, type(self).__name__)
        key_padding_mask = check_padding_mask(key_padding_mask, x, type(self).__name__)
        refuse_attn_mask(attn_mask, type(self).__name__)
        flag(is_causal, "is_causal", type(self).__name__)
        out = blocks.scan(self._continue, zero_padding(x, key_padding_mask), key_padding_mask)  # cache-sized pieces
        return zero_padding(out, key_padding_mask)

    def step(self, x: torch.Tensor, state: ElitaState | None = None,
             key_padding_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, ElitaState]:
        """Continue over new tokens x (batch, new, dim) from an O(1) state.

        Args:
            x: the new tokens, (batch, new, dim), following those summarized in `state`.
            state: the ElitaState returned by the previous call, or None to start a sequence at position 0.
            key_padding_mask: (batch, new) bool, True for real tokens; padding adds nothing to the sums, and
                from None, positions count from each row's first real token (left padding).

        Returns:
            The outputs for the new tokens (batch, new, dim), and the state after them.
        """
        owner = type(self).__name__
        check_tokens(x, self.dim, owner)
        b, wide = x.shape[0], torch.promote_types(x.dtype, torch.float32)  # the log-space sums' dtype
        check_state(state, ElitaState, {"log_norm": (b, self.heads), "mean": (b, self.heads, self.head_dim)},
                    wide, x.device, owner)
        position = None if state is None else state.position
        # a 0-d tensor (an exported step) or one position per row (batch, 1) (left-padded prompts)
        traced = isinstance(position, torch.Tensor) and position.shape in ((), (b, 1)) and not (
            position.is_floating_point() or position.is_complex() or position.dtype == torch.bool)
        if state is not None and not traced and (isinstance(position, bool) or not isinstance(position, int)
                                                 or position < 0):
            raise ValueError(f"{owner} state.position must be an int >= 0 (or a 0-d integer tensor), got {position!r}")
        key_padding_mask = check_padding_mask(key_padding_mask, x, owner)
        out, state = self._continue(zero_padding(x, key_padding_mask), state, key_padding_mask)
        return zero_padding(out, key_padding_mask), state


class FeedForward2(nn.Module):
    """ELiTA's bilinear feed-forward: y_k = sum_{i,j} W3[k, i, j] swish(W1 x + b1)_i swish(W2 x + b2)_j + b3_k.

    The ELiTA write-up's FeedForward2, y = W3 (swish(W1 x + b1) outer swish(W2 x + b2)) + b3 with
    swish(z) = z sigmoid(z): the up-projection is replaced by two narrow ones (dim and rank wide) whose outer
    product W3 reads.
    Takes x (..., dim) and returns (..., dim).

    Args:
        dim: the input and output width, an int >= 1.
        rank: the width of the second branch, an int >= 1 (default 8, as in the write-up); W3 holds
            dim * dim * rank weights.
    """

    def __init__(self, dim: int, rank: int = 8):
        super().__init__()
        dim, rank = integer(dim, "dim", "FeedForward2"), integer(rank, "rank", "FeedForward2")
        self.dim, self.rank = dim, rank
        self.w1 = nn.Linear(dim, dim)
        self.w2 = nn.Linear(dim, rank)
        self.w3 = nn.Linear(dim * rank, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.dim:
            raise ValueError(f"FeedForward2 expects input of shape (..., {self.dim}), got {tuple(x.shape)}")
        wide, narrow = F.silu(self.w1(x)), F.silu(self.w2(x))
        return self.w3((wide[..., :, None] * narrow[..., None, :]).flatten(-2))
