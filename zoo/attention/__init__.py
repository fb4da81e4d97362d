"""The attention library: five mechanisms, two controls for outliers, the in-context bias and the field's yardsticks
(sliding windows, GLA, DeltaNet, Mamba-2's SSD), behind one calling contract.

Every module takes tokens (batch, length, dim) and an optional boolean
`key_padding_mask` (batch, length), True for real tokens. Token mixers return
(batch, length, dim); FusedAttention pools and returns (batch, dim). Causal token
mixers also decode step by step: `y, state = layer.step(x_new, state)`, starting from
`state=None`, gives the same outputs as the parallel forward.

    >>> layer = zoo.attention.build("micro", dim=256, heads=4, causal=True)
"""

from __future__ import annotations

from torch import nn

from zoo.attention.clipped import ClippedSoftmaxAttention, clipped_softmax
from zoo.attention.deltanet import DeltaNetAttention
from zoo.attention.dot_product import attend
from zoo.attention.elita import ElitaAttention, ElitaState, FeedForward2
from zoo.attention.fused import FusedAttention
from zoo.attention.gated import GatedAttention
from zoo.attention.gla import GatedLinearAttention
from zoo.attention.hf_attention import (
    ATTENTION_FUNCTIONS,
    attention_function,
    register_attention_functions,
    register_if_imported,
)
from zoo.attention.hf_swap import TransformersAttention
from zoo.attention.incontext import InContextAttention, InContextState
from zoo.attention.linear_recurrence import RecurrentState
from zoo.attention.micro import MicroAttention, MicroState
from zoo.attention.quiet import QuietAttention, softmax_one
from zoo.attention.softmax import KVCache, SoftmaxAttention
from zoo.attention.ssd import SSDAttention
from zoo.attention.swapping import MIXERS, MultiheadAdapter, TimmAttention, load_swapped, swap
from zoo.attention.window import WindowAttention, WindowCache
from zoo.utils.checks import shown

# every mechanism by name: the token mixers, and FusedAttention, which pools a sequence into one vector
MECHANISMS: dict[str, type[nn.Module]] = {**MIXERS, "fused": FusedAttention}


# The mechanisms that are softmax attention with a KV cache (and its options: max_len, learned_bias, dropout)
KV_CACHED = tuple(name for name, cls in MECHANISMS.items() if issubclass(cls, SoftmaxAttention))


def build(name: str, dim: int, heads: int = 1, causal: bool = False, **kwargs) -> nn.Module:
    """Build the attention mechanism `name` (one of MECHANISMS); extra kwargs go to its class.

    Args:
        name: the mechanism, one of "softmax", "quiet", "clipped", "gated", "micro", "elita", "incontext", "window",
            "gla", "deltanet", "ssd", "fused" (the keys of MECHANISMS); anything else is a ValueError naming them.
        dim: the token width, an int >= 1 divisible by `heads`; inputs are (batch, length, dim).
        heads: the number of heads, an int >= 1 (default 1).
        causal: True for a decoder layer (each token sees only itself and earlier ones, and `step` decodes
            token by token); default False. "elita", "gla", "deltanet" and "ssd" are causal only and "fused" never is.
        **kwargs (Any): the class's own options, e.g. `num_queries` for micro, `max_len` for elita and the softmax
            family, `alpha` for clipped, `norm` and `fuse` for fused.

    Returns:
        The layer, an nn.Module.

    Example:
        >>> layer = zoo.attention.build("micro", dim=256, heads=4, causal=True)
    """
    if not isinstance(name, str) or name not in MECHANISMS:
        raise ValueError(f"unknown attention {shown(name)}; expected one of {sorted(MECHANISMS)}")
    return MECHANISMS[name](dim, heads=heads, causal=causal, **kwargs)


# attn_implementation="zoo_quiet" at once where transformers is already imported (transformers is never imported
# here: zoo works without it; imported later, zoo's import hook for it or the user calls register_attention_functions)
register_if_imported()

__all__ = [
    "ATTENTION_FUNCTIONS",
    "KV_CACHED",
    "MECHANISMS",
    "ClippedSoftmaxAttention",
    "DeltaNetAttention",
    "GatedAttention",
    "GatedLinearAttention",
    "InContextAttention",
    "InContextState",
    "clipped_softmax",
    "ElitaAttention",
    "ElitaState",
    "FeedForward2",
    "FusedAttention",
    "KVCache",
    "MicroAttention",
    "MicroState",
    "MultiheadAdapter",
    "QuietAttention",
    "RecurrentState",
    "SSDAttention",
    "SoftmaxAttention",
    "TimmAttention",
    "TransformersAttention",
    "WindowAttention",
    "WindowCache",
    "attend",
    "attention_function",
    "build",
    "load_swapped",
    "register_attention_functions",
    "softmax_one",
    "swap",
]
