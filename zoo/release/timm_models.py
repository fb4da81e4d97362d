"""zoo's image models in timm's registry, with a pretrained config for every shipped checkpoint.

`timm.create_model("micro_vit_tiny.fashion", pretrained=True)` goes through timm's own
builder (`build_model_with_cfg`): timm resolves the pretrained config of the tag, passes
its factory keywords (device, dtype, in_chans, num_classes, drop_rate, drop_path_rate,
features_only, out_indices, pretrained_cfg_overlay, ...), loads the safetensors weights
(adapting the first layer to another channel count and dropping the classifier for
another class count) and wraps the model for `features_only=True`. Each checkpoint's
config describes exactly how its inputs were prepared in training (zoo's `data_cfg`):
its size, mean and std, and crop_pct=1.0, as no crop was used.

This module imports timm; `zoo/release/timm_hook.py` imports it once timm itself is imported.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path

import torch
from timm.layers import register_notrace_module
from timm.models import build_model_with_cfg, generate_default_cfgs, is_model, register_model
from timm.models._manipulate import adapt_input_conv
from timm.models._pretrained import PretrainedCfg
from timm.models._registry import get_pretrained_cfg

from zoo.attention import MECHANISMS, FusedAttention
from zoo.models.fused_network import FusedAttentionNetwork
from zoo.models.layers import is_int_or_ints
from zoo.models.registry import Entry, _entries, build, checkpoint_folder, in_timm, pretrained_tags
from zoo.models.release_files import CONFIG, WEIGHTS, read_config, read_header, read_tensors

_logger = logging.getLogger(__name__)
default_cfgs: dict = {}  # timm's register_model reads the configs of an entrypoint's module from here


def timm_name(name: str) -> str:
    return name.replace("-", "_")


def _cfg(e: Entry, args: dict, weights: Path | None) -> dict:
    with torch.device("meta"):  # the config describes the model; nothing need be allocated
        model = e.cls(**args)
    cfg = {k: v for k, v in model.data_cfg().items() if v is not None}
    return {**cfg, "file": str(weights)} if weights else cfg


def _pretrained_cfgs(e: Entry) -> dict[str, dict]:
    """'arch.tag' -> config for each shipped checkpoint (the default tag first); 'arch' alone if none is shipped."""
    tags = sorted(pretrained_tags(e.name), key=lambda tag: tag != e.default_tag)
    if not tags:
        return {timm_name(e.name): _cfg(e, e.kwargs, None)}
    cfgs = {}
    for tag in tags:
        folder = checkpoint_folder(f"{e.name}.{tag}")
        args = json.loads((folder / CONFIG).read_text())["args"]
        cfgs[f"{timm_name(e.name)}.{tag}"] = _cfg(e, args, folder / WEIGHTS)
    return cfgs


def _build(cls: type, device=None, dtype=None, **kwargs):
    return build(cls, kwargs, device=device, dtype=dtype)


def _check_and_adapt(state_dict: dict, model) -> dict:
    """Weights as timm read them: refused if not finite (as zoo.load refuses them); and, as a
    FusedAttentionNetwork embeds patches with a linear map over (C, p1, p2), that map adapted to
    another channel count as timm adapts a first convolution (timm's own adaptation handles only Conv2d);
    a learned position embedding for another img_size resampled to the model's grid, as timm's ViTs do."""
    for name, tensor in state_dict.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"pretrained tensor {name!r} holds NaN or infinite values; zoo loads only finite weights")
    stored, own = state_dict.get("pos_embed"), getattr(model, "pos_embed", None)
    if stored is not None and isinstance(own, torch.nn.Parameter) and stored.shape != own.shape:
        grid = model.stored_grid(tuple(stored.shape))  # a checkpoint for another img_size, resampled as timm does
        state_dict["pos_embed"] = model.resample_pos_embed(stored, grid)
        _logger.info("%s: pos_embed resampled from a %dx%d grid of patches to %dx%d", type(model).__name__, *grid,
                     *model.grid)
    weight = state_dict.get("patch_embed.weight")
    if not isinstance(model, FusedAttentionNetwork) or weight is None:
        return state_dict
    if weight.shape != model.patch_embed.weight.shape:
        patch = model.patch_size
        stored = weight.shape[1] // (patch[0] * patch[1])
        adapted = adapt_input_conv(model.in_chans, weight.view(weight.shape[0], stored, *patch), base_chans=stored)
        state_dict["patch_embed.weight"] = adapted.flatten(1)
    return state_dict


def _safe_source(arch: str, cfg: dict, cache_dir) -> dict:
    """The pretrained config with only safetensors to come off the network, refused before any download:
    an hf_hub_id goes through zoo.models.hub (a zoo release, checked before its weights come), a url must name a
    .safetensors file (timm would fetch a .pth and unpickle it)."""
    source, file, url, hub_id = cfg.get("source"), cfg.get("file"), cfg.get("url"), cfg.get("hf_hub_id")
    if source == "local-dir":  # timm would take pytorch_model.bin from the folder
        return {**cfg, "source": "", "file": str(Path(file) / WEIGHTS)}
    if cfg.get("state_dict") or (file and source != "hf-hub"):
        return cfg
    if hub_id:
        from zoo.models.hub import download

        if cfg.get("hf_hub_filename") not in (None, WEIGHTS):
            raise ValueError(f"{arch}: zoo loads {WEIGHTS} from the Hub, got hf_hub_filename="
                             f"{cfg['hf_hub_filename']!r}")
        folder = download(f"hf-hub:{hub_id}", cache_dir=cache_dir)
        return {**cfg, "source": "", "hf_hub_id": None, "url": None, "file": str(folder / WEIGHTS)}
    if url and not str(url).split("?")[0].endswith(".safetensors"):
        raise ValueError(f"{arch}: zoo loads weights from the network only as safetensors, got url={str(url)[:80]!r}"
                         " (a pickle); download and convert it yourself, or pass a .safetensors url or file")
    return cfg


def _checked_checkpoint_path(arch: str) -> None:
    """timm.create_model loads checkpoint_path itself after building the model, beyond the entrypoint's reach;
    refuse here, from its frame, what zoo would not load: a pickle, or weights that are not finite floats."""
    import sys

    from timm.models._factory import create_model

    caller = sys._getframe(2)
    if caller.f_code is not create_model.__code__ or not caller.f_locals.get("checkpoint_path"):
        return
    path = Path(caller.f_locals["checkpoint_path"])
    if path.suffix != ".safetensors":
        raise ValueError(f"{arch}: checkpoint_path {path} is not a .safetensors file; zoo loads weights from "
                         "safetensors only, never from a pickle")
    if not path.is_file():
        raise FileNotFoundError(f"{arch}: no checkpoint_path file at {path}")
    fd = os.open(path, os.O_RDONLY)
    try:  # a NaN, an integer or a truncated file: refused, naming the tensor
        read_tensors(fd, list(read_header(fd, path)), path)
    finally:
        os.close(fd)


def _entrypoint(e: Entry):
    arch = timm_name(e.name)

    def create(pretrained: bool = False, pretrained_cfg=None, pretrained_cfg_overlay=None, cache_dir=None, **kwargs):
        _checked_checkpoint_path(arch)
        cfg = pretrained_cfg
        if not isinstance(cfg, (dict, PretrainedCfg)):  # a tag, or None for the default one
            cfg = get_pretrained_cfg(f"{arch}.{cfg}" if cfg else arch)
        cfg = cfg if isinstance(cfg, dict) else cfg.to_dict()
        cfg = {**cfg, **(pretrained_cfg_overlay or {})}
        args = dict(e.kwargs)
        if pretrained:
            cfg = _safe_source(arch, cfg, cache_dir)
            if not (cfg.get("file") or cfg.get("hf_hub_id") or cfg.get("url") or cfg.get("state_dict")):
                tags = [t for t in default_cfgs[arch].tags if t]
                hint = f"its tags are {tags}" if tags else "pretrained=False builds it with random weights"
                raise ValueError(f"{arch} has no pretrained weights in this config; {hint}")
            if cfg.get("file") and not str(cfg["file"]).endswith(".safetensors"):
                raise ValueError(f"{arch}: zoo loads weights from safetensors files only, got {cfg['file']}")
            release = Path(cfg["file"]).parent if cfg.get("file") else None
            if release is not None and (release / CONFIG).is_file():  # the checkpoint's own arguments
                args.update(read_config((release / CONFIG).read_bytes(), release / CONFIG)["args"])
        args.update(kwargs)
        if issubclass(e.cls, FusedAttentionNetwork) and "img_size" in args:  # timm's name for its input_size
            size = args.pop("img_size")
            args["input_size"] = list(size) if isinstance(size, (list, tuple)) else [size, size]
        names = args.get("label_names")
        if isinstance(names, (list, tuple)) and "num_classes" in args and len(names) != args["num_classes"]:
            args["label_names"] = None  # they name the stored classifier's classes, which timm replaces
        out_indices = args.pop("out_indices", 3)
        if not is_int_or_ints(out_indices):  # timm would take 0.5 or "1" and fail, or pick blocks, later
            raise TypeError(f"{arch}: out_indices must be an int or a sequence of ints, got {out_indices!r}")
        model = build_model_with_cfg(
            functools.partial(_build, e.cls), arch, pretrained,
            pretrained_cfg=cfg, feature_cfg={"feature_cls": "getter", "out_indices": out_indices},
            pretrained_filter_fn=_check_and_adapt, cache_dir=cache_dir, **args,
        )
        if hasattr(model, "save_pretrained"):  # not timm's features_only wrapper
            model.model_name = e.name
            if tuple(model.pretrained_cfg.get("input_size") or ()) != model.input_shape:  # built for another size
                model.pretrained_cfg = {**model.pretrained_cfg, "input_size": model.input_shape}
        return model

    create.__name__ = arch
    create.__qualname__ = arch
    create.__doc__ = f"zoo's {e.name} ({e.cls.__name__}, attention={e.attention})"
    return create


def register_with_timm() -> None:
    """Register every image model and its pretrained configs with timm (once; timm names use '_' for '-').

    The attention layers are leaves of the graphs timm traces (torch.fx, for feature extraction), as timm's
    own modules with data-dependent code are: each checks its input and picks its kernel when it runs."""
    for mechanism in (*MECHANISMS.values(), FusedAttention):
        register_notrace_module(mechanism)
    for e in _entries().values():
        if not in_timm(e) or is_model(timm_name(e.name)):
            continue
        default_cfgs.update(generate_default_cfgs(_pretrained_cfgs(e)))
        register_model(_entrypoint(e))


register_with_timm()  # timm is imported by now; the hook in timm_hook.py may have found it first
