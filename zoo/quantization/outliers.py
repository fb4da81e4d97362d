"""Outlier statistics of a model's activations: Pearson kurtosis and max |x|, per layer.

As Bondarenko et al. 2023 measure them: for each input (an image, or a sequence), the
kurtosis of all the values a layer puts out for it, mean((x - mu)^4) / std^4 (Pearson's,
not the excess: a Gaussian gives 3, a tensor with a few huge values gives hundreds), and its
largest magnitude. Both are averaged over the inputs seen; a model is summed up by the mean
kurtosis over its layers and the largest max |x| of any layer.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn


def _max(a: float, b: float) -> float:
    """max that keeps a NaN (Python's max drops it or not by argument order): a NaN activation is news."""
    return a if math.isnan(a) else b if math.isnan(b) else max(a, b)


def pearson_kurtosis(x: torch.Tensor) -> torch.Tensor:
    """mean((x - mu)^4) / var^2 over everything but the first (batch) dimension, one value per input.

    Computed in float64; a constant input (zero variance) gives NaN, as the formula does.
    """
    x = x.detach().flatten(1).double()
    centered = x - x.mean(1, keepdim=True)
    return centered.pow(4).mean(1) / centered.pow(2).mean(1).pow(2)


def watched_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The layers the study watches: each block's output, its attention's output and its MLP's output."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, (nn.ModuleList, nn.Sequential)):
        raise TypeError(f"watched_layers needs a model with transformer blocks (model.blocks), got "
                        f"{type(model).__name__}")
    layers = {}
    for i, block in enumerate(blocks):
        layers[f"blocks.{i}.attn"] = block.attn
        layers[f"blocks.{i}.mlp"] = block.mlp
        layers[f"blocks.{i}"] = block
    return layers


class ActivationStats:
    """Within `with ActivationStats(model) as stats:`, every forward pass adds to each watched layer's figures.

    `stats.summary()` gives, per layer, the kurtosis averaged over the inputs and the largest
    max |x|, and over the model the mean kurtosis over layers and the largest max |x|.
    Outputs are not changed. Inputs are the first dimension of each output (batch-first models).
    """

    def __init__(self, model: nn.Module, layers: dict[str, nn.Module] | None = None):
        self.layers = watched_layers(model) if layers is None else layers
        self.kurtosis_sum = dict.fromkeys(self.layers, 0.0)
        self.max_abs = dict.fromkeys(self.layers, 0.0)
        self.count = dict.fromkeys(self.layers, 0)
        self.handles = []

    def _hook(self, name: str):
        def record(module, args, output):
            out = output[0] if isinstance(output, tuple) else output
            kurtosis = pearson_kurtosis(out)
            self.kurtosis_sum[name] += float(kurtosis.sum())
            self.count[name] += kurtosis.numel()
            self.max_abs[name] = _max(self.max_abs[name], float(out.detach().abs().max()))
        return record

    def __enter__(self) -> ActivationStats:
        self.handles = [module.register_forward_hook(self._hook(name)) for name, module in self.layers.items()]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def summary(self) -> dict:
        seen = [name for name in self.layers if self.count[name]]
        if not seen:
            raise RuntimeError("ActivationStats saw no forward pass: run the model inside the `with` block")
        layers = {name: {"kurtosis": self.kurtosis_sum[name] / self.count[name], "max_abs": self.max_abs[name]}
                  for name in seen}
        return {"kurtosis": sum(v["kurtosis"] for v in layers.values()) / len(layers),
                "max_abs": functools.reduce(_max, (v["max_abs"] for v in layers.values())),
                "inputs": self.count[seen[0]], "layers": layers}
