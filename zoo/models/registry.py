"""One registry for every architecture: names, families, defaults, and how to build or load them."""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn


@dataclass(frozen=True)
class Entry:
    name: str
    family: str
    cls: type[nn.Module]
    kwargs: dict = field(default_factory=dict)
    default_tag: str | None = None  # the checkpoint `zoo.load(name)` takes when several are shipped

    @property
    def attention(self) -> str:
        return self.kwargs.get("attention", "softmax")


def in_timm(e: Entry) -> bool:
    """Image classifiers that timm's data pipeline can feed, registered with timm (zoo/release/timm_models.py):
    the ViTs, and FusedAttention networks on 2-D images."""
    if e.family == "image":
        return True
    return e.family == "fused" and len(e.kwargs.get("input_size", ())) == 2 and not e.kwargs.get("collection")


_ENTRIES: dict[str, Entry] = {}
ARCHITECTURES: dict[str, type[nn.Module]] = {}


def register(name: str, family: str, cls: type[nn.Module], default_tag: str | None = None, **kwargs) -> None:
    if name in _ENTRIES:
        raise ValueError(f"model {name!r} is registered twice")
    _ENTRIES[name] = Entry(name, family, cls, kwargs, default_tag)
    ARCHITECTURES[cls.__name__] = cls


def _entries() -> dict[str, Entry]:
    # complete: importing this module ran zoo/models/__init__.py first, which imports every family
    return _ENTRIES


def entry(name: str) -> Entry:
    if not isinstance(name, str):
        raise TypeError(f"a model name must be a string, got {type(name).__name__}")
    entries = _entries()
    if name not in entries:
        close = difflib.get_close_matches(name, list(entries), n=5, cutoff=0.4)
        hint = f"; closest: {', '.join(close)}" if close else ""
        raise ValueError(f"unknown model {name!r}{hint}. `zoo.list_models()` lists all {len(entries)}.")
    return entries[name]


def list_models(pattern: str = "*", pretrained: bool = False) -> list[str]:
    """Registered names matching a shell-style wildcard, sorted.

    Args:
        pattern: a shell-style wildcard over the names, e.g. "micro-*" (default: every model).
        pretrained: only the models with shipped weights (`zoo.load(name)` works offline for them).
    """
    names = sorted(n for n in _entries() if fnmatch.fnmatch(n, pattern))
    return [n for n in names if pretrained_tags(n)] if pretrained else names


def create(name: str, *, max_parameters: int | None = None, device=None, dtype: torch.dtype | None = None,
           **overrides) -> nn.Module:
    """A registered model with random weights; keyword arguments override its defaults.

    The model is built on `device` (parameters are allocated there, not moved) and cast to `dtype`.
    A model above max_parameters (default 1e9, or $ZOO_MAX_PARAMETERS) is refused before it is allocated.

    Args:
        name: a registered name (`zoo.list_models()`), e.g. "micro-vit-tiny".
        max_parameters: the largest parameter count to build (default 1e9, or $ZOO_MAX_PARAMETERS).
        device (str | torch.device | None): where the parameters are made ("cpu", "cuda:0", "meta", ...);
            default torch's current device.
        dtype: a floating-point dtype to cast the model to (default: as built, float32).
        **overrides (Any): constructor arguments of the model's class that replace its registered defaults.
    """
    e = entry(name)
    model = build(e.cls, {**e.kwargs, **overrides}, max_parameters, device, dtype)
    model.model_name = name
    return model


def build(cls: type[nn.Module], args: dict, max_parameters: int | None = None, device=None,
          dtype: torch.dtype | None = None) -> nn.Module:
    """cls(**args) within the parameter budget, made on `device` and cast to the floating-point `dtype`."""
    from zoo.models.arguments import check_budget

    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    if device is not None:
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise ValueError(f"device must name a torch device ('cpu', 'cuda:0', 'meta', ...), got {device!r}: "
                             f"{error}") from None
    check_budget(cls, args, max_parameters)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        model = cls(**args)
    return model if dtype is None else model.to(dtype)


def checkpoint_roots() -> list[Path]:
    """Where shipped release folders live: the package's own, then a source checkout's checkpoints/."""
    package = Path(__file__).resolve().parents[1]  # zoo/
    return [p for p in (package / "checkpoints", package.parent / "checkpoints") if p.is_dir()]


def pretrained_tags(name: str) -> list[str]:
    """Tags of the shipped checkpoints of `name`: folders `checkpoints/<name>.<tag>`."""
    tags = set()
    for root in checkpoint_roots():
        for folder in root.glob(f"{name}.*"):
            if (folder / "config.json").is_file():  # release_files.CONFIG: that module reads the registry
                tags.add(folder.name[len(name) + 1 :])
    return sorted(tags)


def checkpoint_folder(name_tag: str) -> Path:
    """The shipped release folder of `name` or `name.tag` (without a tag: the model's default, else the first)."""
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
