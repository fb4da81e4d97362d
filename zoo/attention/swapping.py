"""Zoo attention inside anyone's model: `swap(model, mechanism, **options)` replaces its attention modules.

It replaces timm's attention (timm.layers.Attention, EVA's EvaAttention, Swin's WindowAttention), PyTorch's
nn.MultiheadAttention (the attention of nn.TransformerEncoderLayer and nn.TransformerDecoderLayer), zoo's own
token mixers and, to micro, elita, incontext, gla, deltanet or ssd, transformers' self-attention modules
(hf_swap.py), and returns the model. The adapters' state_dict keys are the replaced layers' where a weight is
kept, so the original checkpoint loads into the swapped model. The new layer is called as the old one was: timm's
`attn(x, attn_mask=..., is_causal=...)` goes straight to it (zoo's layers take both), and
nn.MultiheadAttention's signature through MultiheadAdapter.

softmax, quiet, clipped, gated and incontext share q, k, v and the output projection (`qkv`, `proj`, of
the shapes timm's Attention has and nn.MultiheadAttention's in_proj / out_proj hold), so those weights are
kept: swapping to softmax (or to incontext, whose position tables start at zero) leaves the outputs
unchanged. micro and elita have none of them and start from fresh weights. Each swapped module is logged
(zoo.attention.swapping, INFO), the fresh ones in one WARNING.
"""

from __future__ import annotations

import difflib
import logging
import warnings
from pathlib import Path

import torch
from torch import nn

from zoo.attention.clipped import ClippedSoftmaxAttention
from zoo.attention.deltanet import DeltaNetAttention
from zoo.attention.elita import ElitaAttention
from zoo.attention.gated import GatedAttention
from zoo.attention.gla import GatedLinearAttention
from zoo.attention.hf_swap import is_transformers_attention, record_transformers_swap, transformers_replacement
from zoo.attention.incontext import InContextAttention
from zoo.attention.micro import MicroAttention
from zoo.attention.quiet import QuietAttention
from zoo.attention.recurrent import RecurrentAttention
from zoo.attention.softmax import SoftmaxAttention
from zoo.attention.ssd import SSDAttention
from zoo.attention.window import WindowAttention
from zoo.utils.checks import flag, shown

log = logging.getLogger(__name__)

# The token mixers (FusedAttention pools a sequence into one vector, so it replaces no attention layer)
MIXERS: dict[str, type[nn.Module]] = {
    "softmax": SoftmaxAttention,
    "quiet": QuietAttention,
    "clipped": ClippedSoftmaxAttention,
    "gated": GatedAttention,
    "micro": MicroAttention,
    "elita": ElitaAttention,
    "incontext": InContextAttention,
    # the field's yardsticks: sliding-window softmax and three linear-time layers with a matrix memory
    "window": WindowAttention,
    "gla": GatedLinearAttention,
    "deltanet": DeltaNetAttention,
    "ssd": SSDAttention,
}
ZOO_MIXERS = (SoftmaxAttention, MicroAttention, ElitaAttention, InContextAttention, RecurrentAttention)
CAUSAL_ONLY = (ElitaAttention, RecurrentAttention)  # their sums run over the tokens before each one
CROSS = ("softmax", "quiet", "clipped", "gated")  # those that attend to another sequence
QKV_MIXERS = (SoftmaxAttention, InContextAttention)  # those with timm's qkv and proj: their weights carry over


class _OwnKeys(nn.Module):
    """An adapter whose state_dict keys are those of the layer it replaced: the inner zoo layer's keys without
    the adapter's `attn.` (timm's `blocks.0.attn.qkv.weight` stays `blocks.0.attn.qkv.weight`), with
    `renamed` for the parts that had other names there (nn.MultiheadAttention's in_proj_weight). So the
    original checkpoint's kept weights load into the swapped model, and the swapped model's into the original."""

    renamed: dict[str, str] = {}

    def __init__(self):
        super().__init__()
        self.register_state_dict_post_hook(_outer_keys)
        self.register_load_state_dict_pre_hook(_inner_keys)


def _outer_keys(module: _OwnKeys, state: dict, prefix: str, local_metadata) -> None:
    inner = f"{prefix}attn."
    for key in [key for key in state if key.startswith(inner)]:
        rest = key[len(inner):]
        state[prefix + module.renamed.get(rest, rest)] = state.pop(key)


def _inner_keys(module: _OwnKeys, state: dict, prefix: str, local_metadata, strict, missing_keys, unexpected_keys,
                error_msgs) -> None:
    for rest in module.attn.state_dict():  # the zoo layer's own keys ("qkv.weight"), from the model's names
        outer = prefix + module.renamed.get(rest, rest)
        if outer in state:
            state[f"{prefix}attn.{rest}"] = state.pop(outer)


class TimmAttention(_OwnKeys):
    """A zoo layer in the place of timm's attention: timm's calls go through, then timm's proj_drop.

    `forward(x, attn_mask=None, is_causal=False)` takes x (batch, length, dim), as timm's Attention does,
    and returns proj_drop(attn(x, attn_mask=attn_mask, is_causal=is_causal)), (batch, length, dim). EVA's
    `rope` is accepted and not applied (swap refuses an EVA that has one unless strict=False); Swin's window
    `mask` (windows, N, N), additive, becomes a per-window attn_mask. Its state_dict keys are the replaced
    layer's (`blocks.0.attn.qkv.weight`), not the nested zoo layer's.

    Args:
        attn: the zoo token mixer that replaces timm's attention (SoftmaxAttention and its kind,
            MicroAttention or ElitaAttention).
        proj_drop: the replaced layer's dropout after its output projection, kept (an nn.Dropout or
            nn.Identity).
    """

    def __init__(self, attn: nn.Module, proj_drop: nn.Module):
        super().__init__()
        self.attn, self.proj_drop = attn, proj_drop

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False,
                rope: torch.Tensor | None = None, mask: torch.Tensor | None = None):
        if mask is not None:  # Swin's shifted windows: batch-major (b, window), one (N, N) mask per window
            if attn_mask is not None:
                raise ValueError(f"{type(self).__name__} takes Swin's window mask or an attn_mask, not both")
            attn_mask = mask.repeat(x.shape[0] // mask.shape[0], 1, 1)[:, None].to(x.dtype)
        return self.proj_drop(self.attn(x, attn_mask=attn_mask, is_causal=is_causal))


def _real_tokens(key_padding_mask: torch.Tensor, owner: str) -> torch.Tensor:
    """PyTorch's key_padding_mask (bool, True = padding; or float, -inf = padding) as zoo's (True = real)."""
    if key_padding_mask.dtype == torch.bool:
        return ~key_padding_mask
    if key_padding_mask.is_floating_point() and bool(((key_padding_mask == 0) | key_padding_mask.isneginf()).all()):
        return key_padding_mask == 0
    raise ValueError(f"{owner} expects key_padding_mask as bool (True = padding) or float (0 = real, -inf = padding), "
                     f"got dtype {key_padding_mask.dtype} with other values")


class MultiheadAdapter(_OwnKeys):
    """A zoo layer behind nn.MultiheadAttention's calling convention, for PyTorch's Transformer layers.

    `forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False)` returns (output, None): zoo's layers hand out no weights.
    Inputs are (batch, length, dim) with batch_first, else (length, batch, dim); keys and values must be one
    tensor (`key is value`), the query too for self-attention, another one for cross-attention. PyTorch's
    masks are turned into zoo's: key_padding_mask True (or -inf) = padding becomes zoo's True = real token,
    and padded positions then come out zero (real positions are unchanged); a boolean attn_mask True = may
    not attend becomes True = may attend, (batch * heads, L, S) becomes (batch, heads, L, S); and is_causal
    is taken at its word, as nn.MultiheadAttention takes it: the layer attends causally, the mask unread.

    Args:
        attn: the zoo token mixer that replaces nn.MultiheadAttention; its `dim` and `heads` become this
            adapter's `embed_dim` and `num_heads`.
        batch_first: True if inputs are (batch, length, dim), as with nn.MultiheadAttention(batch_first=True);
            default False: (length, batch, dim).

    Its state_dict keys are nn.MultiheadAttention's where a weight is kept (in_proj_weight, in_proj_bias,
    out_proj.weight, out_proj.bias), so checkpoints of the original model load into the swapped one.
    """

    # nn.TransformerEncoderLayer reads these for its fused fast path, which would bypass this module:
    # None (to it, an attention without biases) sends every call through forward.
    in_proj_weight = None
    in_proj_bias = None
    _qkv_same_embed_dim = True
    # nn.MultiheadAttention's names for what zoo's layers call qkv and proj
    renamed = {"qkv.weight": "in_proj_weight", "qkv.bias": "in_proj_bias", "proj.weight": "out_proj.weight",
               "proj.bias": "out_proj.bias"}

    def __init__(self, attn: nn.Module, batch_first: bool = False):
        super().__init__()
        self.attn, self.batch_first = attn, flag(batch_first, "batch_first", type(self).__name__)
        self.embed_dim, self.num_heads = attn.dim, attn.heads

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, None]:
        owner = f"{type(self).__name__}({type(self.attn).__name__})"
        if key is not value:
            raise ValueError(f"{owner} takes keys and values from one tensor (key is value), as zoo's layers "
                             "compute both from the same tokens; got two tensors")
        for name, t in (("query", query), ("key", key)):
            if not isinstance(t, torch.Tensor) or t.dim() != 3:
                layout = "(batch, length, dim)" if self.batch_first else "(length, batch, dim)"
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"{owner} expects a batched {name} {layout}, got {got}")
        context = None if key is query else key
        if not self.batch_first:
            query = query.transpose(0, 1)
            context = None if context is None else context.transpose(0, 1)
        crosses = isinstance(self.attn, SoftmaxAttention) and not isinstance(self.attn, WindowAttention)
        if context is not None and not crosses:
            raise ValueError(f"{owner} cannot attend to another sequence: cross-attention needs softmax, quiet, "
                             "clipped or gated")
        b, lq = query.shape[:2]
        lk = lq if context is None else context.shape[1]
        real = None if key_padding_mask is None else _real_tokens(key_padding_mask, owner)
        if is_causal:
            attn_mask = None  # the hint says attn_mask is the causal mask
        elif attn_mask is not None:
            attn_mask = ~attn_mask if attn_mask.dtype == torch.bool else attn_mask
            if attn_mask.dim() == 3:
                if attn_mask.shape != (b * self.num_heads, lq, lk):
                    raise ValueError(f"{owner} expects a 3-D attn_mask of shape (batch * heads, L, S) = "
                                     f"{(b * self.num_heads, lq, lk)}, got {tuple(attn_mask.shape)}")
                attn_mask = attn_mask.view(b, self.num_heads, lq, lk)
        extra = {} if context is None else {"context": context}
        out = self.attn(query, real, attn_mask=attn_mask, is_causal=is_causal, **extra)
        return (out if self.batch_first else out.transpose(0, 1)), None


def _timm_classes() -> tuple[type, ...]:
    """timm's plain multi-head self-attention classes: ViT's Attention, EVA's EvaAttention, Swin's
    WindowAttention (whose relative position bias zoo's layers have no place for)."""
    from timm.layers import Attention
    from timm.models.eva import EvaAttention
    from timm.models.swin_transformer import WindowAttention

    return Attention, EvaAttention, WindowAttention


def _sources(model: nn.Module) -> list[tuple[list[str], nn.Module]]:
    """The attention modules swap replaces, each with every qualified name it sits at ("" for the model itself):
    a module shared by two layers is one module at two places, and is swapped at both."""
    found: dict[int, tuple[list[str], nn.Module]] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if any(name.startswith(f"{outer}.") or outer == "" for names, _ in found.values() for outer in names):
            continue  # inside one already found (zoo's layer in an adapter is found by itself)
        if type(module) in _timm_classes() or is_transformers_attention(module) \
                or isinstance(module, (nn.MultiheadAttention, *ZOO_MIXERS)):
            found.setdefault(id(module), ([], module))[0].append(name)
    return list(found.values())


def _shape(old: nn.Module, name: str, mechanism: str) -> tuple[dict, tuple | None, list[str], list[str]]:
    """The new layer's arguments taken from the old one, the (qkv weight, qkv bias, proj weight, proj bias)
    to keep or None, notes on what does not carry over by the nature of `mechanism`, and the parts of the old
    layer that zoo's layers have no place for (they would be lost: swap refuses them unless strict=False)."""
    if isinstance(old, ZOO_MIXERS):
        args = {"dim": old.dim, "heads": old.heads, "causal": old.causal}
        if not isinstance(old, QKV_MIXERS):
            return args, None, [f"{type(old).__name__} has no q, k, v"], []
        args.update(bias=old.qkv.bias is not None, dropout=old.dropout)
        if getattr(old, "attn_bias", None) is not None:
            args.update(max_len=old.max_len, learned_bias=True)
        if isinstance(old, SoftmaxAttention) and old.positions is not None:  # rope or alibi: the new layer keeps them
            args.update(positions=old.positions, rope_base=old.rope_base, alibi_bias_max=old.alibi_bias_max)
        notes = ["its gates are dropped"] if isinstance(old, GatedAttention) and mechanism != "gated" else []
        return args, (old.qkv.weight, old.qkv.bias, old.proj.weight, old.proj.bias), notes, []
    if isinstance(old, nn.MultiheadAttention):
        if not old._qkv_same_embed_dim:
            raise ValueError(f"swap: {name or 'the model'} is an nn.MultiheadAttention with kdim={old.kdim}, "
                             f"vdim={old.vdim} other than embed_dim={old.embed_dim}; zoo's layers take keys and "
                             "values of the query's width")
        args = {"dim": old.embed_dim, "heads": old.num_heads, "causal": False,
                "bias": old.in_proj_bias is not None, "dropout": old.dropout}
        lost = ["its bias_k and bias_v (add_bias_kv=True)"] if old.bias_k is not None else []
        if old.add_zero_attn and mechanism != "quiet":  # a key and a value of zeros: exactly quiet attention
            lost.append("its key and value of zeros (add_zero_attn=True, which is quiet attention)")
        return args, (old.in_proj_weight, old.in_proj_bias, old.out_proj.weight, old.out_proj.bias), [], lost
    dim = old.qkv.in_features if getattr(old, "qkv", None) is not None else old.q_proj.in_features  # timm's
    heads = old.num_heads
    if getattr(old, "qkv", None) is not None:
        qkv_weight, qkv_bias = old.qkv.weight, old.qkv.bias
        if getattr(old, "q_bias", None) is not None:  # EVA: the biases beside a bias-free qkv (k's is zero)
            qkv_bias = torch.cat([old.q_bias, old.k_bias, old.v_bias])
    else:  # EVA with qkv_fused=False
        qkv_weight = torch.cat([old.q_proj.weight, old.k_proj.weight, old.v_proj.weight])
        biases = [old.q_proj.bias, old.k_proj.bias, old.v_proj.bias]
        qkv_bias = None if all(b is None for b in biases) else torch.cat(
            [torch.zeros(dim, dtype=qkv_weight.dtype, device=qkv_weight.device) if b is None else b for b in biases])
    if qkv_weight.shape[0] != 3 * dim or old.proj.in_features != dim or old.proj.out_features != dim:
        raise ValueError(f"swap: {name or 'the model'} is a timm {type(old).__name__} of width {dim} with q, k, v "
                         f"{qkv_weight.shape[0]} and proj {old.proj.in_features} -> {old.proj.out_features} wide; "
                         f"zoo's layers need {3 * dim} and {dim} -> {dim}")
    args = {"dim": dim, "heads": heads, "causal": False, "dropout": old.attn_drop.p,
            "bias": qkv_bias is not None or old.proj.bias is not None}
    lost = [f"its {part}" for part in ("q_norm", "k_norm", "norm")
            if getattr(old, part, None) is not None and not isinstance(getattr(old, part), nn.Identity)]
    lost += ["its gate"] if getattr(old, "gate", None) is not None else []
    if hasattr(old, "relative_position_bias_table"):
        if mechanism in ("micro", "elita"):
            raise ValueError(f"swap: {name or 'the model'} is timm's Swin {type(old).__name__}, whose shifted windows "
                             f"need an attention mask that {mechanism} cannot apply; swap gives Swin softmax, quiet, "
                             "clipped, gated or incontext")
        lost.append("its relative position bias")
    return args, (qkv_weight, qkv_bias, old.proj.weight, old.proj.bias), [], lost


def _replacement(old: nn.Module, name: str, mechanism: str, options: dict
                 ) -> tuple[nn.Module, bool, list[str], list[str]]:
    """The module to put in old's place, whether it kept old's weights, notes for the log and what is lost."""
    if is_transformers_attention(old):
        return transformers_replacement(old, name, mechanism, options)
    args, weights, notes, lost = _shape(old, name, mechanism)
    cls = MIXERS[mechanism]
    if not issubclass(cls, QKV_MIXERS):
        args = {key: args[key] for key in ("dim", "heads", "causal")}
    elif cls is InContextAttention:
        if args.pop("learned_bias", False):
            del args["max_len"]
            lost.append("its learned bias (incontext has no learned bias)")
        if args.pop("positions", None) is not None:
            del args["rope_base"], args["alibi_bias_max"]
            notes.append("its rope or alibi positions are dropped (incontext makes its own)")
    args.update(options)
    if issubclass(cls, CAUSAL_ONLY) and args["causal"] is False:
        raise ValueError(f"swap: {mechanism} is causal only and {name or 'the model'} attends both ways; pass "
                         "causal=True to swap it in anyway (each token then sees only those before it)")
    new = cls(**args)
    param = next(old.parameters(), None)
    if param is not None:
        new = new.to(device=param.device, dtype=param.dtype)
    new.train(old.training)
    kept = weights is not None and isinstance(new, QKV_MIXERS)
    if kept:
        qkv_weight, qkv_bias, proj_weight, proj_bias = weights
        with torch.no_grad():
            for linear, weight, bias in ((new.qkv, qkv_weight, qkv_bias), (new.proj, proj_weight, proj_bias)):
                linear.weight.copy_(weight)
                if linear.bias is not None and bias is not None:
                    linear.bias.copy_(bias)
                elif linear.bias is not None:  # a bias the old layer lacked is zero, which it was
                    linear.bias.zero_()
            old_bias = getattr(old, "attn_bias", None)
            new_bias = getattr(new, "attn_bias", None)
            if new_bias is not None and old_bias is not None and old_bias.shape == new_bias.shape:
                new_bias.copy_(old_bias)
        if isinstance(new, GatedAttention) and not isinstance(old, GatedAttention):
            notes.append("its gates are new")
    elif weights is not None:
        notes, lost = [f"{cls.__name__} has no q, k, v"], []  # every weight is fresh: nothing is kept to lose
    if isinstance(old, nn.MultiheadAttention):
        new = MultiheadAdapter(new, old.batch_first)
    elif not isinstance(old, ZOO_MIXERS):
        new = TimmAttention(new, old.proj_drop)
    return new, kept, notes, lost


def swap(model: nn.Module, mechanism: str, strict: bool = True, **options) -> nn.Module:
    """Replace the attention modules of `model` by zoo's `mechanism`, keeping their weights where it can.

    Args:
        model: a module holding timm's attention (timm.layers.Attention as in its ViTs, EVA's EvaAttention,
            Swin's WindowAttention), transformers' self-attention (GPT2Attention, LlamaAttention, MistralAttention,
            Qwen2Attention, ViTAttention, ...; to micro, elita, incontext, gla, deltanet or ssd only, see
            zoo/attention/hf_swap.py),
            nn.MultiheadAttention (as in nn.TransformerEncoder and nn.TransformerDecoder) or zoo token mixers, or
            one of them itself.
        mechanism: softmax, quiet, clipped, gated, micro, elita, incontext, window, gla, deltanet or ssd (window keeps
            q, k, v as the softmax family does; gla, deltanet and ssd start from fresh weights, as micro and elita).
        strict: refuse, naming them, parts of an old layer that zoo's layers have no place for (timm's
            q_norm and k_norm, nn.MultiheadAttention's bias_k and bias_v, its add_zero_attn unless swapped to
            quiet, a learned bias swapped to incontext), which would silently change the outputs (default
            True); False swaps anyway and says what is dropped in a Python warning.
        **options (Any): arguments for the mechanism's class (e.g. alpha for clipped, num_queries for micro,
            causal=True for elita in a bidirectional model); heads, causal, bias and dropout default to the
            old module's.

    Returns:
        The model, changed in place; where the model itself is the attention module, its replacement.
        Every new layer is built before any is put in, so a refusal leaves the model as it was. A module
        shared by several layers is replaced by one new module, shared at the same places. A zoo model
        (anything with `record_swap`, as zoo's families have) records the new mechanism in its config, so
        that save_pretrained writes what the model now is; a transformers model records it in its config
        (zoo_swap), and `load_swapped` loads what its save_pretrained wrote.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"swap expects a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(mechanism, str) or mechanism not in MIXERS:
        close = difflib.get_close_matches(mechanism, list(MIXERS), n=3, cutoff=0.5) if isinstance(mechanism, str) \
            else []
        why = "; fused pools a sequence into one vector and replaces no attention layer" if mechanism == "fused" else ""
        hint = f" (closest: {', '.join(close)})" if close else ""
        raise ValueError(f"swap: unknown attention {shown(mechanism)}{hint}{why}; expected one of {list(MIXERS)}")
    sources = _sources(model)
    if not sources:
        raise ValueError(f"swap found no attention module in {type(model).__name__}: it replaces timm's "
                         "Attention, EvaAttention and Swin's WindowAttention, transformers' self-attention (GPT-2, "
                         "Llama, Mistral, Qwen2, ViT, ...), nn.MultiheadAttention and zoo's token mixers "
                         f"{list(MIXERS)}")
    cross = {f"{name}.multihead_attn".lstrip(".") for name, module in model.named_modules()
             if isinstance(module, nn.TransformerDecoderLayer)}
    strict = flag(strict, "strict", "swap")
    if mechanism not in CROSS and cross & {n for names, _ in sources for n in names}:
        raise ValueError(f"swap: {mechanism} cannot attend to another sequence, and {sorted(cross)[0]} is "
                         "cross-attention; cross-attention needs softmax, quiet, clipped or gated")
    built = [(names, old, *_replacement(old, names[0], mechanism, options)) for names, old in sources]
    if any(getattr(module, "rope", None) is not None for module in model.modules() if type(module).__name__ == "Eva"):
        for entry in built:  # EVA-02's rotary positions come from the model, into each attention's forward
            if type(entry[1]).__name__ == "EvaAttention":
                entry[-1].append("the EVA model's rotary positions (rope)")
    losses = [f"{names[0] or 'the model'}: {', '.join(lost)}" for names, _, _, _, _, lost in built if lost]
    if losses and strict:
        raise ValueError(f"swap to {mechanism} would drop what zoo's layers have no place for, changing the "
                         f"outputs ({'; '.join(losses)}); pass strict=False to swap anyway")
    if losses:
        warnings.warn(f"swap to {mechanism} dropped {'; '.join(losses)}: the outputs change", stacklevel=2)
    fresh, why_fresh = [], ""
    for names, old, new, kept, notes, lost in built:
        for name in names:
            if name == "":
                model = new
            else:
                parent, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent), child, new)
        name = ", ".join(names) or "the model"
        what = "kept q, k, v and the output projection" if kept else "fresh weights"
        log.info("swap: %s: %s -> %s, %s%s", name, type(old).__name__, mechanism, what,
                 "".join(f"; {note}" for note in [*notes, *(f"dropped {part}" for part in lost)]))
        if not kept:
            fresh.append(name)
            why_fresh = notes[0]
    if fresh:
        log.warning("swap: %d attention module(s) start from fresh weights (%s), train before use: %s", len(fresh),
                    why_fresh, ", ".join(fresh))
    for module in model.modules():
        if isinstance(module, nn.TransformerEncoder) and not isinstance(module.layers[0].self_attn,
                                                                         nn.MultiheadAttention):
            # its nested-tensor route hands the layers nested tensors, which only PyTorch's own attention takes
            module.use_nested_tensor = False
    swapped = [name for names, *_ in built for name in names]
    if any(is_transformers_attention(old) for _, old, *_ in built):
        record_transformers_swap(model, swapped, mechanism, options)
    for prefix, module in model.named_modules():
        if callable(getattr(module, "record_swap", None)):  # a zoo model: its config says what it now is
            inside = [name[len(prefix) + 1:] if prefix else name for name in swapped
                      if not prefix or name.startswith(f"{prefix}.")]
            if inside:
                module.record_swap(inside, mechanism, options)
    return model


def load_swapped(model_class, path, **kwargs) -> nn.Module:
    """Load a folder that save_pretrained wrote from a model swapped to micro, elita, incontext, gla, deltanet or ssd.

    The original class builds the model with its original attention implementation and loads the kept weights
    by their own names; swap then puts the recorded mechanism back with the recorded options, and the
    mechanism's own weights are read from the folder's safetensors files. Every weight of the swapped model
    must be found there, or it is an error naming the first ones missing.

    Args:
        model_class: the transformers class to load with (e.g. GPT2LMHeadModel), as for from_pretrained.
        path: the folder save_pretrained wrote.
        **kwargs (Any): passed to model_class.from_pretrained (not attn_implementation: the recorded one is used).

    Returns:
        The swapped model, in evaluation mode as from_pretrained leaves it.
    """
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    record = getattr(config, "zoo_swap", None)
    if not record:
        raise ValueError(f"load_swapped expects a folder saved from a swapped model (config.json with zoo_swap), "
                         f"got {path}: load it with {getattr(model_class, '__name__', model_class)}.from_pretrained")
    config._attn_implementation = record["attn_implementation"]
    config.__dict__.pop("attn_implementation", None)
    model = model_class.from_pretrained(path, config=config, **kwargs)
    model = swap(model, record["mechanism"], strict=False, **record["options"])
    saved = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        saved.update(load_file(str(file)))
    own = model.state_dict()
    missing = [key for key in own if key not in saved and key not in _tied(model)]
    if missing:
        raise ValueError(f"load_swapped: {path} lacks {len(missing)} weight(s) of the swapped model, e.g. "
                         f"{missing[:3]}")
    model.load_state_dict({key: value for key, value in saved.items() if key in own}, strict=False)
    return model.eval()


def _tied(model: nn.Module) -> set[str]:
    """The keys save_pretrained leaves out because they are tied to another weight (lm_head to the embeddings)."""
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return set(tied) if isinstance(tied, dict) else set(tied)
