"""Input validation shared by every attention module.

Errors name what was expected and what was given, so that a wrong shape fails here
with a readable message instead of deep inside a matmul.
"""

from __future__ import annotations

import torch


def check_tokens(x: torch.Tensor, dim: int, owner: str) -> None:
    """Require a floating-point tensor of shape (batch, length, dim)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{owner} expects a torch.Tensor of shape (batch, length, {dim}), got {type(x).__name__}")
    if x.dim() != 3 or x.shape[-1] != dim:
        raise ValueError(f"{owner} expects input of shape (batch, length, {dim}), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{owner} expects a floating-point input, got dtype {x.dtype}")


def check_padding_mask(mask: torch.Tensor | None, x: torch.Tensor, owner: str) -> torch.Tensor | None:
    """Require a boolean (batch, length) mask, True where the token is real."""
    if mask is None:
        return None
    expected = tuple(x.shape[:2])
    if mask.shape != expected:
        raise ValueError(
            f"{owner} expects key_padding_mask of shape {expected} (True = real token), got {tuple(mask.shape)}"
        )
    if mask.dtype != torch.bool:
        raise ValueError(f"{owner} expects a boolean key_padding_mask (True = real token), got dtype {mask.dtype}")
    return mask


def check_heads(dim: int, heads: int, owner: str) -> int:
    """Return the per-head width, or explain why `dim` cannot be split into `heads`."""
    if heads < 1 or dim % heads:
        raise ValueError(f"{owner} needs dim divisible by heads, got dim={dim}, heads={heads}")
    return dim // heads
