"""Compiled CPU kernels (csrc/), built on first use by PyTorch's C++ extension loader.

Each kernel is a fast route to numbers that an eager PyTorch path also computes, and
the tests hold the two together; nothing needs the kernels to work. The first build
takes about 20 s on 2 cores and needs a C++ compiler and ninja. PyTorch caches the result per
machine and torch version (under TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions),
so later processes only load it. Without a compiler, or with ZOO_NATIVE=0, zoo warns
once and stays on the eager paths. ZOO_NATIVE_SANITIZE=address builds a separate copy
under AddressSanitizer, for `.ci/asan` (run Python with libasan preloaded). Below, each
kernel becomes a PyTorch custom operator with its backward.
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

# kernels.cpp includes softmax_one.cpp, micro_scan.cpp, elita_scan.cpp and incontext_bias.cpp: one unit reads
# PyTorch's headers once, not four times (ninja's dependency files rebuild it when any of them changes)
SOURCES = [Path(__file__).parent / "csrc" / name for name in ("bindings.cpp", "kernels.cpp")]

# Compile for the vector width PyTorch itself dispatches to on this CPU, so that
# at::vec::Vectorized and its exp are the ones PyTorch's own kernels use.
CAPABILITY_FLAGS = {
    "AVX512": ["-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512",
               "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"],
    "AVX2": ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2", "-mavx2", "-mfma", "-mf16c"],
}

# The kernels include ATen/core/Tensor.h and one header per operator they call, not ATen/ATen.h (every
# operator's header: the first build took 51-55 s with it, 41 s without, on 2 cores); PyTorch's own flag
# makes an include of ATen/ATen.h an error, so the diet holds.
HEADER_DIET = ["-DTORCH_ASSERT_ONLY_METHOD_OPERATORS"]

log = logging.getLogger(__name__)


def _name() -> str:
    # One build folder per installed copy and torch version: two environments sharing
    # the cache would otherwise rebuild over each other at every switch.
    capability = torch.backends.cpu.get_cpu_capability()
    key = hashlib.sha256(f"{SOURCES[0].parent}|{torch.__version__}".encode()).hexdigest()[:8]
    sanitize = os.environ.get("ZOO_NATIVE_SANITIZE", "")
    return f"zoo_native_{capability.lower()}_{key}" + (f"_{sanitize}" if sanitize else "")


def build_folder() -> Path:
    """Where PyTorch builds and caches the kernels (TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions)."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(_name(), verbose=False))


@contextlib.contextmanager
def _building_message(folder: Path):
    """One line on stderr while a build runs (minutes), with the seconds so far where stderr is a terminal."""
    import sys
    import threading
    import time

    started, done = time.time(), threading.Event()
    line = (f"zoo: building the compiled CPU kernels once, in {folder} "
            "(under a minute; `zoo build-kernels` does it ahead)")
    live = sys.stderr.isatty()

    def tick():
        while not done.wait(1.0):
            sys.stderr.write(f"\r{line} {time.time() - started:.0f} s")
            sys.stderr.flush()

    sys.stderr.write(line + ("" if live else "\n"))
    sys.stderr.flush()
    ticker = threading.Thread(target=tick, daemon=True) if live else None
    if ticker:
        ticker.start()
    try:
        yield
    finally:
        done.set()
        if ticker:
            ticker.join()
        sys.stderr.write(f"{chr(13) + line + ' ' if live else 'zoo: '}done in {time.time() - started:.0f} s\n")


@functools.cache
def load() -> ModuleType | None:
    """The compiled kernels, or None where they cannot be built (zoo then stays eager).

    Processes that start at once build once: the first takes a lock beside the build folder,
    the others wait for it and then load what it built.
    """
    if os.environ.get("ZOO_NATIVE", "1") == "0":
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    # Importing cpp_extension logs a warning about CUDA that means nothing on the CPU.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    from filelock import FileLock
    from torch.utils import cpp_extension

    sanitize = os.environ.get("ZOO_NATIVE_SANITIZE", "")
    checked = [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-g"] if sanitize else []
    try:
        folder = build_folder()
        with FileLock(str(folder.parent / f"{folder.name}.zoo-build.lock")):
            built = (folder / f"{_name()}.so").is_file()
            with contextlib.nullcontext() if built else _building_message(folder):
                return cpp_extension.load(
                    name=_name(),
                    sources=[str(s) for s in SOURCES],
                    extra_cflags=["-O3", "-fopenmp", *HEADER_DIET, *CAPABILITY_FLAGS.get(capability, []), *checked],
                    extra_ldflags=["-fopenmp", *checked],
                )
    except Exception as error:  # no compiler, no ninja, a read-only cache: all mean "stay eager"
        warnings.warn(
            f"zoo could not build its compiled CPU kernels ({type(error).__name__}: {str(error)[:300]}); "
            "softmax_one, causal MicroAttention, ELiTA and the in-context bias run on their eager routes (the same "
            "numbers, slower). "
            "Install a C++ compiler to get the kernels, or set ZOO_NATIVE=0 to silence this.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


@torch.compiler.assume_constant_result
def _built() -> bool:
    return load() is not None


_eager_only = False


@contextlib.contextmanager
def eager_routes():
    """Within this context the eager routes run even where the kernels could: for exporters that
    translate PyTorch's own operators but not zoo's (ONNX)."""
    global _eager_only
    before, _eager_only = _eager_only, True
    try:
        yield
    finally:
        _eager_only = before


@torch.compiler.assume_constant_result
def _exporting_to_onnx() -> bool:
    """Whether torch.onnx.export (either exporter) is tracing: ONNX has no translation of zoo's operators,
    so exports take the eager routes, built of operators it knows, without the user passing anything."""
    import sys

    onnx = sys.modules.get("torch.onnx")
    return onnx is not None and onnx.is_in_onnx_export()


def usable(t: torch.Tensor, dtypes: tuple[torch.dtype, ...]) -> bool:
    """Whether the kernels take `t`: a CPU tensor of one of `dtypes`, where they could be built, outside an
    ONNX export. torch.compile takes the answer as a constant of the graph (it is one: the build happens once)."""
    return (not _eager_only and t.device.type == "cpu" and t.dtype in dtypes and _built()
            and not _exporting_to_onnx())


# ---- the kernels as PyTorch operators ----------------------------------------------------------
# Registered with torch.library, each with a fake (shape-only) implementation and its backward,
# so that torch.compile and torch.export see one operator (zoo::micro_scan, ...) where they
# would otherwise stop at an opaque extension call. `torch.library.opcheck` tests each.


def _contiguous(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.contiguous() for t in tensors]


def _grad(grad: torch.Tensor | None, like: torch.Tensor, dtype: torch.dtype | None = None,
          shape: tuple[int, ...] | None = None) -> torch.Tensor:
    """The gradient of an output that was not used may come as None: zeros (of `like`'s shape unless `shape`
    is given) for the kernels."""
    if grad is None:
        return like.new_zeros(like.shape if shape is None else shape, dtype=dtype or like.dtype)
    return grad.contiguous()


@torch.library.custom_op("zoo::softmax_one", mutates_args=())
def softmax_one(x: torch.Tensor) -> torch.Tensor:
    """exp(x_i) / (1 + sum_j exp(x_j)) along the last dimension (float32, bfloat16 or float16 on the CPU)."""
    return load().softmax_one_lastdim(x.contiguous())


@softmax_one.register_fake
def _(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _softmax_one_backward(ctx, grad):
    (y,) = ctx.saved_tensors
    return torch._softmax_backward_data(grad, y, -1, y.dtype)  # softmax's form: y * (g - sum(g * y))


softmax_one.register_autograd(_softmax_one_backward,
                              setup_context=lambda ctx, inputs, output: ctx.save_for_backward(output))


@torch.library.custom_op("zoo::micro_scan", mutates_args=())
def micro_scan(x: torch.Tensor, s: torch.Tensor, S0: torch.Tensor, z0: torch.Tensor) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor]:
    """MicroAttention's causal running mean (csrc/micro_scan.cpp): x (B, L, H, D), scores s (B, L, H) and
    the carried sums S0 (B, H, D), z0 (B, H) -> x - mean (B, L, H, D), and the last sums S_L, z_L."""
    d, S, z = load().micro_scan_forward(*_contiguous(x, s, S0, z0))
    return d, S, z


@micro_scan.register_fake
def _(x, s, S0, z0):
    return torch.empty_like(x), torch.empty_like(S0), torch.empty_like(z0)


@torch.library.custom_op("zoo::micro_scan_backward", mutates_args=())
def micro_scan_backward(gd: torch.Tensor, gS: torch.Tensor, gz: torch.Tensor, x: torch.Tensor, s: torch.Tensor,
                        S0: torch.Tensor, z0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                    torch.Tensor]:
    gx, gs, gS0, gz0 = load().micro_scan_backward(*_contiguous(gd, gS, gz, x, s, S0, z0))
    return gx, gs, gS0, gz0


@micro_scan_backward.register_fake
def _(gd, gS, gz, x, s, S0, z0):
    return torch.empty_like(x), torch.empty_like(s), torch.empty_like(S0), torch.empty_like(z0)


def _micro_scan_grads(ctx, gd, gS, gz):
    x, s, S0, z0 = ctx.saved_tensors
    return micro_scan_backward(_grad(gd, x), _grad(gS, S0), _grad(gz, z0), x, s, S0, z0)


micro_scan.register_autograd(_micro_scan_grads,
                             setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs))


@torch.library.custom_op("zoo::elita_scan", mutates_args=())
def elita_scan(l: torch.Tensor, r: torch.Tensor, v: torch.Tensor, A0: torch.Tensor, M0: torch.Tensor) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor]:
    """ELiTA's gated running mean (csrc/elita_scan.cpp): history logits l and gate logits r (B, L, H), values
    v (B, L, H, D; float32, bf16 or fp16), the carried A0 (B, H), M0 (B, H, D) -> y (B, L, H, D) in float32,
    and the last A_L, M_L."""
    y, A, M = load().elita_scan_forward(*_contiguous(l, r, v, A0, M0))
    return y, A, M


@elita_scan.register_fake
def _(l, r, v, A0, M0):
    return torch.empty(v.shape, dtype=torch.float32, device=v.device), torch.empty_like(A0), torch.empty_like(M0)


@torch.library.custom_op("zoo::elita_scan_backward", mutates_args=())
def elita_scan_backward(gy: torch.Tensor, gA: torch.Tensor, gM: torch.Tensor, l: torch.Tensor, r: torch.Tensor,
                        v: torch.Tensor, A0: torch.Tensor, M0: torch.Tensor) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gl, gr, gv, gA0, gM0 = load().elita_scan_backward(*_contiguous(gy, gA, gM, l, r, v, A0, M0))
    return gl, gr, gv, gA0, gM0


@elita_scan_backward.register_fake
def _(gy, gA, gM, l, r, v, A0, M0):
    return (torch.empty_like(l), torch.empty_like(r), torch.empty_like(v), torch.empty_like(A0),
            torch.empty_like(M0))


def _elita_scan_grads(ctx, gy, gA, gM):
    l, r, v, A0, M0 = ctx.saved_tensors
    return elita_scan_backward(_grad(gy, v, torch.float32), _grad(gA, A0), _grad(gM, M0), l, r, v, A0, M0)


elita_scan.register_autograd(_elita_scan_grads,
                             setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs))


@torch.library.custom_op("zoo::incontext_bias", mutates_args=())
def incontext_bias(ends: torch.Tensor, starts: torch.Tensor, tables: torch.Tensor, causal: bool) -> torch.Tensor:
    """InContextAttention's position bias (csrc/incontext_bias.cpp): the gate sums at the queries, ends
    (B, H, Lq), and before the keys, starts (B, H, Lk), and the tables (B, H, Lq, P), all float32 ->
    interp(T_i, p_ij) (B, H, Lq, Lk); queries at the end of the keys; causal: -inf at later keys."""
    return load().incontext_bias_forward(*_contiguous(ends, starts, tables), causal)


@incontext_bias.register_fake
def _(ends, starts, tables, causal):
    return tables.new_empty(*ends.shape, starts.shape[-1])


@torch.library.custom_op("zoo::incontext_bias_backward", mutates_args=())
def incontext_bias_backward(grad: torch.Tensor, ends: torch.Tensor, starts: torch.Tensor, tables: torch.Tensor,
                            causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g_ends, g_starts, g_tables = load().incontext_bias_backward(*_contiguous(grad, ends, starts, tables), causal)
    return g_ends, g_starts, g_tables


@incontext_bias_backward.register_fake
def _(grad, ends, starts, tables, causal):
    # contiguous, as the kernel makes them: the layer passes transposed views of the gates and tables
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (ends, starts, tables))


def _incontext_bias_setup(ctx, inputs, output):
    ends, starts, tables, ctx.causal = inputs
    ctx.save_for_backward(ends, starts, tables)


def _incontext_bias_grads(ctx, grad):
    ends, starts, tables = ctx.saved_tensors
    grad = _grad(grad, ends, shape=(*ends.shape, starts.shape[-1]))
    return (*incontext_bias_backward(grad, ends, starts, tables, ctx.causal), None)


incontext_bias.register_autograd(_incontext_bias_grads, setup_context=_incontext_bias_setup)
