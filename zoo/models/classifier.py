"""Raw input to prediction for the classifiers: each model carries its own preprocessing."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def _is_pil(inputs) -> bool:
    return type(inputs).__module__.startswith("PIL.")


class Classifier:
    """For a model with `config` holding mean, std and label_names, and an `input_shape` (C, *size)."""

    input_shape: tuple[int, ...]
    config: dict

    def preprocess(self, inputs) -> torch.Tensor:
        """A PIL image, array or tensor, one item (C, *size) or (*size), or a batch: the normalized batch.

        Integer inputs are read as 0..255 pixels; float inputs as already in 0..1.
        Images (two spatial dimensions) of another size are resized.
        """
        if _is_pil(inputs):
            inputs = np.array(inputs.convert("L" if self.input_shape[0] == 1 else "RGB"))
            inputs = np.moveaxis(inputs, -1, 0) if inputs.ndim == 3 else inputs
        x = inputs if torch.is_tensor(inputs) else torch.from_numpy(np.array(inputs))
        x = x.float() / 255.0 if not x.is_floating_point() else x.float()
        channels, size = self.input_shape[0], self.input_shape[1:]
        if x.dim() == len(size):
            x = x.unsqueeze(0)
        if x.dim() == len(size) + 1:
            x = x.unsqueeze(0)
        if x.dim() != len(size) + 2 or x.shape[1] != channels:
            raise ValueError(f"{type(self).__name__} takes inputs of shape {tuple(self.input_shape)} (or a batch of "
                             f"them, or {tuple(size)} with one channel), got {tuple(torch.as_tensor(x).shape)}")
        if tuple(x.shape[2:]) != tuple(size):
            if len(size) != 2:
                raise ValueError(f"{type(self).__name__} takes inputs of size {tuple(size)}, got {tuple(x.shape[2:])}; "
                                 "only images are resized")
            x = F.interpolate(x, size=tuple(size), mode="bilinear", antialias=True, align_corners=False)
        mean = torch.tensor(self.config["mean"]).view(1, -1, *[1] * len(size))
        std = torch.tensor(self.config["std"]).view(1, -1, *[1] * len(size))
        param = next(self.parameters())
        return ((x - mean) / std).to(param.device, param.dtype)

    @torch.no_grad()
    def classify(self, inputs, top_k: int = 1) -> list[tuple[str, float]] | list[list[tuple[str, float]]]:
        """The `top_k` (label, probability) pairs; one list per item for a batch."""
        x = self.preprocess(inputs)
        probs = self(x).float().softmax(-1)
        values, indices = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
        labels = self.config.get("label_names") or [str(i) for i in range(probs.shape[-1])]
        result = [[(labels[i], round(float(p), 4)) for p, i in zip(v, ix)] for v, ix in zip(values, indices)]
        batched = not _is_pil(inputs) and np.ndim(inputs) == len(self.input_shape) + 1
        return result if batched else result[0]
