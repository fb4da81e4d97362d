"""W8A8 fake quantization after training, as Bondarenko et al. 2023 evaluate it.

- Weights: 8 bits, symmetric, one scale per tensor from its largest magnitude (min-max).
- Activations: 8 bits, asymmetric (a scale and an integer zero point) per tensor, static:
  the range is estimated before evaluation over 16 training batches with a running
  min-max, an exponential moving average of each batch's min and max with momentum 0.9
  (Qualcomm's `RunningMinMaxEstimator`, which the paper's code uses). Estimation passes run
  with quantized weights and float activations.
- Where: the inputs and outputs of every linear layer (the patch embedding's convolution
  included), the residual stream into and out of each block and between its two halves
  (the residual sums, which are also the norms' inputs), and every LayerNorm's input and
  output. The classifier or language-model head stays in float, weights and output; in the
  text models the token embedding shares the head's matrix and so stays float too.

"Fake": each quantized tensor is rounded to its 256 levels and mapped back to float, so the
arithmetic is float but every value a W8A8 kernel would see is representable in int8.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable

import torch
from torch import nn

from zoo.models.layers import Block

MOMENTUM = 0.9
CALIBRATION_BATCHES = 16


def fake_quantize_weight(w: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """Symmetric per tensor: scale = max|w| / (2^(bits-1) - 1), integers clamped to [-2^(bits-1), 2^(bits-1) - 1]."""
    qmax = 2 ** (bits - 1) - 1
    scale = w.detach().abs().max() / qmax
    if scale == 0:
        return w.detach().clone()
    return torch.clamp(torch.round(w.detach() / scale), -qmax - 1, qmax) * scale


def fake_quantize_activation(x: torch.Tensor, low: float, high: float, bits: int = 8) -> torch.Tensor:
    """Asymmetric: [low, high], widened to hold 0 exactly, onto the integers 0 .. 2^bits - 1."""
    low, high = min(low, 0.0), max(high, 0.0)
    levels = 2**bits - 1
    scale = (high - low) / levels
    if scale == 0:
        return x
    zero_point = round(-low / scale)
    q = torch.clamp(torch.round(x.float() / scale) + zero_point, 0, levels)
    return ((q - zero_point) * scale).to(x.dtype)


class ActivationQuantizer:
    """One static per-tensor quantizer: estimates its range while `estimating`, else quantizes."""

    def __init__(self, momentum: float = MOMENTUM):
        self.momentum, self.low, self.high, self.estimating = momentum, None, None, True

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_floating_point(x):
            return x
        if self.estimating:
            low, high = float(x.detach().min()), float(x.detach().max())
            if self.low is None:
                self.low, self.high = low, high
            else:
                m = self.momentum
                self.low, self.high = m * self.low + (1 - m) * low, m * self.high + (1 - m) * high
            return x
        if self.low is None:
            raise RuntimeError("an activation quantizer was never calibrated: call W8A8.calibrate first")
        return fake_quantize_activation(x, self.low, self.high)


def _float_heads(model: nn.Module, keep_float: Iterable[str]) -> set[int]:
    """The parameters of the kept-float modules, by id, so that a weight shared with one (tied) stays float."""
    modules = dict(model.named_modules())
    missing = [name for name in keep_float if name not in modules]
    if missing:
        raise ValueError(f"keep_float names modules the model does not have: {missing}")
    return {id(p) for name in keep_float for p in modules[name].parameters()}


class W8A8(nn.Module):
    """A W8A8 fake-quantized copy of `model` (the model itself is not touched).

        quantized = W8A8(model).calibrate(training_batches)   # 16 batches of inputs
        logits = quantized(x)
    """

    def __init__(self, model: nn.Module, keep_float: Iterable[str] = ("head",), momentum: float = MOMENTUM):
        super().__init__()
        self.model = copy.deepcopy(model).float().eval()
        self.calibrated = False  # until calibrate has estimated every range, quantized results would be float ones
        floats = _float_heads(self.model, keep_float)
        self.quantizers: dict[str, ActivationQuantizer] = {}
        with torch.no_grad():
            for name, module in self.model.named_modules():
                if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
                    if id(module.weight) in floats:
                        continue
                    if not torch.isfinite(module.weight).all():
                        raise ValueError(f"W8A8: {name}.weight holds NaN or inf; no int8 scale fits it")
                    module.weight.copy_(fake_quantize_weight(module.weight))
                    self._wrap(name, module, momentum)
                elif isinstance(module, nn.LayerNorm):
                    self._wrap(name, module, momentum)
                elif isinstance(module, Block):
                    self._wrap(name, module, momentum)
                    self._wrap(f"{name}.after_attn", module.after_attn, momentum, inputs=False)

    def _wrap(self, name: str, module: nn.Module, momentum: float, inputs: bool = True) -> None:
        if inputs:
            before = self.quantizers[f"{name}:in"] = ActivationQuantizer(momentum)
            module.register_forward_pre_hook(lambda m, args: (before(args[0]), *args[1:]))
        after = self.quantizers[f"{name}:out"] = ActivationQuantizer(momentum)
        module.register_forward_hook(lambda m, args, out: after(out))

    @torch.no_grad()
    def calibrate(self, batches: Iterable, steps: int = CALIBRATION_BATCHES) -> W8A8:
        """Estimate every activation range over the first `steps` batches (inputs, or (inputs, labels) pairs)."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"calibration steps must be an integer >= 1, got {steps!r}")
        if isinstance(batches, (str, bytes)) or not isinstance(batches, Iterable):
            raise TypeError(f"W8A8.calibrate takes an iterable of input batches (tensors, or (inputs, labels) pairs), "
                            f"got {type(batches).__name__}")
        self.calibrated = False
        for q in self.quantizers.values():
            q.estimating, q.low, q.high = True, None, None
        seen = 0
        for batch in batches:
            if seen == steps:
                break
            inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
            if not isinstance(inputs, torch.Tensor):
                raise TypeError(f"W8A8.calibrate takes batches of input tensors (or (inputs, labels) pairs), got "
                                f"{type(inputs).__name__} in batch {seen}")
            self.model(inputs)
            seen += 1
        if seen < steps:
            raise ValueError(f"calibration needs {steps} batches, the data gave {seen}")
        bad = [name for name, q in self.quantizers.items()
               if q.low is not None and not (math.isfinite(q.low) and math.isfinite(q.high))]
        if bad:
            raise ValueError(f"calibration saw NaN or inf activations at {bad[:3]}"
                             f"{f' and {len(bad) - 3} more' if len(bad) > 3 else ''}: no int8 range fits them")
        for q in self.quantizers.values():
            q.estimating = False
        self.calibrated = True
        return self

    def forward(self, *args, **kwargs):
        if not self.calibrated:
            raise RuntimeError("W8A8 model used before calibration: call calibrate(batches) first (or again, after "
                               "a calibration that failed), or its activations would not be quantized")
        return self.model(*args, **kwargs)
