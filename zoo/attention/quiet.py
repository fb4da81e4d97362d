"""Quiet attention: softmax_one (Evan Miller's "attention is off by one").

    softmax_one(x)_i = exp(x_i) / (1 + sum_j exp(x_j))

The seed (quiet-attention.md) subtracts the row maximum m first and then adds 1,
which computes exp(x_i - m) / (1 + sum_j exp(x_j - m)) = exp(x_i) / (exp(m) + sum_j exp(x_j)):
a different function whose weights can never all vanish (for x = [10, 10] it gives 1/3
each instead of about 1/2). We keep the 1 exact.

Two routes to the same numbers. On the CPU in float32, bfloat16 and float16 a compiled
kernel (csrc/softmax_one.cpp, see native.py) makes torch.softmax's own three passes
with the "1" folded in. Everywhere else (float64, CUDA, no compiler) the eager route
uses softmax_one = softmax * sigmoid(log S), since S / (1 + S) = sigmoid(log S):
PyTorch's fused softmax gives y = softmax(x), and log S is then x_0 - log y_0 for any
column, so one column of each suffices where the column is not vanishingly small.
The gradient has the same form as softmax's, grad_x = y * (g - sum(g * y)).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from zoo.attention import native
from zoo.attention.softmax import SoftmaxAttention


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
    """exp(x_i) / (1 + sum_j exp(x_j)) along `dim`, stable for every finite input."""
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


class QuietAttention(SoftmaxAttention):
    """Multi-head attention whose weights are softmax_one: a head may attend to nothing."""

    quiet = True
