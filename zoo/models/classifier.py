"""Raw input to prediction for the classifiers: each model carries its own preprocessing."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from zoo.utils.checks import check_data, integer


def _is_pil(inputs) -> bool:
    return type(inputs).__module__.startswith("PIL.")


def _is_item_list(inputs) -> bool:
    """A list (or tuple) holding PIL images, arrays or tensors: a batch, one item each. np.asarray would stack
    three images into one array of three channels; a list of numbers (or of lists of them) stays one array."""
    return isinstance(inputs, (list, tuple)) and any(
        _is_pil(item) or isinstance(item, np.ndarray) or torch.is_tensor(item) for item in inputs)


PIL_16_BIT = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # PIL opens 16-bit PNGs and TIFFs in these modes
PIL_8_BIT = ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "CMYK", "YCbCr", "LAB", "HSV")


def _from_pil(image, channels: int) -> np.ndarray:
    """A PIL image as an array that keeps its bit depth: uint8, 16-bit as uint16 (mode "I" checked
    to fit), or float32 (mode "F"); (H, W) or (C, H, W) with the model's channel count."""
    if image.mode in PIL_16_BIT or image.mode == "F":
        array = np.array(image)
        if image.mode == "I" and array.size and (array.min() < 0 or array.max() > 65535):
            raise ValueError(f"a PIL image of mode 'I' is read as 16-bit pixels (0..65535), got values in "
                             f"[{array.min()}, {array.max()}]")
        if image.mode != "F":
            array = array.astype(np.uint16)
        return array if channels == 1 else np.stack([array] * channels)
    if image.mode not in PIL_8_BIT:
        raise ValueError(f"unsupported PIL image mode {image.mode!r}; expected one of {', '.join(PIL_8_BIT)}, "
                         f"a 16-bit mode ({', '.join(PIL_16_BIT)}) or 'F'")
    array = np.array(image.convert("L" if channels == 1 else "RGB"))
    return np.moveaxis(array, -1, 0) if array.ndim == 3 else array


def to_unit_range(x: torch.Tensor, pixels: bool = True) -> torch.Tensor:
    """Values as float32 by what the dtype says they are, or a ValueError: 8-bit integers (any
    integer dtype holding 0..255) / 255, uint16 / 65535, bool as 0 and 1, and floating point as
    it is, which for `pixels` (images) must lie in [0, 1]. Anything else (negative or larger
    integers, pixels outside [0, 1], NaN or inf) is refused rather than misread. Signals and
    volumes in floating point are real measurements, taken at their value."""
    if x.is_complex():
        raise ValueError(f"expected real-valued pixels, got dtype {x.dtype}")
    if x.dtype == torch.bool:
        return x.float()
    if x.dtype == torch.uint8:  # the common case, with nothing to check
        return x.float() / 255.0
    if x.is_floating_point():
        x = x.float()
        if not bool(torch.isfinite(x).all()):
            raise ValueError("the input holds NaN or infinite values; expected pixels in [0, 1]")
        if pixels and x.numel() and (x.min() < 0 or x.max() > 1):
            raise ValueError(f"floating-point pixels must lie in [0, 1], got values in [{float(x.min()):.4g}, "
                             f"{float(x.max()):.4g}]: divide 8-bit values by 255 and 16-bit values by 65535, or "
                             "pass the integer array itself")
        return x
    if x.dtype == torch.uint16:
        return x.to(torch.int32).float() / 65535.0
    low, high = (int(x.min()), int(x.max())) if x.numel() else (0, 0)
    if low < 0 or high > 255:
        raise ValueError(f"integer pixels are read as 8-bit (0..255) unless their dtype is uint16; got {x.dtype} "
                         f"values in [{low}, {high}]: pass 16-bit images as uint16, or floats in [0, 1]")
    return x.float() / 255.0


class Classifier:
    """For a model with `config` holding mean, std and label_names, and an `input_shape` (C, *size)."""

    input_shape: tuple[int, ...]
    config: dict

    def preprocess(self, inputs) -> torch.Tensor:
        """A PIL image, array or tensor, one item (C, *size) or (*size), or a batch: one array or tensor
        (batch, C, *size), or a list of items (PIL images, arrays or tensors, one item each): the
        normalized batch.

        Values are read by their type (`to_unit_range`): 8-bit and 16-bit integers (PIL's 16-bit
        modes too) are scaled to [0, 1]; floating-point images (PIL mode "F" too) must already lie
        in [0, 1], while signals and volumes are taken at their value; anything else is refused.
        Images (two spatial dimensions) of another size are resized.
        """
        owner = type(self).__name__
        if _is_item_list(inputs):
            batch = []
            for index, item in enumerate(inputs):
                try:
                    x = self.preprocess(item)
                except (TypeError, ValueError) as e:
                    raise type(e)(f"{owner} reads a list as a batch, one item each: item {index}: {e}") from None
                if x.shape[0] != 1:  # a list of batches: refused rather than guessed at
                    raise ValueError(f"{owner} reads a list as a batch, one item each: item {index} holds "
                                     f"{x.shape[0]} (shape {tuple(x.shape)}); pass one batch as one array or "
                                     "tensor, or a list of single items")
                batch.append(x)
            return torch.cat(batch)
        if torch.is_tensor(inputs):
            check_data(inputs, "the input", owner)
        images = len(self.input_shape) == 3 or _is_pil(inputs)  # pixels, which floats must give in [0, 1]
        if _is_pil(inputs):
            inputs = _from_pil(inputs, self.input_shape[0])
        if not torch.is_tensor(inputs):
            try:
                inputs = np.asarray(inputs)
            except ValueError as e:  # ragged nested lists
                raise ValueError(f"{owner} could not read the input as an array: {e}") from None
            if inputs.dtype == object or inputs.dtype.kind not in "biuf":
                raise ValueError(f"{owner} takes numbers (a PIL image, an array or a tensor), got an "
                                 f"array of {inputs.dtype}")
        x = to_unit_range(torch.as_tensor(inputs), pixels=images)
        channels, size = self.input_shape[0], self.input_shape[1:]
        if x.dim() == len(size):
            x = x.unsqueeze(0)
        if x.dim() == len(size) + 1:
            x = x.unsqueeze(0)
        if x.dim() != len(size) + 2 or x.shape[1] != channels:
            raise ValueError(f"{owner} takes inputs of shape {tuple(self.input_shape)} (or a batch of "
                             f"them, or {tuple(size)} with one channel), got {tuple(torch.as_tensor(x).shape)}")
        if 0 in x.shape[2:]:
            raise ValueError(f"{owner} takes inputs of size {tuple(size)}, got an empty one: {tuple(x.shape[2:])}")
        if tuple(x.shape[2:]) != tuple(size):
            if len(size) != 2:
                raise ValueError(f"{owner} takes inputs of size {tuple(size)}, got {tuple(x.shape[2:])}; "
                                 "only images are resized")
            x = F.interpolate(x, size=tuple(size), mode="bilinear", antialias=True, align_corners=False)
        mean = torch.tensor(self.config["mean"]).view(1, -1, *[1] * len(size))
        std = torch.tensor(self.config["std"]).view(1, -1, *[1] * len(size))
        param = next(self.parameters())
        return ((x - mean) / std).to(param.device, param.dtype)

    @torch.no_grad()
    def classify(self, inputs, top_k: int = 1) -> list[tuple[str, float]] | list[list[tuple[str, float]]]:
        """The `top_k` (label, probability) pairs; one list per item for a batch (an array or tensor with a
        batch dimension, or a list of items: PIL images, arrays or tensors)."""
        integer(top_k, "top_k", f"{type(self).__name__}.classify")
        x = self.preprocess(inputs)
        logits = self(x).float()
        if not bool(torch.isfinite(logits).all()):  # softmax would turn them into NaN probabilities, silently
            raise ValueError(f"{type(self).__name__} produced non-finite logits (inf or NaN) from a finite input: "
                             "its weights are likely too large (a diverged or damaged model)")
        probs = logits.softmax(-1)
        values, indices = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
        labels = self.config.get("label_names") or [str(i) for i in range(probs.shape[-1])]
        result = [[(labels[i], round(float(p), 4)) for p, i in zip(v, ix)] for v, ix in zip(values, indices)]
        batched = _is_item_list(inputs) or (not _is_pil(inputs) and np.ndim(inputs) == len(self.input_shape) + 1)
        return result if batched else result[0]
