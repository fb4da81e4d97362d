"""InContextAttention's attention with the bias inside the kernel: never an L x L tensor.

The route of incontext.py before this one builds the bias interp(B_i, p_ij) as a (B, H, L, L) float mask
(csrc/incontext_bias.cpp) and hands it to SDPA; because the mask needs a gradient, SDPA takes its math kernel,
which also builds the (B, H, L, L) weights, and the step costs 2.8x gpt-tiny's at 500 tokens. Here one kernel
(csrc/incontext_attention.cpp) does flash attention's blocked online softmax with the bias computed block by block
from the O(L) gate sums and the tables, forward and backward: memory O(L), as SDPA's flash kernel for gpt-tiny.

PyTorch's FlexAttention would be the natural route (a score_mod reading the sums and the tables), but in torch
2.14 it has no backward on the CPU ("FlexAttention does not support backward on CPU"), so the CPU kernel is
written by hand. The kernel is a separate extension from native.py's (built on first use the same way, cached
per machine and torch version, about 20 s); `usable` says where it runs, and the layer falls back to the
bias-mask route everywhere else (padding, attn_mask, dropout, half precision, other devices, decoding, ONNX
export, `native.eager_routes()`), which the tests hold it to.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import warnings
from pathlib import Path
from types import ModuleType

import torch

from zoo.attention import native

SOURCE = Path(__file__).parent / "csrc" / "incontext_attention.cpp"


def _name() -> str:
    capability = torch.backends.cpu.get_cpu_capability()
    key = hashlib.sha256(f"{SOURCE}|{torch.__version__}".encode()).hexdigest()[:8]
    return f"zoo_incontext_attention_{capability.lower()}_{key}"


@functools.cache
def load() -> ModuleType | None:
    """The compiled kernel, or None where it cannot be built (ZOO_NATIVE=0 too): the layer then takes the
    bias-mask route."""
    if os.environ.get("ZOO_NATIVE", "1") == "0" or os.environ.get("ZOO_NATIVE_SANITIZE"):
        return None
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    from filelock import FileLock
    from torch.utils import cpp_extension
    from torch.utils.cpp_extension import _get_build_directory

    capability = torch.backends.cpu.get_cpu_capability()
    try:
        folder = Path(_get_build_directory(_name(), verbose=False))
        with FileLock(str(folder.parent / f"{folder.name}.zoo-build.lock")):
            built = (folder / f"{_name()}.so").is_file()
            with contextlib.nullcontext() if built else native._building_message(folder):
                return cpp_extension.load(
                    name=_name(), sources=[str(SOURCE)], extra_include_paths=[str(SOURCE.parent)],
                    extra_cflags=["-O3", "-fopenmp", *native.HEADER_DIET, *native.CAPABILITY_FLAGS.get(capability, [])],
                    extra_ldflags=["-fopenmp"],
                )
    except Exception as error:  # no compiler, no ninja, a read-only cache: the bias-mask route
        warnings.warn(f"zoo could not build the fused in-context attention kernel ({type(error).__name__}: "
                      f"{str(error)[:300]}); InContextAttention takes its bias-mask route (the same numbers, slower "
                      "and O(L^2) memory)", RuntimeWarning, stacklevel=2)
        return None


@torch.compiler.assume_constant_result
def _built() -> bool:
    return load() is not None


# the query dtypes the fused route takes: half precision (a bf16 autocast's q, k, v) is widened to float32 for it
FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def usable(q: torch.Tensor, key_padding_mask, attn_mask, dropout_p: float) -> bool:
    """Whether InContextAttention.forward takes the fused kernel: float32 or half-precision queries (FUSED_DTYPES) on
    the CPU, no padding, attn_mask or dropout, where the kernels could be built, outside `native.eager_routes()`
    and ONNX export (ONNX has no translation of zoo's operators)."""
    return (key_padding_mask is None and attn_mask is None and not dropout_p and not _disabled
            and q.device.type == "cpu" and q.dtype in FUSED_DTYPES
            and not native._eager_only and _built() and not native._exporting_to_onnx())


_disabled = False


@contextlib.contextmanager
def disabled():
    """Within this context InContextAttention.forward takes the bias-mask route even where the fused kernel could
    run: the tests and bench/incontext_bias.py compare the two."""
    global _disabled
    before, _disabled = _disabled, True
    try:
        yield
    finally:
        _disabled = before


# ---- the kernel as a PyTorch operator -------------------------------------------------------------


@torch.library.custom_op("zoo::incontext_attention", mutates_args=())
def incontext_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ends: torch.Tensor, starts: torch.Tensor,
                        tables: torch.Tensor, scale: float, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale q k^T + interp(T_i, clamp(p_ij, 0, P - 1))) v (csrc/incontext_attention.cpp), p_ij = c_i - c_{j-1}
    for j <= i and c_j - c_{i-1} for a later key (causal: none): q, k, v (B, H, L, D), the gate sums ends c_i and
    starts c_{i-1} (B, H, L), the tables (B, H, L, P), all float32 on the CPU -> (out (B, H, L, D), the log-sum-exp
    of each row (B, H, L), for the backward)."""
    out, lse = load().incontext_attention_forward(*map(_rows, (q, k, v)), ends.contiguous(), starts.contiguous(),
                                                  _rows(tables), scale, causal)
    return out, lse


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t itself where its rows are contiguous (the kernel takes any other strides: the layer's q, k, v and tables
    are transposed views of its projections), else a contiguous copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


@incontext_attention.register_fake
def _(q, k, v, ends, starts, tables, scale, causal):
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(q.shape[:-1])


@torch.library.custom_op("zoo::incontext_attention_backward", mutates_args=())
def incontext_attention_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                 out: torch.Tensor, lse: torch.Tensor, ends: torch.Tensor, starts: torch.Tensor,
                                 tables: torch.Tensor, scale: float, causal: bool) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    grads = load().incontext_attention_backward(*map(_rows, (grad, q, k, v, out)), lse.contiguous(),
                                                ends.contiguous(), starts.contiguous(), _rows(tables), scale,
                                                causal)
    return tuple(grads)


@incontext_attention_backward.register_fake
def _(grad, q, k, v, out, lse, ends, starts, tables, scale, causal):
    # the tables' gradient keeps the tables' layout (the kernel's at::zeros_like), the others are contiguous
    contiguous = (torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v, ends, starts))
    return (*contiguous, torch.empty_like(_rows(tables)))


def _setup(ctx, inputs, output):
    q, k, v, ends, starts, tables, ctx.scale, ctx.causal = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], ends, starts, tables)


def _backward(ctx, grad, _grad_lse):
    q, k, v, out, lse, ends, starts, tables = ctx.saved_tensors
    if grad is None:
        grad = torch.zeros_like(out)
    return (*incontext_attention_backward(grad, q, k, v, out, lse, ends, starts, tables, ctx.scale, ctx.causal),
            None, None)


incontext_attention.register_autograd(_backward, setup_context=_setup)


def attend_incontext(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gates: torch.Tensor, tables: torch.Tensor,
                     causal: bool) -> torch.Tensor:
    """The layer's attention on the fused kernel: q, k, v (B, H, L, D) in float32 or half precision, gates (B, H, L)
    and tables (B, H, L, P) in float32 -> (B, H, L, D) in q's dtype.

    Half-precision q, k, v are widened to float32, the kernel's arithmetic, and the output narrowed back: under a
    bf16 autocast (`precision: auto` on a CPU with AMX) the alternative is the bias-mask route, whose (L x L) bias
    and math-kernel SDPA cost 4.4x a training step of incontext-gpt-mini at 4 x 2,048 tokens
    (`python bench/incontext_bias.py --mini`)."""
    ends = gates.cumsum(-1)
    wide = [t.float() for t in (q, k, v)]  # no copy for float32
    out, _ = incontext_attention(*wide, ends, ends - gates, tables, q.shape[-1] ** -0.5, causal)
    return out.to(q.dtype)
