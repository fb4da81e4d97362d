"""A text model's decoding as two tensor programs, for torch.export and ONNX: prefill and step.

    prefill(ids)                     -> logits, position, *state
    step(ids, position, *state)      -> logits, position, *state

ids are (batch, length) token ids; position is a 0-d int64 tensor (the number of tokens seen);
state is every block's decoding state as plain tensors, in block order, each block's by its own
attention (a hybrid's blocks differ):
    softmax, quiet, clipped, gated:  keys, values   (batch, heads, tokens seen, head_dim) each: the KV cache
                     (quiet's has one slot more in front: its zero key and value)
    micro:           weighted_sum, score_sum   (batch, heads, head_dim), (batch, heads)
    elita:           log_norm, mean            (batch, heads), (batch, heads, head_dim)
    incontext:       keys, values, starts, total   the KV cache as softmax's; (batch, heads, tokens seen),
                     (batch, heads): the gate sums before each key and of every token seen
A block with a short convolution (TextTransformer's short_conv) has one more tensor first, its
last w - 1 inputs: conv (batch, w - 1, dim).
Both run `TextTransformer.forward_step`, so they compute what `generate` computes. `export`
gives both as torch.export programs; `greedy` decodes with any pair of such callables
(exported programs, ONNX Runtime sessions) exactly as `generate(temperature=0)` does,
window included, with no model code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from zoo.attention import KV_CACHED
from zoo.attention.blocks import BLOCK
from zoo.attention.elita import ElitaState
from zoo.attention.incontext import InContextState
from zoo.attention.micro import MicroState
from zoo.attention.softmax import KVCache
from zoo.models.short_conv import ConvState

STATE_FIELDS = {**{kind: ("keys", "values") for kind in KV_CACHED if kind != "window"},
                "micro": ("weighted_sum", "score_sum"), "elita": ("log_norm", "mean"),
                "incontext": ("keys", "values", "starts", "total")}
STATES = {KVCache: "softmax", MicroState: "micro", ElitaState: "elita", InContextState: "incontext"}


def block_kinds(model) -> list[str]:
    """The attention of each of the model's blocks, in block order (one name repeated, or a hybrid's list)."""
    return list(model.attentions)


def state_names(model) -> list[str]:
    """The names of the state tensors in order, "block{i}.{field}" (e.g. "block0.keys"), for exported inputs.

    Args:
        model: the TextTransformer whose blocks' states are named.
    """
    unexported = sorted({kind for kind in block_kinds(model) if kind not in STATE_FIELDS})
    if unexported:  # their states (a window's cache, a chunked memory) have no exported form yet
        raise ValueError(f"exported decoding takes blocks of {sorted(STATE_FIELDS)}; this model has "
                         f"{', '.join(unexported)}: decode it in PyTorch (model.generate)")
    return [f"block{i}.{f}" for i, (kind, width) in enumerate(zip(block_kinds(model), model.short_convs))
            for f in ("conv",) * bool(width) + STATE_FIELDS[kind]]


def flatten_states(states: list) -> list[torch.Tensor]:
    """Block states as plain tensors in block order: keys, values (KVCache); weighted_sum, score_sum
    (MicroState); log_norm, mean (ElitaState); or keys, values, starts, total (InContextState); a ConvState's
    tail before its attention's.

    Args:
        states: the blocks' states, as `TextTransformer.forward_step` returns them.
    """
    tensors = []
    for s in states:
        if isinstance(s, ConvState):
            tensors.append(s.tail)
            s = s.attention
        # a KVCache's buffers may have room beyond its tokens (decoding grows them by doubling): only its tokens
        tensors += [getattr(s, f)[:, :, :s.length] if isinstance(s, KVCache) and s.filled is not None
                    else getattr(s, f) for f in STATE_FIELDS[_kind(s)]]
    return tensors


def _kind(state) -> str:
    if type(state) not in STATES:
        kinds = ", ".join(c.__name__ for c in STATES)
        raise TypeError(f"flatten_states takes the block states forward_step returns ({kinds}), "
                        f"got {type(state).__name__}")
    return STATES[type(state)]


def unflatten_states(model, position: torch.Tensor, tensors: Sequence[torch.Tensor]) -> list:
    """The blocks' states from the plain tensors `flatten_states` gave, for `forward_step`.

    Args:
        model: the TextTransformer the states belong to; each block's attention says which kind of state.
        position: the number of tokens seen, a 0-d int64 tensor (ElitaState keeps it).
        tensors: each block's tensors, in block order, as `flatten_states` lists them.
    """
    kinds, names = block_kinds(model), state_names(model)
    if len(tensors) != len(names):
        raise ValueError(f"{type(model).__name__}'s {len(kinds)} blocks take {len(names)} state tensors "
                         f"({', '.join(names)}), got {len(tensors)}")
    states, rest = [], list(tensors)
    for kind, width in zip(kinds, model.short_convs):
        tail, rest = (rest[0], rest[1:]) if width else (None, rest)
        fields, rest = rest[:len(STATE_FIELDS[kind])], rest[len(STATE_FIELDS[kind]):]
        if kind in KV_CACHED:
            state = KVCache(*fields)
        elif kind == "micro":
            state = MicroState(*fields)
        elif kind == "elita":
            state = ElitaState(*fields, position)
        else:
            state = InContextState(*fields)
        states.append(state if tail is None else ConvState(tail, state))
    return states


class Prefill(nn.Module):
    """ids (batch, length) -> logits (batch, length, vocab), position, *state.

    Args:
        model: the TextTransformer to run from no state.
    """

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor):
        logits, states = self.model.forward_step(ids)
        position = torch.full((), ids.shape[1], dtype=torch.int64, device=ids.device)
        return logits, position, *flatten_states(states)


class Step(nn.Module):
    """ids (batch, new), position, *state -> logits (batch, new, vocab), position + new, *state.

    Args:
        model: the TextTransformer to continue from a flattened state.
    """

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, position: torch.Tensor, *state: torch.Tensor):
        states = unflatten_states(self.model, position, state)
        logits, states = self.model.forward_step(ids, states, position)
        return logits, position + ids.shape[1], *flatten_states(states)


def example_inputs(model, batch: int = 2, length: int = 8) -> tuple[tuple, tuple]:
    """Inputs of prefill and step (a one-token step after `length` tokens) to trace them with.

    Args:
        model: the TextTransformer to trace.
        batch: the example batch size, an int >= 1 (default 2).
        length: the example prompt's length in tokens, an int >= 1 (default 8).

    Returns:
        (prefill's arguments, step's arguments), each a tuple.
    """
    ids = torch.randint(0, model.vocab_size, (batch, length))
    with torch.no_grad():
        _, position, *state = Prefill(model)(ids)
    return (ids,), (ids[:, -1:], position, *state)


def dynamic_shapes(model, prefill: bool):
    """torch.export's dynamic dimensions: batch and length, and the KV cache's length in a step.

    Args:
        model: the TextTransformer to export.
        prefill: True for Prefill's inputs, False for Step's.
    """
    from torch.export import Dim

    batch = Dim("batch", min=1, max=4096)
    # Learned positions end at context_length. Without them a traced graph takes up to BLOCK tokens
    # at once: micro and elita run longer inputs in BLOCK-token pieces, a loop a graph does not hold.
    learned = model.pos_kind == "learned"
    length = Dim("length", min=1, max=model.context_length if learned else BLOCK)
    if prefill:
        return ({0: batch, 1: length},)
    # the tokens seen; quiet's cache holds 1 more (its zero key), so a hybrid with quiet blocks and other cached
    # ones has two cache lengths
    kinds = block_kinds(model)
    top = model.context_length if learned else 1 << 20
    seen = Dim("cached", min=1, max=top)
    quiet = seen if all(k in ("quiet", "micro", "elita") for k in kinds) else Dim("quiet_cached", min=1, max=top)
    shapes = []
    for kind, width in zip(kinds, model.short_convs):
        cached = quiet if kind == "quiet" else seen
        shapes += [{0: batch}] * bool(width)  # the convolution's tail
        shapes += {"micro": [{0: batch}] * 2, "elita": [{0: batch}] * 2,
                   "incontext": [{0: batch, 2: cached}] * 3 + [{0: batch}]}.get(kind, [{0: batch, 2: cached}] * 2)
    return ({0: batch}, None, tuple(shapes))  # the state: Step.forward's *state


def export(model, eager_routes: bool = False) -> tuple[torch.export.ExportedProgram, torch.export.ExportedProgram]:
    """prefill and step as torch.export programs with dynamic batch, length and cache length.

    eager_routes=True traces the eager routes instead of zoo's kernels (zoo::micro_scan, ...), for
    backends that know only PyTorch's operators; AOTInductor (torch._inductor.aoti_compile_and_package)
    takes either, and bench/deploy.py times it.

    Args:
        model: the TextTransformer to export, in eval mode.
        eager_routes: trace PyTorch's own operators instead of zoo's compiled kernels (default False).

    Returns:
        The (prefill, step) programs.
    """
    import contextlib

    from zoo.attention import native

    state_names(model)  # a block whose state has no exported form (window, gla, deltanet, ssd) refused in one line
    prefill_in, step_in = example_inputs(model)
    with native.eager_routes() if eager_routes else contextlib.nullcontext():
        prefill = torch.export.export(Prefill(model).eval(), prefill_in, dynamic_shapes=dynamic_shapes(model, True))
        step = torch.export.export(Step(model).eval(), step_in, dynamic_shapes=dynamic_shapes(model, False))
    return prefill, step


def greedy(prefill: Callable, step: Callable, ids: torch.Tensor, max_new_tokens: int,
           window: int | None = None) -> torch.Tensor:
    """Greedy decoding with two tensor programs, token for token what `generate(temperature=0)` does:
    past `window` tokens (learned positions), the last `window` are run through prefill again.

    Args:
        prefill: a callable ids -> (logits, position, *state), e.g. an exported Prefill or an ONNX session's.
        step: a callable (ids, position, *state) -> (logits, position, *state), e.g. an exported Step.
        ids: the prompt, token ids (batch, length).
        max_new_tokens: how many tokens to add, an int in [0, 1000000].
        window: the model's context_length where its positions are learned, else None (default): no window.

    Returns:
        The prompt and its continuation, ids (batch, length + max_new_tokens).
    """
    from zoo.models.arguments import integer
    from zoo.models.text_transformer import MAX_NEW_TOKENS

    integer(max_new_tokens, "max_new_tokens", "greedy", 0, MAX_NEW_TOKENS)
    out = ids
    logits, position, *state = prefill(ids[:, -window:] if window else ids)
    for _ in range(max_new_tokens):
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        out = torch.cat([out, nxt], dim=1)
        if window and int(position) >= window:
            logits, position, *state = prefill(out[:, -window:])
        else:
            logits, position, *state = step(nxt, position, *state)
    return out
