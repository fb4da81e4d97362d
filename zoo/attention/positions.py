"""Relative positions for dot-product attention: rotary embeddings (RoPE) and ALiBi's linear biases.

RoPE (Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding") rotates each
query and key by an angle proportional to its position, so that the logit q_i . k_j depends on the
positions only through i - j. ALiBi (Press, Smith and Lewis 2022, "Train Short, Test Long: Attention
with Linear Biases Enables Input Length Extrapolation") adds -m_h (i - j) to head h's logits. Neither
has a table of positions, so a layer runs at any length.
"""

from __future__ import annotations

import math

import torch

from zoo.utils.checks import number

# The largest ALiBi exponent taken: beyond it the slowest slope, 2^-bias_max, is below float32's smallest normal
# number (2^-126, torch.finfo(torch.float32).tiny) and is rounded, to 0 past 2^-149, taking that head's
# position signal with it; a silent 0 from a typo (99999 for 9.9999) would read as if it had worked.
LARGEST_BIAS_MAX = 126.0


def rotate(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """x rotated by RoPE at `positions`, in the half-split convention (GPT-NeoX, LLaMA's "rotate_half").

    With d = x.shape[-1] (even) and theta_f = base^(-2f / d) for f = 0 .. d/2 - 1, the channels f and
    f + d/2 of the token at position p form a pair that is rotated by the angle p * theta_f:

        y_f        = x_f cos(p theta_f) - x_{f+d/2} sin(p theta_f)
        y_{f+d/2}  = x_f sin(p theta_f) + x_{f+d/2} cos(p theta_f)

    Rotations compose, so rotate(q, i) . rotate(k, j) = q . R(theta (j - i)) k depends on i - j only
    (Su et al. 2021, eq. 14-16). RoFormer's paper pairs neighbouring channels (2f, 2f + 1) instead; the
    two conventions differ by a fixed permutation of the channels, which learned projections absorb.
    The angles are computed in float64 (float32 on MPS) and the rotation in at least float32; the result has
    x's dtype.

    Args:
        x: (batch, heads, length, head_dim) floating point, head_dim even.
        positions: integer positions, (length,) shared by the batch or (batch, length).
        base: the frequency base, a finite number > 1 (default 10000, as in RoFormer).

    Returns:
        The rotated x, of x's shape and dtype.
    """
    base = number(base, "base", "rotate", minimum=1.0, include_minimum=False)
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.is_floating_point() or x.shape[-1] % 2:
        got = f"{tuple(x.shape)} {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"rotate expects x as a floating point tensor (batch, heads, length, head_dim) with an even "
                         f"head_dim, got {got}")
    b, _, n, d = x.shape
    if (not isinstance(positions, torch.Tensor) or positions.is_floating_point() or positions.is_complex()
            or positions.dtype == torch.bool or tuple(positions.shape) not in ((n,), (b, n))):
        got = f"{tuple(positions.shape)} {positions.dtype}" if isinstance(positions, torch.Tensor) else \
            type(positions).__name__
        raise ValueError(f"rotate expects integer positions of shape ({n},) or ({b}, {n}), got {got}")
    wide = torch.promote_types(x.dtype, torch.float32)
    # Angles in float64 (a table of length x d/2, small): in float32 p * theta_0 at p = 5000 is off by 2e-4 rad
    exact = torch.float32 if x.device.type == "mps" else torch.float64  # (MPS has no float64)
    theta = base ** (torch.arange(0, d, 2, device=x.device, dtype=exact) / -d)  # (d/2,)
    angles = positions.to(device=x.device, dtype=exact)[..., None] * theta  # (length, d/2) or (batch, length, d/2)
    if angles.dim() == 3:
        angles = angles[:, None]  # over the heads
    cos, sin = angles.cos().to(wide), angles.sin().to(wide)
    first, second = x.to(wide).chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1).to(x.dtype)


def alibi_slopes(heads: int, *, bias_max: float = 8.0, dtype: torch.dtype = torch.float64,
                 device=None) -> torch.Tensor:
    """ALiBi's slope m_h for each of `heads` heads (Press et al. 2022, section 3 and their code).

    For n heads, n a power of two, the slopes are the geometric sequence that starts at 2^(-8/n) with that
    ratio: 2^(-8/n), 2^(-16/n), ..., 2^(-8) (8 heads: 1/2, 1/4, ..., 1/256). For other n, with c the largest
    power of two below n: the c slopes for c heads, then every other slope of 2c heads (the 1st, 3rd, ...),
    n - c of them (6 heads: 2^-2, 2^-4, 2^-6, 2^-8, then 2^-1, 2^-3).

    bias_max replaces the paper's 8 in those exponents (MPT's alibi_bias_max): the slowest slope is
    2^-bias_max, so a larger one lets the slowest head see further back (4 heads at 12: 1/8, ..., 1/4,096).

    Args:
        heads: the number of heads, an int >= 1.
        bias_max: the exponent of the slowest slope, a number in (0, 126] (default 8, the paper's; 126 keeps
            2^-bias_max a normal float32 number).
        dtype: the slopes' dtype (default float64; they are computed in Python floats).
        device: where the slopes live (default the CPU).

    Returns:
        (heads,) the slopes, largest first within each of the two runs.
    """
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise ValueError(f"alibi_slopes expects heads as an int >= 1, got {heads!r}")
    bias_max = _exponent(bias_max, "bias_max", "alibi_slopes")

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-bias_max * (i + 1) / n) for i in range(n)]

    lower = 2 ** int(math.log2(heads))
    slopes = geometric(lower) + geometric(2 * lower)[0::2][: heads - lower]
    return torch.tensor(slopes, dtype=dtype, device=device)


def _exponent(bias_max, name: str, owner: str) -> float:
    bias_max = number(bias_max, name, owner, include_minimum=False)
    if bias_max > LARGEST_BIAS_MAX:
        raise ValueError(f"{owner} {name} must be at most {LARGEST_BIAS_MAX:g}, got {bias_max:g}: the slowest "
                         f"slope, 2^-{name}, would be below float32's smallest normal number "
                         f"(2^-{LARGEST_BIAS_MAX:g}) and round towards 0, leaving that head without a position signal")
    return bias_max


def check_alibi_bias_max(positions: str | None, bias_max, owner: str) -> float:
    """A layer's alibi_bias_max, checked: a finite number in (0, 126], and other than 8 only with
    positions="alibi" (elsewhere it would change nothing, and a setting that silently does nothing reads as if it
    had worked)."""
    bias_max = _exponent(bias_max, "alibi_bias_max", owner)
    if positions != "alibi" and bias_max != 8.0:
        raise ValueError(f"{owner} alibi_bias_max sets ALiBi's slopes and needs positions='alibi', "
                         f"got alibi_bias_max={bias_max:g} with positions={positions!r}")
    return bias_max


def alibi_bias(slopes: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor,
               causal: bool = True) -> torch.Tensor:
    """ALiBi's additive logits: bias[h, i, j] = -m_h (p_i - p_j), or -m_h |p_i - p_j| when not causal.

    Press et al. 2022 define the causal form, where key j <= query i, so the bias is never positive; for a
    causal layer the entries above the diagonal (keys after the query, which are positive here) are masked
    out anyway. The bidirectional form, -m_h |p_i - p_j|, is the usual symmetric extension (the paper has no
    encoder); on the keys a causal query sees the two forms agree.

    Args:
        slopes: (heads,) floating point, from alibi_slopes.
        query_positions: integer positions of the queries, (Lq,) or (batch, Lq).
        key_positions: integer positions of the keys, (Lk,) or (batch, Lk).
        causal: True (default): -m (p_i - p_j); False: -m |p_i - p_j|.

    Returns:
        (heads, Lq, Lk), or (batch, heads, Lq, Lk) with batched positions, in the slopes' dtype (at least
        float32).
    """
    if not isinstance(slopes, torch.Tensor) or slopes.dim() != 1 or not slopes.is_floating_point():
        raise ValueError(f"alibi_bias expects slopes as a 1-D floating point tensor (heads,), got "
                         f"{tuple(slopes.shape) if isinstance(slopes, torch.Tensor) else type(slopes).__name__}")
    wide = torch.promote_types(slopes.dtype, torch.float32)
    distance = query_positions.to(wide)[..., :, None] - key_positions.to(wide)[..., None, :]  # (..., Lq, Lk)
    if not causal:
        distance = distance.abs()
    return -slopes.to(wide)[:, None, None] * distance[..., None, :, :]
