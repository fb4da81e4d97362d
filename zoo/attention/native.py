"""Compiled CPU kernels (csrc/), built on first use by PyTorch's C++ extension loader.

Each kernel is a fast route to numbers that an eager PyTorch path also computes, and
the tests hold the two together; nothing needs the kernels to work. The first build
takes about a minute and needs a C++ compiler and ninja. PyTorch caches the result per
machine and torch version (under TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions),
so later processes only load it. Without a compiler, or with ZOO_NATIVE=0, zoo warns
once and stays on the eager paths. ZOO_NATIVE_SANITIZE=address builds a separate copy
under AddressSanitizer, for `.ci/asan` (run Python with libasan preloaded). `scan` makes
a scan's forward and backward kernels one autograd step.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import warnings
from pathlib import Path
from types import ModuleType

import torch
from torch.autograd.function import once_differentiable

SOURCES = [Path(__file__).parent / "csrc" / name
           for name in ("bindings.cpp", "softmax_one.cpp", "micro_scan.cpp", "elita_scan.cpp")]

# Compile for the vector width PyTorch itself dispatches to on this CPU, so that
# at::vec::Vectorized and its exp are the ones PyTorch's own kernels use.
CAPABILITY_FLAGS = {
    "AVX512": ["-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512",
               "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"],
    "AVX2": ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2", "-mavx2", "-mfma", "-mf16c"],
}

log = logging.getLogger(__name__)


@functools.cache
def load() -> ModuleType | None:
    """The compiled kernels, or None where they cannot be built (zoo then stays eager)."""
    if os.environ.get("ZOO_NATIVE", "1") == "0":
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    # Importing cpp_extension logs a warning about CUDA that means nothing on the CPU.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    from torch.utils import cpp_extension

    log.info("loading zoo's CPU kernels for %s (the first build takes about a minute)", capability)
    # One build folder per installed copy and torch version: two environments sharing
    # the cache would otherwise rebuild over each other at every switch.
    key = hashlib.sha256(f"{SOURCES[0].parent}|{torch.__version__}".encode()).hexdigest()[:8]
    sanitize = os.environ.get("ZOO_NATIVE_SANITIZE", "")
    checked = [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer", "-g"] if sanitize else []
    try:
        return cpp_extension.load(
            name=f"zoo_native_{capability.lower()}_{key}" + (f"_{sanitize}" if sanitize else ""),
            sources=[str(s) for s in SOURCES],
            extra_cflags=["-O3", "-fopenmp", *CAPABILITY_FLAGS.get(capability, []), *checked],
            extra_ldflags=["-fopenmp", *checked],
        )
    except Exception as error:  # no compiler, no ninja, a read-only cache: all mean "stay eager"
        warnings.warn(
            f"zoo could not build its compiled CPU kernels ({type(error).__name__}: {str(error)[:300]}); "
            "softmax_one, causal MicroAttention and ELiTA run on their eager routes (the same numbers, slower). "
            "Install a C++ compiler to get the kernels, or set ZOO_NATIVE=0 to silence this.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def for_tensor(t: torch.Tensor, dtypes: tuple[torch.dtype, ...]) -> ModuleType | None:
    """The kernels, where `t` is a CPU tensor of one of `dtypes` and they could be built; else None."""
    return load() if t.device.type == "cpu" and t.dtype in dtypes else None


class _Scan(torch.autograd.Function):
    """A compiled scan as one autograd step: `<name>_forward(*inputs) -> outputs`, and
    `<name>_backward(*grads of the outputs, *inputs) -> grads of the inputs`."""

    @staticmethod
    def forward(ctx, name, *inputs):
        inputs = [t.contiguous() for t in inputs]
        ctx.name = name
        ctx.save_for_backward(*inputs)
        return tuple(getattr(load(), f"{name}_forward")(*inputs))

    @staticmethod
    @once_differentiable
    def backward(ctx, *grads):
        # autograd hands over zeros, never None, for outputs that were not used
        return None, *getattr(load(), f"{ctx.name}_backward")(*[g.contiguous() for g in grads], *ctx.saved_tensors)


def scan(name: str, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Run the kernel pair `name` (micro_scan, elita_scan) on inputs, differentiably."""
    return _Scan.apply(name, *inputs)
