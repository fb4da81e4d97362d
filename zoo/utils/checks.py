"""Input validation shared by every attention module, and the argument checkers the model families use too.

Errors name what was expected and what was given, so that a wrong shape fails here
with a readable message instead of deep inside a matmul, and a wrong argument fails
when the layer is built instead of at its first forward pass (or never, as a silently
wrong number).
"""

from __future__ import annotations

import math
import numbers

import torch

MAX_SIZE = 2**31 - 1  # any one size (width, depth, length): products of two stay countable in int64


def shown(value) -> str:
    """`value` as an error message shows it: one short line, whatever it is (a 5000-digit integer has
    no decimal string in Python, a 50 MB string would drown the message).

    Args:
        value: anything a user passed.
    """
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(int(value)).bit_length() > 64:
        return f"an integer of about {int(abs(int(value)).bit_length() * math.log10(2)) + 1} digits"
    try:
        text = repr(value)
    except ValueError:  # a container holding such an integer
        return f"a {type(value).__name__}"
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text):,} characters)"


def integer(value, name: str, owner: str, minimum: int = 1, maximum: int | None = MAX_SIZE) -> int:
    """`value` as an int, if it is an integer (never a bool or a float) in [minimum, maximum]; else a
    TypeError or ValueError naming the argument, the range and the value.

    Args:
        value: the argument as given.
        name: the argument's name, for the message.
        owner: who checks, named first in the message (a class name, or "Class.method").
        minimum: the smallest value accepted (default 1).
        maximum: the largest value accepted (default MAX_SIZE, 2^31 - 1); None: no upper bound.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{owner} {name} must be an integer, got {shown(value)} ({type(value).__name__})")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise ValueError(f"{owner} {name} must be {bound}, got {shown(value)}")
    return int(value)


def number(value, name: str, owner: str, minimum: float = 0.0, maximum: float = math.inf,
           include_minimum: bool = True, include_maximum: bool = True) -> float:
    """`value` as a float, if it is a finite real number (never a bool) within its range; else a TypeError or
    ValueError naming the argument, the range and the value.

    Args:
        value: the argument as given.
        name: the argument's name, for the message.
        owner: who checks, named first in the message (a class name, or "Class.method").
        minimum: the range's lower end (default 0).
        maximum: the range's upper end (default infinity: none).
        include_minimum: whether `minimum` itself is accepted (default True).
        include_maximum: whether `maximum` itself is accepted (default True).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner} {name} must be a number, got {shown(value)} ({type(value).__name__})")
    try:
        as_float = float(value)
    except OverflowError:  # an integer beyond float's range
        as_float = math.inf
    low_ok = as_float >= minimum if include_minimum else as_float > minimum
    high_ok = as_float <= maximum if include_maximum else as_float < maximum
    if not (math.isfinite(as_float) and low_ok and high_ok):
        left, right = "[" if include_minimum else "(", "]" if include_maximum else ")"
        raise ValueError(f"{owner} {name} must be a finite number in {left}{minimum}, {maximum}{right}, "
                         f"got {shown(value)}")
    return as_float


def flag(value, name: str, owner: str) -> bool:
    """A switch must be True or False: a config's "no" or 0 would otherwise be read by its truth value.

    Args:
        value: the argument as given; returned if it is a bool, else a TypeError.
        name: the argument's name, for the message.
        owner: who checks, named first in the message (a class name, or "Class.method").
    """
    if not isinstance(value, bool):
        raise TypeError(f"{owner} {name} must be true or false, got {shown(value)} ({type(value).__name__})")
    return value


def check_data(x, what: str, owner: str) -> torch.Tensor:
    """Require a dense tensor that holds data: not a meta tensor (shapes only) and not a sparse one.

    Args:
        x: the value to check; returned if it passes.
        what: what it is, for the message (e.g. "its input").
        owner: who checks, named first in the message (a class name, or "Class.method").
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{owner} expects {what} as a torch.Tensor, got {type(x).__name__}")
    if x.device.type == "meta":  # (the device, not is_meta: compilers trace with fake tensors, which say "cpu")
        raise ValueError(f"{owner} got {what} on the meta device, which has shapes but no data: "
                         "pass a tensor on a real device (cpu, cuda)")
    if x.layout != torch.strided:
        raise ValueError(f"{owner} expects {what} as a dense tensor, got layout {x.layout}: call .to_dense() first")
    return x


def check_tokens(x: torch.Tensor, dim: int, owner: str) -> None:
    """Require a dense floating-point tensor of shape (batch, length, dim).

    Args:
        x: the tokens to check.
        dim: the token width the layer takes.
        owner: who checks, named first in the message (a class name, or "Class.method").
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{owner} expects a torch.Tensor of shape (batch, length, {dim}), got {type(x).__name__}")
    if x.layout != torch.strided:
        raise ValueError(f"{owner} expects a dense tensor, got layout {x.layout}: call .to_dense() first")
    if x.dim() != 3 or x.shape[-1] != dim:
        raise ValueError(f"{owner} expects input of shape (batch, length, {dim}), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{owner} expects a floating-point input, got dtype {x.dtype}")


def check_padding_mask(mask: torch.Tensor | None, x: torch.Tensor, owner: str) -> torch.Tensor | None:
    """Require a boolean (batch, length) mask, True where the token is real.

    Args:
        mask: the key_padding_mask as given, or None (returned as None).
        x: the tokens (batch, length, dim) it masks; the mask must match their batch, length and device.
        owner: who checks, named first in the message (a class name, or "Class.method").
    """
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{owner} expects key_padding_mask as a boolean torch.Tensor or None, "
                        f"got {type(mask).__name__}")
    expected = tuple(x.shape[:2])
    if mask.shape != expected:
        raise ValueError(
            f"{owner} expects key_padding_mask of shape {expected} (True = real token), got {tuple(mask.shape)}"
        )
    if mask.dtype != torch.bool:
        raise ValueError(f"{owner} expects a boolean key_padding_mask (True = real token), got dtype {mask.dtype}")
    if mask.device != x.device:
        raise ValueError(f"{owner} expects key_padding_mask on the input's device ({x.device}), got {mask.device}")
    return mask


def zero_padding(t: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """t (batch, length, ...) with padded tokens set to zero. Applied to a mechanism's input, it keeps
    whatever a padded token holds (NaN included: 0 * NaN is NaN) out of every real token's output;
    applied to its output, a padded token, and so a row that is all padding, gives zeros.

    Args:
        t: a tensor (batch, length, ...).
        mask: (batch, length) bool, True for real tokens; None returns t unchanged.
    """
    if mask is None:
        return t
    return t.masked_fill(~mask.view(*mask.shape, *[1] * (t.dim() - 2)), 0.0)


def check_heads(dim: int, heads: int, owner: str) -> int:
    """Return the per-head width, or explain why `dim` cannot be split into `heads`.

    Args:
        dim: the token width, an int >= 1.
        heads: the number of heads, an int >= 1 that divides dim.
        owner: who checks, named first in the message (a class name, or "Class.method").
    """
    integer(dim, "dim", owner)
    integer(heads, "heads", owner)
    if dim % heads:
        raise ValueError(f"{owner} needs dim divisible by heads, got dim={dim}, heads={heads}")
    return dim // heads


def check_state(state, expected: type, shapes: dict[str, tuple], dtype: torch.dtype, device: torch.device,
                owner: str) -> None:
    """A decoding state handed to `step` must be the kind the layer returns and fit the new tokens exactly
    (`shapes`: field -> shape, None for a size of any value), on both the compiled and the eager route:
    a state from another batch size or layer width would otherwise be read out of bounds.

    Args:
        state: the state as given; None (a new sequence) always passes.
        expected: the state's class (KVCache, MicroState, ElitaState).
        shapes: each tensor field's expected shape, None for a size of any value.
        dtype: the dtype every tensor field must have.
        device: the device every tensor field must be on.
        owner: who checks, named first in the message (a class name, or "Class.method").
    """
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
