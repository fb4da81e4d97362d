"""Checks of the families' constructor arguments, and the parameter budget, both before anything is allocated.

Configs come from JSON files, recipes and command lines. A size given as 1e9 (a float),
a negative depth or a width in the billions is refused here with the argument's name and
the accepted range, instead of being found by the allocator when the machine runs out of
memory; likewise values that would build a model giving silently wrong numbers (a switch
given as "no", a std that is 0 in float32, an MLP with no hidden unit). The budget is
counted exactly by building the model on PyTorch's meta device, where parameters have
shapes but no storage.
"""

from __future__ import annotations

import os

import torch

# The checkers live in the lowest layer, which checks its own arguments with them; the families import them here.
from zoo.utils.checks import MAX_SIZE, flag, integer, number, shown  # noqa: F401

MAX_PARAMETERS = 10**9  # 4 GB of float32 weights; raise with max_parameters= or $ZOO_MAX_PARAMETERS
# Normalization constants: (x - mean) / std of inputs in [0, 1] must stay a finite float32 that is not
# all zeros (std 1e-300 is 0 in float32, 1e300 is inf; mean 1e300 is inf), so both are bounded.
MAX_MEAN = 1e6
STD_RANGE = (1e-12, 1e12)


def transformer_sizes(owner: str, embed_dim, depth, num_heads, mlp_ratio, drop_rate) -> tuple:
    """The arguments every family shares, checked: (embed_dim, depth, num_heads, mlp_ratio, drop_rate)."""
    embed_dim = integer(embed_dim, "embed_dim", owner)
    mlp_ratio = number(mlp_ratio, "mlp_ratio", owner, include_minimum=False, maximum=1024.0)
    if int(embed_dim * mlp_ratio) < 1:  # the MLP's hidden width (layers.Mlp): 0 would make empty weights
        raise ValueError(f"{owner} mlp_ratio must give the MLP at least one hidden unit (embed_dim * mlp_ratio >= 1), "
                         f"got embed_dim={embed_dim}, mlp_ratio={mlp_ratio}")
    return (embed_dim, integer(depth, "depth", owner, 0), integer(num_heads, "num_heads", owner), mlp_ratio,
            number(drop_rate, "drop_rate", owner, maximum=1.0, include_maximum=False))


def channel_stats(values, name: str, owner: str, channels: int, positive: bool = False) -> list[float]:
    """mean or std: one number per input channel, or one for all, within MAX_MEAN or STD_RANGE."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise TypeError(f"{owner} {name} must be a list of {channels} number(s), got {shown(values)}")
    if len(values) not in (1, channels):
        raise ValueError(f"{owner} {name} must have one value per input channel ({channels}) or one for all, "
                         f"got {len(values)}")
    low, high = STD_RANGE if positive else (-MAX_MEAN, MAX_MEAN)
    return [number(v, name, owner, low, high) for v in values]


def classifier_arguments(owner: str, in_chans: int, num_classes: int, drop_path_rate, mean, std,
                         names) -> tuple[float, list[float], list[float], list[str] | None]:
    """What both image families take beside their sizes, checked: (drop_path_rate, mean, std, label_names)."""
    return (number(drop_path_rate, "drop_path_rate", owner, maximum=1.0, include_maximum=False),
            channel_stats(mean, "mean", owner, in_chans), channel_stats(std, "std", owner, in_chans, positive=True),
            label_names(names, num_classes, owner))


def label_names(names, num_classes: int, owner: str) -> list[str] | None:
    if names is None:
        return None
    if isinstance(names, (str, bytes)) or not isinstance(names, (list, tuple)):
        raise TypeError(f"{owner} label_names must be a list of {num_classes} strings or None, got {shown(names)}")
    if len(names) != num_classes or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{owner} label_names must be {num_classes} strings (one per class), got {len(names)} "
                         f"item(s): {shown(list(names)[:5])}")
    return list(names)


# the arguments that may list one value per block (a depth-0 or depth-1 model cannot take a list for four)
PER_BLOCK = ("attention", "mlp", "attention_options", "short_conv")


def parameter_count(cls: type, args: dict) -> int:
    """The parameters `cls(**args)` would have, counted on the meta device (nothing allocated).

    Blocks are alike, so a deep model is counted from depth 0 and depth 1 rather than built; one with a list of
    attentions, mlps, attention_options or short_conv widths (blocks that differ) is built whole on the meta device.
    """
    def count(**changes) -> int:
        try:
            with torch.device("meta"):
                return sum(p.numel() for p in cls(**{**args, **changes}).parameters())
        except (RuntimeError, OverflowError) as error:  # a size whose product overflows int64
            raise ValueError(f"{cls.__name__}'s sizes are too large to allocate: {error}") from None

    depth = args.get("depth")
    per_block = any(isinstance(args.get(key), (list, tuple)) for key in PER_BLOCK)
    if not isinstance(depth, int) or isinstance(depth, bool) or depth <= 1 or per_block:  # a hybrid's blocks differ
        return count()
    base = count(depth=0)
    return base + depth * (count(depth=1) - base)


def check_budget(cls: type, args: dict, max_parameters: int | None = None) -> int:
    """Refuse a configuration whose model exceeds the parameter limit; returns its parameter count."""
    limit = max_parameters if max_parameters is not None else int(
        float(os.environ.get("ZOO_MAX_PARAMETERS", MAX_PARAMETERS)))
    count = parameter_count(cls, args)
    if count > limit:
        raise ValueError(f"{cls.__name__} with these arguments would have {count:,} parameters, more than the "
                         f"limit of {limit:,}: pass max_parameters=... (or set ZOO_MAX_PARAMETERS) to allow it")
    return count
