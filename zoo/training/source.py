"""Where a task's model comes from: a registered architecture (random weights) or a checkpoint to start from.

A checkpoint is a shipped tag (`micro-vit-tiny.mnist`), a release folder or `hf-hub:org/repo[@revision]`.
Starting from one, the overrides that change an input or a head adapt its weights as timm adapts a
pretrained model: a new classifier starts afresh, the patch embedding's channels are summed (to one)
or repeated and rescaled (to several) as by timm's `adapt_input_conv`, a learned position table is
resampled to another image size; a new tokenizer gives a fresh token embedding. Each adaptation is
one warning in the log. Any other change to the shape of a weight is refused, naming it.
"""

from __future__ import annotations

import inspect
import logging

import torch
from torch import nn

from zoo.models.pretrained import is_checkpoint, load, looks_like_path, read_folder_config, source_folder

log = logging.getLogger(__name__)

def check_model_source(source: str) -> None:
    """Refuse, in one line and before anything is built or downloaded, a model name that names nothing."""
    from zoo.models.registry import entry

    if not is_checkpoint(source):
        try:
            entry(source)
        except ValueError as error:
            raise ValueError(f"{error} A model may also be a checkpoint to start from: a shipped name.tag, a "
                             "release folder or hf-hub:org/repo") from None
    elif source.startswith("hf-hub:"):
        from zoo.models.hub import parse_source

        parse_source(source)  # downloaded when the task is built, not here
    else:
        if not looks_like_path(source):
            entry(source.partition(".")[0])
        read_folder_config(source_folder(source))


def source_family(source: str) -> str:
    """The family ("image", "fused", "text") of a registered model or of a checkpoint's architecture."""
    from zoo.models.registry import _entries, entry

    if not is_checkpoint(source):
        return entry(source).family
    cls = read_folder_config(source_folder(source))["class"]
    return next(e.family for e in _entries().values() if e.cls.__name__ == cls)


def model_from_config(config: dict) -> nn.Module:
    """A task's saved model (`{"class", "args", "model_name"}`), with random weights: a Lightning checkpoint's
    state dict fills them, so the checkpoint the run started from is not needed again."""
    from zoo.models.registry import ARCHITECTURES, _entries, build

    _entries()
    if not isinstance(config, dict) or config.get("class") not in ARCHITECTURES or not isinstance(
            config.get("args"), dict):
        raise ValueError(f"model_config must be a task's saved model ({{'class': one of {sorted(ARCHITECTURES)}, "
                         f"'args': {{...}}}}), got {str(config)[:120]}")
    model = build(ARCHITECTURES[config["class"]], config["args"])
    model.model_name = config.get("model_name")
    model.base_model = config.get("base_model")
    return model


def saved_config(model: nn.Module) -> dict:
    return {"class": type(model).__name__, "args": model.config, "model_name": getattr(model, "model_name", None),
            "base_model": getattr(model, "base_model", None)}


# the arguments whose changes the weights are adapted to (the others change no shape, or are refused)
ADAPTED = {"num_classes", "in_chans", "img_size", "mean", "std", "label_names", "tokenizer", "vocab_size"}
ADAPTABLE = "num_classes, in_chans, img_size (ViTs), mean, std, label_names, and a new tokenizer"
# the arguments that change only how a model trains, not what its weights compute
HARMLESS = {"drop_rate", "drop_path_rate"}


def start_from(source: str, overrides: dict) -> nn.Module:
    """The model of checkpoint `source` with `overrides` (constructor arguments) applied, its weights adapted to
    them as timm adapts pretrained weights, in training mode. Each adaptation is logged in one line."""
    from zoo.models.registry import build

    base = load(source_folder(source))  # zoo.load's checks: safetensors, finite weights, a valid config
    cls = type(base)
    accepted = inspect.signature(cls).parameters
    unknown = sorted(set(overrides) - set(accepted))
    if unknown:
        raise ValueError(f"{source} is {_kind(base)}, which takes no {unknown[0]}; it can only be started from with "
                         f"its own arguments ({', '.join(accepted)}), of which {ADAPTABLE} may change")
    args = {**base.config, **overrides}
    changed = {k for k in overrides if _plain(overrides[k]) != _plain(base.config.get(k))}
    if "num_classes" in changed and "label_names" not in overrides:
        args["label_names"] = None  # they name the old classifier's classes
    old_chans = base.config.get("in_chans")
    if "in_chans" in changed:  # normalization for the new channels, unless given: repeated, or averaged to one
        chans = args["in_chans"]
        for stat in ("mean", "std"):
            values = base.config[stat]
            if stat in overrides or len(values) == chans:
                continue
            if len(values) != 1 and chans != 1:
                raise ValueError(f"{source}: in_chans={chans} needs {stat} for {chans} channels; the checkpoint's "
                                 f"is for {old_chans}: pass {stat} (a data module gives it)")
            args[stat] = values * chans if len(values) == 1 else [sum(values) / len(values)]
    try:
        model = build(cls, args)
    except (TypeError, ValueError) as error:
        raise type(error)(f"starting from {source}: {error}") from None
    state = _adapted_state(base, model, source, changed)
    model.load_state_dict(state, strict=False)
    model.model_name, model.base_model = base.model_name, source
    return model.train()


def _kind(model: nn.Module) -> str:
    what = "a language model: it reads token ids" if hasattr(model, "tokenizer") else "a classifier"
    return f"a {type(model).__name__} ({what})"


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def _adapted_state(base: nn.Module, model: nn.Module, source: str, changed: set[str]) -> dict:
    """The checkpoint's tensors as `model` takes them; the rest of `model` keeps its fresh initialization."""
    own = model.state_dict()
    state, refused = {}, []
    new_vocabulary = "tokenizer" in changed or "vocab_size" in changed
    if new_vocabulary:
        log.warning("%s: token embedding (tied to the output layer) re-initialized for the new tokenizer's %d tokens "
                    "(the checkpoint's has %d)", source, model.config["vocab_size"], base.config["vocab_size"])
    if "num_classes" in changed:
        log.warning("%s: classifier re-initialized for %d classes (the checkpoint's has %d)", source,
                    model.num_classes, base.num_classes)
    for name, tensor in base.state_dict().items():
        if name not in own:
            refused.append(f"{name} (not in the new model)")
        elif new_vocabulary and name in ("tok_embed.weight", "head.weight"):
            continue
        elif name.startswith("head.") and "num_classes" in changed:
            continue
        elif name == "patch_embed.weight" and "in_chans" in changed:
            state[name] = _adapt_channels(tensor, model.in_chans, base.in_chans).reshape(own[name].shape)
            how = "summed" if model.in_chans == 1 else "repeated and rescaled"
            log.warning("%s: patch embedding adapted from %d to %d input channels (%s, as timm's adapt_input_conv)",
                        source, base.in_chans, model.in_chans, how)
        elif name == "pos_embed" and "img_size" in changed and changed <= ADAPTED and hasattr(model, "img_size"):
            from timm.layers import resample_abs_pos_embed

            state[name] = resample_abs_pos_embed(tensor, list(model.grid), list(base.grid), model.num_prefix_tokens)
            log.warning("%s: position embedding resampled from a %dx%d to a %dx%d patch grid (timm's "
                        "resample_abs_pos_embed)", source, *base.grid, *model.grid)
        elif tensor.shape != own[name].shape:
            refused.append(f"{name} {tuple(tensor.shape)} -> {tuple(own[name].shape)}")
        else:
            state[name] = tensor
    if refused:
        shown = "; ".join(refused[:10]) + (f"; and {len(refused) - 10} more" if len(refused) > 10 else "")
        raise ValueError(f"{source}: the arguments changed ({', '.join(sorted(changed))}) reshape weights that "
                         f"cannot be adapted: {shown}. Starting from a checkpoint may change {ADAPTABLE}; "
                         f"anything else needs a model trained from scratch")
    _say_what_else_changed(base, model, source, changed, state)
    return state


def _say_what_else_changed(base: nn.Module, model: nn.Module, source: str, changed: set[str], state: dict) -> None:
    """One warning for what no adaptation covers, as each adaptation has its own: tensors the checkpoint does
    not have (more blocks: depth=6 from a 4-block checkpoint), and arguments that keep every shape but change
    what the kept weights compute (num_heads splits q, k and v into other heads; another attention reads them
    otherwise)."""
    renewed = ("head.", "tok_embed.") if changed & {"num_classes", "tokenizer", "vocab_size"} else ()
    fresh = sorted({".".join(name.split(".")[:2]) if name.startswith("blocks.") else name
                    for name in model.state_dict() if name not in state and not name.startswith(renewed)},
                   key=lambda n: [int(p) if p.isdigit() else p for p in n.split(".")])
    others = [f"{key} {_plain(base.config.get(key))!r} -> {_plain(model.config.get(key))!r}"
              for key in sorted(changed - ADAPTED - HARMLESS)]
    if others or fresh:
        log.warning("%s: %s%s%s; fine-tune before use", source, f"changed {', '.join(others)}, which no weight "
                    "adaptation covers (the kept weights compute another function)" if others else "",
                    "; " if others and fresh else "",
                    f"{', '.join(fresh)} start from fresh weights (the checkpoint has none)" if fresh else "")


def _adapt_channels(weight: torch.Tensor, in_chans: int, base_chans: int) -> torch.Tensor:
    """timm's adapt_input_conv for the patch embedding of either family: a convolution (out, C, p, p), or the
    linear map of a FusedAttentionNetwork over (C, p1, ..., pn), seen as a convolution (out, C, p1...pn, 1)."""
    from timm.models._manipulate import adapt_input_conv

    as_conv = weight if weight.dim() == 4 else weight.reshape(weight.shape[0], base_chans, -1, 1)
    return adapt_input_conv(in_chans, as_conv, base_chans=base_chans)
