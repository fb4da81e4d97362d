"""One registry for every architecture: names, families, defaults, and how to build or load them."""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import re
import warnings
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
        """The mechanism's name; a hybrid's, one per block, joined by "/" (micro/micro/softmax/micro)."""
        attention = self.kwargs.get("attention", "softmax")
        return attention if isinstance(attention, str) else "/".join(attention)


def in_timm(e: Entry) -> bool:
    """Image classifiers that timm's data pipeline can feed, registered with timm (zoo/release/timm_models.py):
    the ViTs, and FusedAttention networks on 2-D images."""
    if e.family == "image":
        return True
    return e.family == "fused" and len(e.kwargs.get("input_size", ())) == 2 and not e.kwargs.get("collection")


_ENTRIES: dict[str, Entry] = {}
ARCHITECTURES: dict[str, type[nn.Module]] = {}


FAMILIES = ("image", "fused", "text")  # what the training tasks take: zoo.training.task_class
PLUGINS = "zoo.models"  # the entry-point group under which other packages declare their architectures
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # no '.', which separates a name from its checkpoint's tag


def register(name: str, family: str, cls: type[nn.Module], default_tag: str | None = None, **kwargs) -> None:
    """Register a model: `zoo.create(name)` builds `cls(**kwargs)`, and release folders of `cls` load by its class
    name. Your own architecture registers the same way; its module must be imported before `zoo.load` reads
    one of its folders, or declared under the `zoo.models` entry point of an installed package (then
    `zoo.load` imports it on first need).

    Args:
        name: the model's name, e.g. "my-vit-tiny"; each name is registered once.
        family: "image", "fused" or "text": which training task and data it takes.
        cls: the model class; it keeps its constructor arguments in `self.config` (zoo.models.pretrained's
            Releasable gives it `save_pretrained`).
        default_tag: the checkpoint `zoo.load(name)` takes when several are shipped; default None.
        **kwargs (Any): the constructor arguments of this name.
    """
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"register: a model name is letters, digits, '-' and '_', starting with a letter or digit "
                         f"(a '.' would be read as name.tag, a '/' or ':' as a path or a Hub id), got {name!r}")
    if name in _ENTRIES:
        raise ValueError(f"model {name!r} is registered twice")
    if family not in FAMILIES:
        raise ValueError(f"register({name!r}) family must be one of {list(FAMILIES)}, got {family!r}")
    known = ARCHITECTURES.get(cls.__name__)
    if known is not None and known is not cls:
        raise ValueError(f"register({name!r}): another class named {cls.__name__} ({known.__module__}) is registered; "
                         "release folders name their class, so two architectures cannot share a name")
    _ENTRIES[name] = Entry(name, family, cls, kwargs, default_tag)
    ARCHITECTURES[cls.__name__] = cls


_PLUGINS_LOADED = []


def load_plugins() -> None:
    """Import, once, the modules that installed packages declare under the `zoo.models` entry-point group:
    each registers its architectures as it is imported. Only installed distributions declare them; zoo
    never imports a module that a config file names."""
    from importlib.metadata import entry_points

    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED.append(True)
    for point in entry_points(group=PLUGINS):
        # One broken plugin must not break zoo.load for every other one: it is named, and the rest load. The
        # folder that needed it is then refused as any folder of an unregistered class is.
        try:
            point.load()
        except Exception as error:  # noqa: BLE001 (a plugin's import may raise anything)
            dist = getattr(point.dist, "name", None) or "an installed package"
            warnings.warn(f"zoo: the {PLUGINS!r} plugin {point.name!r} ({point.value}, from {dist}) failed to "
                          f"import and registers nothing: {type(error).__name__}: {error}", stacklevel=2)


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
    check_overrides(e, overrides)
    model = build(e.cls, {**e.kwargs, **overrides}, max_parameters, device, dtype)
    model.model_name = name
    return model


def check_overrides(e: Entry, overrides: dict) -> None:
    """Refuse a keyword the model's class does not take, in one line: for one of its mechanisms' own options
    (micro's num_queries), say that it goes in attention_options."""
    import inspect

    from zoo.attention import MECHANISMS
    from zoo.models.layers import check_options

    def takes(mechanism: str, key: str) -> bool:
        try:
            return mechanism in MECHANISMS and check_options(mechanism, {key: None}) is not None
        except ValueError:
            return False

    accepted = inspect.signature(e.cls).parameters
    if any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        return
    unknown = [key for key in overrides if key not in accepted]
    if not unknown:
        return
    key, value = unknown[0], overrides[unknown[0]]
    attention = overrides.get("attention", e.kwargs.get("attention", "softmax"))
    mechanisms = [attention] if isinstance(attention, str) else attention if isinstance(attention, list) else []
    owners = [m for m in dict.fromkeys(mechanisms) if isinstance(m, str) and takes(m, key)]
    if owners and "attention_options" in accepted:
        raise TypeError(f"{key} is an option of the {' and '.join(owners)} attention, not of {e.cls.__name__}: pass "
                        f"attention_options={{{key!r}: {value!r}}}")
    close = difflib.get_close_matches(key, list(accepted), n=3)
    hint = f" (closest: {', '.join(close)})" if close else ""
    raise TypeError(f"{e.name} ({e.cls.__name__}) takes no argument {key!r}{hint}; it takes {', '.join(accepted)}")


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


# The wheel carries the tiny checkpoints, 0.2 to 4 MB each (pyproject.toml's package-data names "*-tiny.*"); the
# mini size's, 8 MB and more each even with their weights in bfloat16, would take it past PyPI's 100 MB a file, so
# they stay in the source repository's checkpoints/, where a clone's zoo.load finds them as it finds the others.
# Named here so that an installed zoo can say where they are (tests/test_checkpoints.py holds this list to the
# folders).
IN_REPOSITORY_ONLY = ("elita-gpt-mini.warpeace", "elita-gpt-mini.stdlib")


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
    # a mini checkpoint asked of an installed wheel: say where it is rather than that none was shipped
    elsewhere = [n.partition(".")[2] for n in IN_REPOSITORY_ONLY if n.partition(".")[0] == name]
    elsewhere = [t for t in elsewhere if t not in tags]
    if not tags and not elsewhere:
        raise ValueError(f"no pretrained weights are shipped for {name!r}; zoo.create({name!r}) builds it with "
                         f"random weights, `zoo.list_models(pretrained=True)` lists those with weights")
    tag = tag or (default if default in tags + elsewhere else (tags or elsewhere)[0])
    if tag in elsewhere:
        raise ValueError(f"{name}.{tag}: not in the wheel (too large for it) but in the source repository's "
                         f"checkpoints/ folder; from a clone, zoo.load finds it by name, or pass the release folder")
    if tag not in tags:
        available = tags + [f"{t} (in the source repository)" for t in elsewhere]
        raise ValueError(f"{name!r} has no checkpoint tagged {tag!r}; available: {', '.join(available)}")
    return next(root / f"{name}.{tag}" for root in checkpoint_roots() if (root / f"{name}.{tag}").is_dir())
