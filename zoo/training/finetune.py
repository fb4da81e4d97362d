"""Fine-tuning options of the tasks: freezing the first blocks, and layer-wise learning-rate decay.

Both group the parameters as timm does, by the model's `group_matcher` (the embedding is layer 0,
block i is layer i + 1, the final norm goes with the last block, the head comes last), and the
decay is timm's `param_groups_layer_decay`: layer l of L trains at lr * layer_decay ** (L - l).
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

from zoo.training import optim

log = logging.getLogger(__name__)


def check_finetune(layer_decay, freeze_blocks) -> None:
    """Refuse, when the task is built, what the optimizer could not use."""
    if layer_decay is not None and (isinstance(layer_decay, bool) or not isinstance(layer_decay, (int, float))
                                    or not math.isfinite(layer_decay) or not 0 < layer_decay <= 1):
        raise ValueError(f"layer_decay must be a number in (0, 1] (each layer's learning rate is that of the layer "
                         f"above times layer_decay), or None for none, got {layer_decay!r}")
    if isinstance(freeze_blocks, bool) or not isinstance(freeze_blocks, int) or freeze_blocks < 0:
        raise ValueError(f"freeze_blocks must be an integer of at least 0 (the embedding and that many first blocks "
                         f"are frozen), got {freeze_blocks!r}")


def layer_ids(model: nn.Module) -> dict[str, int]:
    """Parameter name -> layer, by the model's group_matcher, as timm's layer decay groups them."""
    from timm.models import group_parameters

    return group_parameters(model, model.group_matcher(coarse=False), reverse=True)


def freeze(model: nn.Module, blocks: int) -> None:
    """Freeze the embedding and the first `blocks` blocks (their parameters take no gradient)."""
    if not blocks:
        return
    depth = len(model.blocks)
    if blocks > depth:
        raise ValueError(f"freeze_blocks={blocks}, but {type(model).__name__} has {depth} blocks: at most {depth}")
    frozen = [name for name, layer in layer_ids(model).items() if layer <= blocks]
    for name, p in model.named_parameters():
        if name in frozen:
            p.requires_grad_(False)
    tied = " (the output layer, tied to the token embedding, with it)" if hasattr(model, "tok_embed") else ""
    log.warning("freeze_blocks=%d: the embedding and blocks 0 to %d are frozen%s; %d of %d parameters train",
                blocks, blocks - 1, tied, sum(p.numel() for p in model.parameters() if p.requires_grad),
                sum(p.numel() for p in model.parameters()))


def layer_decay_groups(model: nn.Module, lr: float, weight_decay: float, layer_decay: float) -> list[dict]:
    """timm's layer-decay parameter groups, each with its own lr; weight decay spares what zoo's own groups spare
    (norms, biases, embeddings, the model's no_weight_decay())."""
    from timm.optim import param_groups_layer_decay

    skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    skip |= {f"{name}.weight" for name, m in model.named_modules() if isinstance(m, nn.Embedding)}
    groups = param_groups_layer_decay(model, weight_decay, no_weight_decay_list=sorted(skip),
                                      layer_decay=layer_decay)
    for group in groups:
        group["lr"] = lr * group["lr_scale"]  # torch's optimizers read "lr"; timm's schedulers read the scale
    return groups


def configure(module, lr: float, weight_decay: float, warmup_steps: int, layer_decay: float | None,
              betas=(0.9, 0.95)):
    """optim.configure, with layer-wise learning-rate decay when layer_decay is set."""
    if layer_decay is None:
        return optim.configure(module, lr, weight_decay, warmup_steps, betas)
    groups = layer_decay_groups(module.model, lr, weight_decay, layer_decay)
    optimizer = optim.adamw(groups, lr, betas)
    total = module.trainer.estimated_stepping_batches
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: optim.warmup_cosine(step, min(warmup_steps, total // 2), total)
    )
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
