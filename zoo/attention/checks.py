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


def zero_padding(t: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """t (batch, length, ...) with padded tokens set to zero. Applied to a mechanism's input, it keeps
    whatever a padded token holds (NaN included: 0 * NaN is NaN) out of every real token's output;
    applied to its output, a padded token, and so a row that is all padding, gives zeros."""
    if mask is None:
        return t
    return t.masked_fill(~mask.view(*mask.shape, *[1] * (t.dim() - 2)), 0.0)


def check_heads(dim: int, heads: int, owner: str) -> int:
    """Return the per-head width, or explain why `dim` cannot be split into `heads`."""
    if heads < 1 or dim % heads:
        raise ValueError(f"{owner} needs dim divisible by heads, got dim={dim}, heads={heads}")
    return dim // heads


def check_state(state, expected: type, shapes: dict[str, tuple], dtype: torch.dtype, device: torch.device,
                owner: str) -> None:
    """A decoding state handed to `step` must be the kind the layer returns and fit the new tokens exactly
    (`shapes`: field -> shape, None for a size of any value), on both the compiled and the eager route:
    a state from another batch size or layer width would otherwise be read out of bounds."""
    if state is None:
        return
    if not isinstance(state, expected):
        raise TypeError(f"{owner}.step expects state=None or the {expected.__name__} it returned, "
                        f"got {type(state).__name__}")
    for name, shape in shapes.items():  # `step` runs once a token: the passing path stays a few comparisons
        t = getattr(state, name)
        if isinstance(t, torch.Tensor) and t.dtype == dtype and t.device == device and (
                t.shape == shape or t.dim() == len(shape) and all(n in (None, m) for n, m in zip(shape, t.shape))):
            continue
        shown = tuple("any" if n is None else n for n in shape)
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{owner} state.{name} must be a torch.Tensor of shape {shown}, got {type(t).__name__}")
        if t.dim() != len(shape) or any(n is not None and n != m for n, m in zip(shape, t.shape)):
            raise ValueError(f"{owner} state.{name} must have shape {shown} for these tokens, got "
                             f"{tuple(t.shape)}: pass the state this layer returned for the same batch")
        if t.dtype != dtype:
            raise ValueError(f"{owner} state.{name} must be {dtype} for {owner}'s input, got {t.dtype}")
        raise ValueError(f"{owner} state.{name} must be on {device}, got {t.device}")
