"""The attention weights' normalizers, below every mechanism: softmax_one (quiet attention) and the
clipped softmax (clipped attention). dot_product.py and the mechanisms import them from here, so nothing in
zoo.attention imports in a circle; quiet.py and clipped.py re-export them.

softmax_one has two routes to the same numbers. On the CPU in float32, bfloat16 and float16 a compiled
kernel (csrc/softmax_one.cpp, see native.py) makes torch.softmax's own three passes with the "1" folded
in. Everywhere else (float64, CUDA, no compiler) the eager route uses softmax_one = softmax * sigmoid(log S),
since S / (1 + S) = sigmoid(log S): PyTorch's fused softmax gives y = softmax(x), and log S is then
x_0 - log y_0 for any column, so one column of each suffices where the column is not vanishingly small.
The gradient has the same form as softmax's, grad_x = y * (g - sum(g * y)).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

import zoo.attention.native as native
from zoo.utils.checks import check_data


def _forward_eager(x: torch.Tensor, dim: int) -> torch.Tensor:
    y = torch.softmax(x, dim)
    wide = torch.promote_types(x.dtype, torch.float32)  # bf16 and fp16 work in float32
    x0 = x.narrow(dim, 0, 1).to(wide)
    y0 = y.narrow(dim, 0, 1).to(wide)
    log_sum = x0 - y0.log()
    # Where column 0 underflowed (or is masked with -inf), its ratio says nothing; fall back.
    usable = y0 > torch.finfo(wide).tiny
    if not bool(usable.all()):
        log_sum = torch.where(usable, log_sum, torch.logsumexp(x.to(wide), dim, keepdim=True))
        # A row of -inf is exactly zero (softmax alone made it NaN).
        y.masked_fill_(torch.isneginf(log_sum), 0.0)
    return y.mul_(torch.sigmoid(log_sum).to(y.dtype))


class _SoftmaxOneEager(torch.autograd.Function):
    """The eager route with softmax's backward: its forward works in place on softmax's output."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, dim: int) -> torch.Tensor:
        y = _forward_eager(x, dim)
        ctx.dim = dim
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        (y,) = ctx.saved_tensors
        return torch._softmax_backward_data(grad, y, ctx.dim, y.dtype), None


KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def softmax_one(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax_one(x)_i = exp(x_i) / (1 + sum_j exp(x_j)) along `dim`, stable for every finite input.

    Evan Miller's "attention is off by one": the extra 1 lets every weight go to 0 together. Fixed from
    the quiet-attention write-up, which subtracts the row maximum m before adding the 1 and so computes
    exp(x_i) / (exp(m) + sum_j exp(x_j)), another function (1/3 each for x = [10, 10], not about 1/2): here
    the 1 stays exact. A row of -inf gives zeros. Differentiable, with softmax's form of gradient.

    Args:
        x: the logits, a floating-point tensor of any shape with at least one dimension.
        dim: the dimension to normalize over, in [-x.dim(), x.dim()) (default -1, the last).

    Returns:
        A tensor of x's shape and dtype, each slice along `dim` non-negative and summing to less than 1.
    """
    check_data(x, "its input", "softmax_one")
    if not x.is_floating_point():
        raise ValueError(f"softmax_one expects a floating-point tensor, got dtype {x.dtype}")
    if x.dim() == 0:
        raise ValueError("softmax_one expects a tensor with at least one dimension, got a scalar")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"softmax_one got dim={dim} for a tensor of {x.dim()} dimensions")
    dim = dim % x.dim()
    if x.shape[dim] == 0:
        return x.clone()
    needs_grad = torch.is_grad_enabled() and x.requires_grad
    if not native.usable(x, KERNEL_DTYPES):
        return _SoftmaxOneEager.apply(x, dim) if needs_grad else _forward_eager(x, dim)
    last = x.movedim(dim, -1)
    if needs_grad or torch.compiler.is_compiling():
        y = native.softmax_one(last)  # the operator, which autograd and the compilers see
    else:
        y = native.load().softmax_one_lastdim(last)  # the operator's dispatch costs tens of microseconds a call
    return y.movedim(-1, dim)



def clipped_softmax(x: torch.Tensor, dim: int = -1, zeta: float = 1.0, gamma: float = 0.0) -> torch.Tensor:
    """clipped_softmax(x)_i = clip((zeta - gamma) * softmax(x)_i + gamma, 0, 1) along `dim`.

    Bondarenko, Nagel and Blankevoort 2023: with gamma < 0 a weight reaches exactly 0 at a finite logit, with
    zeta > 1 exactly 1. The defaults (zeta = 1, gamma = 0) give the plain softmax. The gradient is zero
    where the clip is active.

    Args:
        x: the logits, a floating-point tensor of any shape.
        dim: the dimension to normalize over (default -1, the last).
        zeta: the stretch's upper end, a number, >= 1 in the paper (default 1).
        gamma: the stretch's lower end, <= 0 in the paper (default 0); a number, or a tensor that broadcasts
            against x (e.g. -alpha / keys seen, per row).

    Returns:
        A tensor of x's shape, every weight in [0, 1].
    """
    if not x.is_floating_point():
        raise ValueError(f"clipped_softmax expects a floating-point tensor, got dtype {x.dtype}")
    return ((zeta - gamma) * torch.softmax(x, dim) + gamma).clamp(0.0, 1.0)
