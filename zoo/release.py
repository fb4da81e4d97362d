"""Release folders: config.json + model.safetensors + README.md, written atomically and loaded strictly.

A release folder is all a model needs to be rebuilt bit for bit: the architecture and
every constructor argument (JSON), the weights (safetensors, never pickle), and a
model card. `zoo.load` accepts a registered name (with an optional `.tag`), a folder,
or `hf-hub:org/repo[@revision]`.
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path

import torch
from torch import nn

from zoo.atomic import read_folder, replace_folder, write_text_atomic
from zoo.card import model_card

CONFIG, WEIGHTS, CARD = "config.json", "model.safetensors", "README.md"
RELEASE_FILES = (CONFIG, WEIGHTS, CARD)
FORMAT_VERSION = 1


def checkpoint_roots() -> list[Path]:
    """Where shipped release folders live: the package's own, then a source checkout's checkpoints/."""
    here = Path(__file__).resolve().parent
    return [p for p in (here / "checkpoints", here.parent / "checkpoints") if p.is_dir()]


def pretrained_tags(name: str) -> list[str]:
    """Tags of the shipped checkpoints of `name`: folders `checkpoints/<name>.<tag>`."""
    tags = set()
    for root in checkpoint_roots():
        for folder in root.glob(f"{name}.*"):
            if (folder / CONFIG).is_file():
                tags.add(folder.name[len(name) + 1 :])
    return sorted(tags)


class Releasable:
    """Gives a model `save_pretrained`; the model keeps its constructor arguments in `self.config`."""

    config: dict
    model_name: str | None = None

    def save_pretrained(self, path: str | os.PathLike, card: str | None = None, extra: dict | None = None,
                        overwrite: bool = True) -> Path:
        return save_pretrained(self, path, card=card, extra=extra, overwrite=overwrite)


def _config_json(model: nn.Module, extra: dict | None) -> dict:
    config = {
        "format_version": FORMAT_VERSION,
        "class": type(model).__name__,
        "architecture": type(model).__name__,
        "model_name": getattr(model, "model_name", None),
        "args": model.config,
    }
    from zoo.registry import _entries, in_timm

    e = _entries().get(config["model_name"])
    if e is not None and in_timm(e):
        # The keys timm reads from a Hub config.json: `timm.create_model("hf-hub:org/repo")`
        # builds `architecture` from timm's registry with `model_args`.
        config["architecture"] = config["model_name"].replace("-", "_")
        config["model_args"] = model.config
        config["num_classes"] = model.num_classes
        config["num_features"] = model.num_features
        # how its inputs are prepared (model.data_cfg; the pretrained_cfg timm set may hold local paths)
        config["pretrained_cfg"] = {k: list(v) if isinstance(v, tuple) else v for k, v in model.data_cfg().items()}
    return {**config, **(extra or {})}


def is_release_folder(path) -> bool:
    """A folder that zoo wrote: nothing but release files, and a config.json with zoo's format_version."""
    path = Path(path)
    try:
        if not {p.name for p in path.iterdir()} <= set(RELEASE_FILES) or not (path / CONFIG).is_file():
            return False
        config = json.loads((path / CONFIG).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(config, dict) and "format_version" in config and "class" in config


def save_pretrained(model: nn.Module, path, card: str | None = None, extra: dict | None = None,
                    overwrite: bool = True) -> Path:
    """Write a release folder atomically (zoo/atomic.py): built beside `path`, then swapped in.

    Only an absent path, an empty folder or a release folder is ever replaced (the last only
    with overwrite=True); anything else is refused, naming the path.
    """
    from safetensors.torch import save_model

    path = Path(path)
    config = _config_json(model, extra)

    def fill(staging: Path) -> None:
        (staging / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        save_model(model, str(staging / WEIGHTS))  # drops tied duplicates; load_release restores them
        (staging / CARD).write_text(card if card is not None else model_card(model, path.name, config))

    return replace_folder(path, fill, is_release_folder, "release folder", overwrite)


def write_json_atomic(path, data) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def _aliases(model: nn.Module) -> dict[str, set[str]]:
    """For each state-dict name, every name that shares its storage (tied weights), itself included."""
    by_storage: dict[int, set[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        by_storage.setdefault(tensor.data_ptr(), set()).add(name)
    return {name: group for group in by_storage.values() for name in group}


def read_config(data: bytes, file: Path) -> dict:
    """config.json's object, refused with the file and field named when it is not one zoo can read."""
    from zoo.registry import ARCHITECTURES, _entries

    try:
        config = json.loads(data)
    except UnicodeDecodeError:
        raise ValueError(f"{file} is not a UTF-8 text file; expected zoo's config.json") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{file} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{file} must hold a JSON object, got a JSON {type(config).__name__}")
    version = config.get("format_version")
    if version is None:
        raise ValueError(f"{file} has no format_version: it was not written by zoo's save_pretrained")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"{file}: format_version must be a positive integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise ValueError(f"{file} has format_version {version}, written by a newer zoo; this zoo "
                         f"reads format_version {FORMAT_VERSION}: upgrade zoo (pip install -U zoo)")
    _entries()  # make sure every architecture is registered
    arch = config.get("class")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise ValueError(f"{file}: class {arch!r} is not a zoo architecture; zoo knows {sorted(ARCHITECTURES)}")
    args = config.get("args")
    if not isinstance(args, dict):
        raise ValueError(f"{file}: args must be a JSON object of {arch}'s arguments, got {type(args).__name__}")
    accepted = inspect.signature(ARCHITECTURES[arch]).parameters
    unknown = sorted(set(args) - set(accepted))
    if unknown:
        raise ValueError(f"{file}: args.{unknown[0]} is not an argument of {arch}; it takes {', '.join(accepted)}")
    return config


FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")


def read_weights(data: bytes, file: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, refused with a reason when it is truncated, not safetensors,
    or holds anything but finite floating-point tensors (zoo's weights are all floating point)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    if len(data) < 8:
        raise ValueError(f"{file} is not a safetensors file: {len(data)} bytes, too short for a header")
    size = int.from_bytes(data[:8], "little")
    if size > len(data) - 8:
        raise ValueError(f"{file} is truncated or not a safetensors file: its header should take {size:,} bytes, "
                         f"the file holds {len(data) - 8:,} after the length")
    try:
        header = json.loads(data[8:8 + size])
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"{file} is not a safetensors file: its header is not JSON") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file} is not a safetensors file: its header is not a JSON object")
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info.get("dtype") if isinstance(info, dict) else None
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"{file}: tensor {name!r} is stored as {dtype}; zoo's weights are floating point "
                             f"({', '.join(FLOAT_DTYPES)}), and other types are never cast silently")
    try:
        state = load(data)
    except SafetensorError as e:
        raise ValueError(f"{file} is not a valid safetensors file: {e}") from None
    for name, tensor in state.items():  # a NaN weight makes every output NaN: say so at load, not later
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{file}: tensor {name!r} holds NaN or infinite values (a diverged or damaged "
                             "checkpoint); zoo loads only finite weights")
    return state


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], file: Path, strict: bool = True,
                 drop_prefixes: tuple[str, ...] = ()) -> None:
    """Load a state dict read from `file`; in strict mode every problem is reported in one error."""
    state = {k: v for k, v in state.items() if not k.startswith(drop_prefixes)}
    own = model.state_dict()
    aliases = _aliases(model)  # safetensors keeps one name of each tied group
    for group in {frozenset(g) for g in aliases.values() if len(g) > 1}:
        stored = sorted(group & state.keys())
        for other in stored[1:]:
            if not torch.equal(state[stored[0]], state[other]):
                raise ValueError(f"{file}: {stored[0]} and {other} are tied in {type(model).__name__} (one tensor), "
                                 "but the file holds two different values for them")
    missing = [k for k in own if not (aliases[k] & state.keys()) and not k.startswith(drop_prefixes)]
    unexpected = [k for k in state if k not in own]
    mismatched = [f"{k}: checkpoint {tuple(v.shape)}, model {tuple(own[k].shape)}"
                  for k, v in state.items() if k in own and v.shape != own[k].shape]
    if strict and (missing or unexpected or mismatched):
        lines = [f"the weights in {file} do not fit {type(model).__name__}:"]
        for title, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", mismatched)):
            if items:
                lines.append(f"  {title} ({len(items)}): " + "; ".join(items))
        raise ValueError("\n".join(lines))
    state = {k: v for k, v in state.items() if k in own and v.shape == own[k].shape}
    if not state and own:
        raise ValueError(f"none of the tensors in {file} fit {type(model).__name__} (it expects names such as "
                         f"{', '.join(list(own)[:3])}): strict=False loads part of a model's weights, never none")
    model.load_state_dict(state, strict=False)


def load_release(path, strict: bool = True, max_parameters: int | None = None, **overrides) -> nn.Module:
    """A model from a release folder, read as one version even while another process replaces it."""
    from zoo.models.arguments import check_budget
    from zoo.registry import ARCHITECTURES

    path = Path(path)
    if not (path / CONFIG).is_file() or not (path / WEIGHTS).is_file():
        found = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
        raise FileNotFoundError(f"a release folder needs {CONFIG} and {WEIGHTS}; {path} holds {found or 'nothing'}")
    files = read_folder(path, [CONFIG, WEIGHTS])
    config = read_config(files[CONFIG], path / CONFIG)
    cls = ARCHITECTURES[config["class"]]
    args = {**config["args"], **overrides}
    new_head = "num_classes" in overrides and overrides["num_classes"] != config["args"].get("num_classes")
    names = args.get("label_names")
    if new_head and isinstance(names, list) and len(names) != overrides["num_classes"]:
        args["label_names"] = None  # the names of the old classifier's classes (timm passes them back in)
    try:  # the arguments come from config.json: say so in their errors
        check_budget(cls, args, max_parameters)
        model = cls(**args)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{path / CONFIG}: {e}") from None
    state = read_weights(files[WEIGHTS], path / WEIGHTS)
    model.model_name = config.get("model_name")
    drop = ("head.",) if new_head else ()  # a new classifier, as timm does
    load_weights(model, state, path / WEIGHTS, strict=strict, drop_prefixes=drop)
    return model.eval()


def load(source: str | os.PathLike, strict: bool = True, *, token: str | bool | None = None,
         cache_dir: str | os.PathLike | None = None, local_files_only: bool = False,
         max_parameters: int | None = None, **overrides) -> nn.Module:
    """A model in eval mode from a registered name (`name` or `name.tag`), a release folder or the Hub.

    `hf-hub:org/repo[@revision]` downloads through huggingface_hub's cache; token, cache_dir
    and local_files_only are passed on to it (and mean nothing for the other sources).
    A config whose model would exceed max_parameters (default 1e9, or $ZOO_MAX_PARAMETERS)
    is refused before anything is allocated.
    """
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"zoo.load expects a model name, a folder or 'hf-hub:org/repo', got {type(source).__name__}")
    text = str(source)
    if text.startswith("hf-hub:"):
        from zoo.hub import download

        folder = download(text, token=token, cache_dir=cache_dir, local_files_only=local_files_only)
        return load_release(folder, strict=strict, max_parameters=max_parameters, **overrides)
    if Path(text).is_dir():
        return load_release(text, strict=strict, max_parameters=max_parameters, **overrides)
    return load_release(checkpoint_folder(text), strict=strict, max_parameters=max_parameters, **overrides)


def checkpoint_folder(name_tag: str) -> Path:
    """The shipped release folder of `name` or `name.tag` (without a tag: the model's default, else the first)."""
    from zoo.registry import entry

    name, _, tag = name_tag.partition(".")
    default = entry(name).default_tag  # unknown names fail here, with the closest registered ones
    tags = pretrained_tags(name)
    if not tags:
        raise ValueError(f"no pretrained weights are shipped for {name!r}; zoo.create({name!r}) builds it with "
                         f"random weights, `zoo.list_models(pretrained=True)` lists those with weights")
    tag = tag or (default if default in tags else tags[0])
    if tag not in tags:
        raise ValueError(f"{name!r} has no checkpoint tagged {tag!r}; available: {tags}")
    return next(root / f"{name}.{tag}" for root in checkpoint_roots() if (root / f"{name}.{tag}").is_dir())
