"""AdamW with linear warmup and cosine decay, and no weight decay where decay does harm."""

from __future__ import annotations

import math

import torch
from torch import nn


def check_hyperparameters(lr, weight_decay, warmup_steps, label_smoothing=0.0) -> None:
    """Refuse, when the task is built (not at the first optimizer step), what AdamW or the loss cannot use."""
    def real(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    if not real(lr) or lr <= 0:
        raise ValueError(f"lr must be a finite number above 0, got {lr!r}")
    if not real(weight_decay) or weight_decay < 0:
        raise ValueError(f"weight_decay must be a finite number of at least 0, got {weight_decay!r}")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be an integer of at least 0, got {warmup_steps!r}")
    if not real(label_smoothing) or not 0 <= label_smoothing < 1:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices only: not norms, biases, embeddings, nor what the model lists in no_weight_decay()."""
    skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    embeddings = {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim < 2 or name in skip or name in embeddings:
            no_decay.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def warmup_cosine(step: int, warmup: int, total: int, min_ratio: float = 0.1) -> float:
    """The learning-rate multiplier: linear from 0 over `warmup` steps, then cosine down to `min_ratio`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def adamw(groups: list[dict], lr: float, betas=(0.9, 0.95)) -> torch.optim.AdamW:
    """AdamW over `groups`, fused where every parameter is a real floating-point tensor on a device with the fused
    kernel (the CPU and CUDA have it): one kernel per parameter in place of a dozen small operations each, the
    same update to rounding, and on gpt-tiny's 0.8M parameters on a CPU about 2x faster: 2 ms of a 50-65 ms
    training step (python bench/nanogpt.py --profile 200). Elsewhere the implementation PyTorch picks. The
    choice is saved with the optimizer's state: a run resumed from a checkpoint of an unfused optimizer goes on
    unfused."""
    groups = [{**g, "params": list(g["params"])} for g in groups]
    fused = all(p.device.type in _fused_devices() and torch.is_floating_point(p) for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused or None)


def _fused_devices() -> tuple[str, ...]:
    """The device types with PyTorch's fused optimizer kernels (its own list, where this PyTorch has one)."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:
        return ("cpu", "cuda")
    return tuple(_get_fused_kernels_supported_devices())


def configure(module, lr: float, weight_decay: float, warmup_steps: int, betas=(0.9, 0.95)):
    """What a LightningModule's configure_optimizers returns, for `module.model`."""
    optimizer = adamw(parameter_groups(module.model, weight_decay), lr, betas)
    total = module.trainer.estimated_stepping_batches
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, min(warmup_steps, total // 2), total)
    )
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
