"""MicroAttention (the MicroAttention write-up): attention with a running weighted mean.

Each token gets a non-negative score from P learned global queries,

    s_t = sum_p relu(q_p . x_t),

and the layer returns W_o (x_t - m_t) with m_t the score-weighted mean of the tokens
so far (causal) or of all tokens (bidirectional, for images):

    m_t = sum_{j<=t} s_j x_j / sum_{j<=t} s_j.

With `heads` > 1 each head has its own P queries (over the whole token) and its own
mean over its slice of channels; heads=1 is the write-up's layer. A causal layer decodes
with one vector and one scalar per head of state.

Fixes to the seed: its code defines `ScoresMatrix` but uses `self.Matrix`, so it does
not run as printed; and it divides by (sum + 1e-9), an epsilon that rounds away in
half precision, so a prefix whose scores are all zero gives 0/0 = NaN. Here such a
prefix has mean 0 (there is nothing to average), sums accumulate in float32 whatever
the input dtype, and padded tokens get score 0, so they never enter any mean.

On the CPU in float32 the causal running mean goes through a compiled kernel
(csrc/micro_scan.cpp, see native.py): one pass over the tokens forward, two backward,
and nothing full-width kept between them; the eager route below computes the same
numbers with cumsums and is what runs elsewhere.

positions="alibi" (ours, not the write-up's) makes the mean fade with distance, as ALiBi
does for softmax attention (Press et al. 2022): token j enters m_t with weight
e^{-m_h (t - j)} s_j, m_h ALiBi's slope of head h. As written, m_t weighs a token by its
own score alone, never by how far back it is, so at 2,048 characters of War and Peace the
previous character was one of 2,048 in the mean and the model did no better than a 2-gram
model (held-out loss 2.41 nats per character); with positions="alibi" the same budget reached
1.29, and held it to 64x the context (README, "What each attention can do"). The sums become
decayed sums, S_t = e^{-m} S_{t-1} + s_t x_t, still one vector and one scalar per head; they run
in chunks (`decayed_cumsum`) whose every exponent is <= 0, so no length overflows them (the
cumsum form would need e^{m j}). The compiled kernel serves the mean as written only.
"""

from __future__ import annotations

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


def decayed_cumsum(values: torch.Tensor, slopes: torch.Tensor, initial: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """y_t = sum_{j<=t} e^{-m (t - j)} v_j + e^{-m (t + 1)} y_{-1}, with one decay rate m per head.

    In chunks (flash-linear-attention style): inside a chunk a lower-triangular (C, C) matrix of
    e^{-m (t - j)}, across chunks the same form one level up on the chunks' last sums; every exponent
    is <= 0, so nothing overflows at any length. values (B, L, H, D), slopes (H,) >= 0, initial (B, H, D)
    (the sums before the first token). Returns (B, L, H, D). A NaN or inf value makes every later sum NaN and,
    through the masked products (0 * NaN), the earlier ones of its chunks too; one token at a time it does not.
    """
    b, n, h, d = values.shape

    def fading(length: int, step: int = 1) -> torch.Tensor:  # (H, length, length): e^{-m step (t - j)}, j <= t
        t = torch.arange(length, device=values.device)
        distance = (t[:, None] - t[None, :]).to(values.dtype)
        weights = torch.exp(-slopes[:, None, None] * (step * distance.clamp(min=0)))
        return weights.masked_fill(distance < 0, 0)

    def from_initial(length: int, step: int = 1) -> torch.Tensor:  # (length, H): e^{-m step (t + 1)}
        t = torch.arange(1, length + 1, device=values.device).to(values.dtype)
        return torch.exp(-(step * t)[:, None] * slopes)

    if torch.compiler.is_exporting() or n <= chunk:
        # One chunk: an exported graph serves every length, which the chunking below cannot do without
        # branching on it (quadratic in a prompt's length there; a decoding step's matrix is (1, 1)).
        return torch.einsum("htj,bjhd->bthd", fading(n), values) + from_initial(n)[..., None] * initial[:, None]
    pad = -n % chunk
    k = (n + pad) // chunk
    pieces = F.pad(values, (0, 0, 0, 0, 0, pad)).view(b, k, chunk, h, d)
    partial = torch.einsum("htj,bkjhd->bkthd", fading(chunk), pieces)  # each chunk's own sums
    # the sums at the end of every chunk, then those before every chunk (initial before the first)
    at_ends = torch.einsum("hkj,bjhd->bkhd", fading(k, chunk), partial[:, :, -1])
    at_ends = at_ends + from_initial(k, chunk)[..., None] * initial[:, None]
    carried = torch.cat([initial[:, None], at_ends[:, :-1]], 1)
    out = partial + from_initial(chunk)[..., None] * carried[:, :, None]
    return out.reshape(b, k * chunk, h, d)[:, :n]


@dataclass
class MicroState:
    """Running sums of a causal MicroAttention: sum_j s_j x_j (batch, heads, head_dim) and sum_j s_j (batch, heads).

    The state between calls of `MicroAttention.step`: pass None to start, then the state each call returns.
    Both sums are in float32 (float64 for float64 inputs) whatever the tokens' dtype. With positions="alibi"
    they are the decayed sums: each term j weighed by e^{-m_h (t - j)} at token t.

    Args:
        weighted_sum: sum_{j<=t} s_j x_j over the tokens seen so far, per head, (batch, heads, head_dim).
        score_sum: sum_{j<=t} s_j over the same tokens, (batch, heads), >= 0.
    """

    weighted_sum: torch.Tensor
    score_sum: torch.Tensor


class MicroAttention(nn.Module):
    """MicroAttention (the MicroAttention write-up): each token minus a score-weighted running mean of the tokens.

    Each token x_t gets a non-negative score from P learned global queries q_p, and the layer returns

        s_t = sum_p relu(q_p . x_t)
        m_t = sum_{j<=t} s_j x_j / sum_{j<=t} s_j        (all j, not j <= t, when bidirectional)
        y_t = W_o (x_t - m_t)

    x plays both key and value; there is no position encoding. With heads > 1 each head has its own P
    queries (over the whole token) and its own mean over its slice of dim / heads channels. A causal layer
    decodes with `y, state = layer.step(x_new, state)` from a MicroState of one vector and one scalar per
    head, starting from `state=None`. positions="alibi" (ours) weighs token j in m_t by e^{-m_h (t - j)} s_j.

    Takes x (batch, length, dim) and an optional `key_padding_mask` (batch, length), True for real tokens;
    returns (batch, length, dim), zero at padded positions.

    What we fixed in the seed: its code defines `ScoresMatrix` but uses `self.Matrix`, so it does not run as
    printed; and its (sum + 1e-9) rounds away in half precision, so an all-zero score prefix gave 0/0 = NaN.
    Here that prefix's mean is 0, the sums accumulate in float32 whatever the input dtype, and padded tokens
    get score 0, so they never enter a mean.

    Args:
        dim: the token width, an int >= 1 divisible by `heads`.
        heads: the number of heads, an int >= 1 (default 1, the write-up's layer).
        causal: True (the default): m_t averages tokens 0..t, and `step` decodes; False: every m_t averages
            all tokens (for images).
        num_queries: P, the number of learned global queries per head, an int >= 1 (default 4).
        positions: None (default: the mean as written, every earlier token by its score alone) or "alibi": a
            history fading with distance, token j in m_t weighed by e^{-m_h (t - j)} s_j with ALiBi's slope m_h
            per head (causal layers only). It adds no parameters.
        alibi_bias_max: with positions="alibi", the exponent of the slowest slope, 2^-alibi_bias_max, a number
            in (0, 126] (default 8, ALiBi's: with 4 heads the slowest head's weight falls below 1% about 1,180 tokens
            back; 12 puts that near 19,000). See `alibi_slopes`.
    """

    def __init__(self, dim: int, heads: int = 1, causal: bool = True, num_queries: int = 4,
                 positions: str | None = None, alibi_bias_max: float = 8.0):
        super().__init__()
        owner = type(self).__name__
        self.head_dim = check_heads(dim, heads, owner)
        causal, num_queries = flag(causal, "causal", owner), integer(num_queries, "num_queries", owner)
        if positions is not None and positions != "alibi":
            raise ValueError(f"{owner} positions must be None (the write-up's mean) or 'alibi', got {shown(positions)}")
        if positions and not causal:
            raise ValueError(f"{owner} positions='alibi' needs causal=True (the history fades behind each token), "
                             "got causal=False")
        self.dim, self.heads, self.causal, self.num_queries = dim, heads, causal, num_queries
        self.queries = nn.Parameter(torch.empty(heads * num_queries, dim))
        nn.init.xavier_uniform_(self.queries)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.positions, self.alibi_bias_max = positions, check_alibi_bias_max(positions, alibi_bias_max, owner)
        # m_h: fixed, as in ALiBi; a buffer that is not saved (it follows from heads and alibi_bias_max)
        slopes = alibi_slopes(heads, bias_max=self.alibi_bias_max, dtype=torch.float32) if positions else None
        self.register_buffer("slopes", slopes, persistent=False)

    def _scores_and_tokens(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None):
        """Scores (batch, length, heads), zero at padding, and tokens (batch, length, heads, head_dim)."""
        b, n, _ = x.shape
        wide = torch.promote_types(x.dtype, torch.float32)  # sums accumulate in at least float32
        # The score projection is only heads * num_queries wide: run it in x's own precision
        # even under autocast, where a bf16 copy of x would be made, and kept for the backward.
        with autocast_off(x.device):
            logits = F.linear(x, self.queries.to(x.dtype))
        scores = F.relu(logits).to(wide).view(b, n, self.heads, self.num_queries).sum(-1)
        if key_padding_mask is not None:
            scores = scores * key_padding_mask[..., None]
        return scores, x.to(wide).view(b, n, self.heads, self.head_dim)

    def _output(self, x: torch.Tensor, tokens: torch.Tensor, weighted_sum: torch.Tensor, score_sum: torch.Tensor):
        # A zero score sum means every score so far was zero, and then the weighted sum is zero too.
        mean = weighted_sum / torch.where(score_sum > 0, score_sum, 1.0)[..., None]
        return self.proj((tokens - mean).flatten(-2).to(x.dtype))

    def _continue(self, x, state: MicroState | None, key_padding_mask=None) -> tuple[torch.Tensor, MicroState]:
        scores, tokens = self._scores_and_tokens(x, key_padding_mask)
        if state is None:  # nothing seen yet: both sums are zero
            b = tokens.shape[0]
            state = MicroState(tokens.new_zeros(b, self.heads, self.head_dim), tokens.new_zeros(b, self.heads))
        if self.positions == "alibi":  # the decayed sums of s x and s, in one pass
            weighted = torch.cat([tokens * scores[..., None], scores[..., None]], -1)
            initial = torch.cat([state.weighted_sum, state.score_sum[..., None]], -1)
            sums = decayed_cumsum(weighted, self.slopes.to(tokens.dtype), initial)
            weighted_sum, score_sum = sums[..., :-1], sums[..., -1]
        elif native.usable(tokens, (torch.float32,)):
            # x - (S0 + cumsum(s x)) / (z0 + cumsum(s)) and the final sums (csrc/micro_scan.cpp)
            diff, weighted_sum, score_sum = native.micro_scan(tokens, scores, state.weighted_sum, state.score_sum)
            return self.proj(diff.flatten(-2).to(x.dtype)), MicroState(weighted_sum, score_sum)
        else:
            weighted_sum = (tokens * scores[..., None]).cumsum(1) + state.weighted_sum[:, None]
            score_sum = scores.cumsum(1) + state.score_sum[:, None]
        out = self._output(x, tokens, weighted_sum, score_sum)
        return out, MicroState(weighted_sum[:, -1].clone(), score_sum[:, -1].clone())

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, *,
                attn_mask: None = None, is_causal: bool = False) -> torch.Tensor:
        """is_causal=True makes a bidirectional layer attend causally for this call (timm's and PyTorch's
        convention); an attn_mask is refused: micro attention has no query-key weights to mask."""
        check_tokens(x, self.dim, type(self).__name__)
        key_padding_mask = check_padding_mask(key_padding_mask, x, type(self).__name__)
        refuse_attn_mask(attn_mask, type(self).__name__)
        causal = self.causal or flag(is_causal, "is_causal", type(self).__name__)
        x = zero_padding(x, key_padding_mask)
        if not causal:
            scores, tokens = self._scores_and_tokens(x, key_padding_mask)
            weighted = tokens * scores[..., None]
            out = self._output(x, tokens, weighted.sum(1, keepdim=True), scores.sum(1, keepdim=True))
        else:
            out = blocks.scan(self._continue, x, key_padding_mask)  # cache-sized pieces of the scan
        return zero_padding(out, key_padding_mask)

    def step(self, x: torch.Tensor, state: MicroState | None = None,
             key_padding_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, MicroState]:
        """Continue the running mean over new tokens x (batch, new, dim).

        Args:
            x: the new tokens, (batch, new, dim), following those summed in `state`.
            state: the MicroState returned by the previous call, or None to start a sequence.
            key_padding_mask: (batch, new) bool, True for real tokens; padding adds nothing to the sums.

        Returns:
            The outputs for the new tokens (batch, new, dim), and the state after them.
        """
        if not self.causal:
            raise RuntimeError("MicroAttention.step needs causal=True: the bidirectional mean sees the future")
        check_tokens(x, self.dim, type(self).__name__)
        b, wide = x.shape[0], torch.promote_types(x.dtype, torch.float32)  # the sums' dtype
        check_state(state, MicroState, {"weighted_sum": (b, self.heads, self.head_dim), "score_sum": (b, self.heads)},
                    wide, x.device, type(self).__name__)
        key_padding_mask = check_padding_mask(key_padding_mask, x, type(self).__name__)
        out, state = self._continue(zero_padding(x, key_padding_mask), state, key_padding_mask)
        return zero_padding(out, key_padding_mask), state
