"""`precision: auto`: bf16 mixed precision where this machine multiplies bf16 matrices faster than float32.

Whether bf16 pays depends on the machine, not on the model. On a CPU with AMX a bf16
matrix product runs several times faster than a float32 one, and bf16 autocast trains
the tiny models 1.3-2.6x faster; on one without AMX (avx512_bf16 only) it runs at about
half the float32 rate, and every recipe trains slower in bf16. The CPU flags say which
instructions exist, not how fast they are, so the choice is made by a measurement (well
under a second where bf16 is fast, one 2 s product where it is slow) and the flags are only
reported beside it.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Literal

import lightning as L
import torch
from lightning.fabric.connector import _PRECISION_INPUT
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.plugins import _PLUGIN_INPUT

from zoo.training.checkpoint_io import SafeCheckpointIO
from zoo.training.progress import with_progress_bar
from zoo.training.resume import ResumeMidEpoch

log = logging.getLogger(__name__)

# bf16 must beat float32 by this factor on a bare matrix product: autocast adds casts
# around every product, which a marginal gain does not pay for.
MIN_SPEEDUP = 1.5
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8")


@dataclass(frozen=True)
class Choice:
    precision: str  # what Lightning's Trainer gets: "bf16-mixed" or "32-true"
    reason: str  # one line for the log and the model card


def cpu_flags() -> list[str]:
    """The flags of /proc/cpuinfo that decide which kernels are fast (empty where there is none, e.g. macOS)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    present = set(line.split(":", 1)[1].split())
                    return [flag for flag in FLAGS if flag in present]
    except OSError:
        pass
    return []


def matmul_rate(dtype: torch.dtype, size: int = 1024, repeats: int = 3, budget: float = 0.5) -> float:
    """GFLOP/s of a size x size matrix product in `dtype` on the CPU: the best of `repeats` timed products,
    fewer once `budget` seconds have gone. Where bf16 has no fast kernel (no AVX-512) one product runs at
    ~1 GFLOP/s and takes 2 s; four of them would delay every `precision: auto` fit by 9 s."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    seconds = []
    for _ in range(1 + repeats):  # the first warms up: picks kernels and faults in buffers
        start = time.perf_counter()
        torch.mm(a, b)
        seconds.append(time.perf_counter() - start)
        if sum(seconds) > budget:
            break
    # a warm-up over the budget is the measurement: the costs it absorbs are milliseconds
    best = min(seconds[1:] or seconds)
    return 2 * size**3 / best / 1e9


@functools.cache
def choose(accelerator: str = "cpu") -> Choice:
    """The precision for training on `accelerator` ("cpu", "gpu"/"cuda", "auto"), and why."""
    if accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available():
        if torch.cuda.is_bf16_supported():
            return Choice("bf16-mixed", f"{torch.cuda.get_device_name()} supports bf16")
        return Choice("32-true", f"{torch.cuda.get_device_name()} has no bf16 support")
    if accelerator not in ("cpu", "auto"):
        return Choice("32-true", f"no measurement for accelerator {accelerator!r}: float32")
    fp32, bf16 = matmul_rate(torch.float32), matmul_rate(torch.bfloat16)
    flags = " ".join(cpu_flags()) or "none of " + " ".join(FLAGS)
    speedup = bf16 / fp32
    precision = "bf16-mixed" if speedup >= MIN_SPEEDUP else "32-true"
    threads = torch.get_num_threads()
    return Choice(precision, f"a bf16 matrix product ran {speedup:.2f}x the float32 rate here "
                             f"({bf16:.0f} against {fp32:.0f} GFLOP/s, {threads} thread{'s' * (threads != 1)}; "
                             f"bf16-mixed from {MIN_SPEEDUP}x; CPU flags: {flags})")


def resolve(precision, accelerator: str = "cpu") -> tuple[object, str | None]:
    """`precision` as Lightning takes it, and why: "auto" becomes the measured choice; the rest pass as given."""
    if precision != "auto":
        return precision, None
    choice = choose(str(accelerator))
    log.warning("precision auto -> %s: %s", choice.precision, choice.reason)
    return choice.precision, f"auto: {choice.reason}"


class Trainer(L.Trainer):
    """Lightning's Trainer that also takes `precision="auto"` (the recipes' setting): see `choose`.

    Its progress bar redraws by the clock (TimedProgressBar) unless a bar is given or turned off.
    `precision_reason` keeps why auto chose what it did (None when the precision was given),
    for the model card. Checkpoints (`ckpt_path`: a file, "last", "best") are read weights-only
    and never from a URL (`zoo.training.checkpoint_io`), unless a CheckpointIO plugin is given.
    """

    def __init__(self, *args, precision: _PRECISION_INPUT | Literal["auto"] | None = None,
                 plugins: _PLUGIN_INPUT | list[_PLUGIN_INPUT] | None = None, **kwargs):
        precision, self.precision_reason = resolve(precision, kwargs.get("accelerator", "auto"))
        plugins = list(plugins) if isinstance(plugins, (list, tuple)) else [] if plugins is None else [plugins]
        if not any(isinstance(p, CheckpointIO) for p in plugins):
            plugins.append(SafeCheckpointIO())
        # a bar redrawn by the clock, not at every step (zoo/training/progress.py)
        kwargs["callbacks"] = with_progress_bar(kwargs.get("callbacks"), kwargs.get("enable_progress_bar"))
        # a run resumed mid-epoch goes on with the batches it had not trained on (zoo/training/resume.py)
        kwargs["callbacks"].append(ResumeMidEpoch())
        super().__init__(*args, precision=precision, plugins=plugins, **kwargs)
