"""The recurrences behind the field's linear-time layers (gla.py, deltanet.py, ssd.py), computed in chunks.

Each layer keeps, per head, a matrix memory S (key width x value width) and reads it with a query:

    decayed sum (GLA, RetNet, Mamba-2's SSD):  S_t = diag(a_t) S_{t-1} + k_t v_t^T,          o_t = S_t^T q_t
    gated delta rule (DeltaNet):               S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T

with a_t in (0, 1] a decay per key channel (GLA) or per head (RetNet, SSD, DeltaNet) and b_t in (0, 1] the
delta rule's write strength. Token by token that is a loop of L small updates; training runs it in chunks of
C tokens instead, the way flash-linear-attention does (Yang et al. 2024, "Gated Linear Attention Transformers
with Hardware-Efficient Training"; Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule
over Sequence Length"): within a chunk, a C x C attention-like matrix of matrix products; across chunks, one
update of S per chunk. The code is ours, written from the papers' equations.

A NaN or inf token makes every later output NaN, as the recurrence does, and through the masked products
(0 * NaN) the earlier outputs of its own chunk too; the chunks before it stay finite (tests/test_yardsticks.py).

An exported graph (torch.export, ONNX) runs one chunk of the whole length, with no loop or branch on it:
quadratic in the length, as softmax attention is, but one graph for every length.

All arithmetic is in float32 (float64 for float64 inputs) whatever the inputs' dtype, and every exponent is
<= 0 except one: a per-channel decay is split as e^{G_t} e^{-G_i} inside a chunk, and its factors stay inside
float32 only while a chunk's summed log decay stays above -87. `chunked_decayed_sum` takes per-channel log
decays >= MIN_LOG_DECAY per token, so 16-token chunks keep that sum >= -80; a scalar decay needs no split and
has no bound. The float64 token-by-token references these are tested against are in tests/reference.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

MIN_LOG_DECAY = -5.0  # a per-channel gate keeps at least e^-5 = 0.7% of its memory per token (see above)
CHANNEL_CHUNK = 16  # tokens per chunk with a per-channel decay: 16 * 5 = 80 < 87, e^80 fits float32
SCALAR_CHUNK = 64  # tokens per chunk with a per-head decay (no bound needed)


@dataclass
class RecurrentState:
    """The decoding state of a gla, deltanet or ssd layer: its matrix memory per head, and the last inputs of
    its short convolution where it has one.

    Args:
        memory: S, (batch, heads, key width, value width), float32 (float64 for float64 inputs).
        conv: the short convolution's last width - 1 inputs (batch, width - 1, channels) in the layer's dtype,
            or None for a layer without one (gla).
    """

    memory: torch.Tensor
    conv: torch.Tensor | None = None


def _chunks(t: torch.Tensor, size: int | None) -> torch.Tensor:
    """(B, H, L, ...) zero-padded to a multiple of `size` and split: (B, H, L / size, size, ...); size None: one
    chunk of the whole length (B, H, 1, L, ...), what an exported graph runs at every length."""
    if size is None:
        return t.unsqueeze(2)
    pad = -t.shape[2] % size
    if pad:
        t = F.pad(t, (0, 0) * (t.dim() - 3) + (0, pad))
    return t.reshape(*t.shape[:2], t.shape[2] // size, size, *t.shape[3:])


def _wide(*tensors: torch.Tensor) -> list[torch.Tensor]:
    wide = torch.promote_types(tensors[0].dtype, torch.float32)
    return [t.to(wide) for t in tensors]


def chunked_decayed_sum(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor,
                        initial: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """o_t = S_t^T q_t with S_t = diag(e^{log_decay_t}) S_{t-1} + k_t v_t^T, S_{-1} = initial (zeros if None).

    Args:
        q, k: (B, H, L, dk). v: (B, H, L, dv).
        log_decay: (B, H, L) for one decay per head and token, or (B, H, L, dk) for one per key channel
            (then each >= MIN_LOG_DECAY); all <= 0.
        initial: (B, H, dk, dv) or None.

    Returns:
        o (B, H, L, dv) in float32 (float64 for float64 inputs), and S after the last token (B, H, dk, dv).
    """
    q, k, v, log_decay = _wide(q, k, v, log_decay)
    b, h, n, dk = k.shape
    scalar = log_decay.dim() == 3
    # an exported graph serves every length: one chunk, with no branch or loop on the length (quadratic in it)
    exporting = torch.compiler.is_exporting()
    # a short call (a decoding step) is one chunk of its own length: padding one token to a chunk would waste it
    size = None if exporting else min(SCALAR_CHUNK if scalar else CHANNEL_CHUNK, n)
    state = k.new_zeros(b, h, dk, v.shape[-1]) if initial is None else initial.to(k.dtype)
    if not exporting and n == 0:
        return v.new_zeros(b, h, 0, v.shape[-1]), state
    qc, kc, vc = _chunks(q, size), _chunks(k, size), _chunks(v, size)
    # padded tail tokens have k = v = 0 and log decay 0: they change nothing
    g = (_chunks(log_decay[..., None] if scalar else log_decay, size)).cumsum(3)  # G_t, (B, H, nc, C, 1 or dk)
    last = g[:, :, :, -1:]  # G_C: the whole chunk's log decay
    width = qc.shape[3]
    causal = torch.ones(width, width, dtype=torch.bool, device=q.device).tril()
    if scalar:
        gt = g[..., 0]
        distance = gt[..., :, None] - gt[..., None, :]  # G_t - G_i, <= 0 where i <= t
        weights = (qc @ kc.transpose(-1, -2)) * torch.exp(distance.masked_fill(~causal, -torch.inf))
    elif exporting:  # one chunk of any length: e^{G_t - G_i} per channel, never split (C x C x dk)
        distance = (g[..., :, None, :] - g[..., None, :, :]).masked_fill(~causal[..., None], -torch.inf)
        weights = torch.einsum("bhctd,bhcid,bhctid->bhcti", qc, kc, torch.exp(distance))
    else:
        weights = ((qc * torch.exp(g)) @ (kc * torch.exp(-g)).transpose(-1, -2)).masked_fill(~causal, 0)
    within = weights @ vc  # each chunk's own tokens
    writes = (kc * torch.exp(last - g)).transpose(-1, -2) @ vc  # what each chunk adds to S, (B, H, nc, dk, dv)
    keep = torch.exp(last).transpose(-1, -2)  # (B, H, nc, 1 or dk, 1): how much of S a chunk keeps
    starts = []
    # the only sequential part: one update of S per chunk. Its inputs are split once (unbind), not indexed per
    # chunk: the backward of each index fills a zero gradient of the whole tensor, which made the backward
    # quadratic in the length (GLA's at 16k tokens: 5.3 s against 0.3 s at 4k)
    for keep_c, writes_c in zip(keep.unbind(2), writes.unbind(2)):
        starts.append(state)
        state = keep_c * state + writes_c
    before = torch.stack(starts, 2)  # S at each chunk's start
    out = within + (qc * torch.exp(g)) @ before
    return out.flatten(2, 3)[:, :, :n], state


def chunked_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                       log_decay: torch.Tensor | None = None, initial: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """o_t = S_t^T q_t with S_t = a_t (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T, a_t = e^{log_decay_t}.

    Within a chunk, with g_t = a_1 ... a_t and u_t = b_t (v_t - a_t S_{t-1}^T k_t) the value actually written,
    S_t = g_t S_0 + sum_{i<=t} (g_t / g_i) k_i u_i^T, and the u of a chunk solve one unit lower-triangular
    system, (I + M) U = b V - b g K S_0 with M_ti = b_t (g_t / g_i) k_t . k_i for i < t (the WY / UT form).

    Args:
        q, k: (B, H, L, dk), k usually of unit length (then each update is a contraction). v: (B, H, L, dv).
        beta: b_t, (B, H, L), in [0, 1].
        log_decay: (B, H, L) <= 0, or None for the ungated delta rule (a_t = 1).
        initial: (B, H, dk, dv) or None.

    Returns:
        o (B, H, L, dv) in float32 (float64 for float64 inputs), and S after the last token.
    """
    if log_decay is None:
        log_decay = torch.zeros_like(beta)
    q, k, v, beta, log_decay = _wide(q, k, v, beta, log_decay)
    b, h, n, dk = k.shape
    state = k.new_zeros(b, h, dk, v.shape[-1]) if initial is None else initial.to(k.dtype)
    exporting = torch.compiler.is_exporting()  # one chunk at every length, as chunked_decayed_sum
    if not exporting and n == 0:
        return v.new_zeros(b, h, 0, v.shape[-1]), state
    size = None if exporting else min(SCALAR_CHUNK, n)  # a decoding step: one chunk of one token
    qc, kc, vc = _chunks(q, size), _chunks(k, size), _chunks(v, size)
    betas = _chunks(beta[..., None], size)  # (B, H, nc, C, 1); padded tail tokens write nothing (b = 0)
    g = _chunks(log_decay[..., None], size).cumsum(3)[..., 0]  # (B, H, nc, C)
    size = qc.shape[3]
    inclusive = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    decay = torch.exp((g[..., :, None] - g[..., None, :]).masked_fill(~inclusive, -torch.inf))  # g_t / g_i, i <= t
    lower = (betas * (kc @ kc.transpose(-1, -2)) * decay).tril(-1)  # M
    system = lower + torch.eye(size, dtype=k.dtype, device=k.device)
    # U = new_values - keys_in @ S_0, both from one triangular solve per chunk
    rhs = torch.cat([betas * vc, betas * torch.exp(g)[..., None] * kc], -1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    new_values, keys_in = solved[..., :v.shape[-1]], solved[..., v.shape[-1]:]
    reads = (qc @ kc.transpose(-1, -2)) * decay  # (Q K^T) with the decay between i and t, i <= t
    q_decayed = qc * torch.exp(g)[..., None]
    k_to_end = kc * torch.exp(g[..., -1:] - g)[..., None]
    keep = torch.exp(g[..., -1])[..., None, None]  # (B, H, nc, 1, 1)
    outs = []
    chunks = zip(*(t.unbind(2) for t in (new_values, keys_in, q_decayed, reads, keep, k_to_end)))  # split once
    for new_c, keys_c, q_c, reads_c, keep_c, k_c in chunks:
        written = new_c - keys_c @ state
        outs.append(q_c @ state + reads_c @ written)
        state = keep_c * state + k_c.transpose(-1, -2) @ written
    return torch.stack(outs, 2).flatten(2, 3)[:, :, :n], state


class CausalConv(torch.nn.Module):
    """A causal depthwise convolution over the token axis (width w: each output sees itself and w - 1 before),
    as Mamba and DeltaNet put in front of their recurrences. No norm, no residual (zoo/models/short_conv.py's
    block sublayer has both). Tokens before the first are zeros, or the `tail` a previous call returned.

    Args:
        channels: the width of the tokens it mixes, an int >= 1.
        width: w, an int >= 2.
    """

    def __init__(self, channels: int, width: int):
        super().__init__()
        self.channels, self.width = channels, width
        self.weight = torch.nn.Parameter(torch.empty(channels, width))
        self.bias = torch.nn.Parameter(torch.zeros(channels))
        torch.nn.init.uniform_(self.weight, -width**-0.5, width**-0.5)  # nn.Conv1d's bound for one input channel

    def forward(self, x: torch.Tensor, tail: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, L, channels) -> (its convolution (B, L, channels), the last w - 1 inputs for the next call)."""
        if tail is None:
            tail = x.new_zeros(x.shape[0], self.width - 1, self.channels)
        h = torch.cat([tail.to(x.dtype), x], 1)
        n, taps = x.shape[1], self.weight.to(x.dtype)
        out = self.bias.to(x.dtype) + h[:, :n] * taps[:, 0]
        for j in range(1, self.width):  # w shifted products (as ShortConv: as fast as conv1d at these sizes)
            out = out + h[:, j:j + n] * taps[:, j]
        return out, h[:, h.shape[1] - (self.width - 1):].clone()
