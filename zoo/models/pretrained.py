"""Release folders: config.json + model.safetensors + README.md, written atomically and loaded strictly.

A release folder is all a model needs to be rebuilt bit for bit: the architecture and
every constructor argument (JSON), the weights (safetensors, never pickle), and a
model card. `zoo.load` accepts a registered name (with an optional `.tag`), a folder,
or `hf-hub:org/repo[@revision]`.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
from pathlib import Path

import torch
from torch import nn

from zoo.models.arguments import check_budget
from zoo.models.card import model_card
from zoo.models.hub import download
from zoo.models.layers import per_block_options
from zoo.models.registry import ARCHITECTURES, Entry, _entries, check_overrides, checkpoint_folder, in_timm
from zoo.models.release_files import (
    CARD,
    CONFIG,
    FORMAT_VERSION,
    WEIGHTS,
    _listed,
    is_release_folder,
    read_config,
    read_header,
    read_tensors,
)
from zoo.utils.atomic import read_folder, replace_folder, write_text_atomic

# transformers' AutoConfig dispatches on config.json's "model_type": zoo's text releases load there as ZooTextConfig
# (zoo/release/transformers_models.py); zoo.load reads the key past, as it does every key but its own
MODEL_TYPES = {"TextTransformer": "zoo_text"}
SOURCES = ("a registered model (`zoo models`), or a checkpoint to start from: a shipped name.tag (`zoo models "
           "--pretrained`), a release folder or hf-hub:org/repo")


def is_checkpoint(source: str) -> bool:
    """Whether `source` names a checkpoint to start from, rather than a registered architecture."""
    if not isinstance(source, str):
        raise TypeError(f"a model must be named by a string ({SOURCES}), got {type(source).__name__}")
    if source in _entries():
        return False
    return source.startswith("hf-hub:") or source.partition(".")[0] in _entries() or looks_like_path(source)


def looks_like_path(source: str) -> bool:
    return "/" in source or source.startswith(("~", ".")) or Path(source).is_dir()


def source_folder(source: str) -> Path:
    """The release folder of a checkpoint source (a Hub repository is downloaded into huggingface_hub's cache)."""
    if source.startswith("hf-hub:"):
        return download(source)
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if looks_like_path(source):
        raise FileNotFoundError(f"no release folder at {source}; expected {SOURCES}")
    return checkpoint_folder(source)


def read_folder_config(folder: Path) -> dict:
    file = folder / CONFIG
    if not file.is_file():
        raise FileNotFoundError(f"{folder} is not a release folder: it has no {CONFIG} (expected {SOURCES})")
    return read_config(file.read_bytes(), file)


class Releasable:
    """Gives a model `save_pretrained`; the model keeps its constructor arguments in `self.config`."""

    config: dict
    model_name: str | None = None

    def save_pretrained(self, path: str | os.PathLike, card: str | None = None, extra: dict | None = None,
                        overwrite: bool = True) -> Path:
        """Write this model as a release folder atomically; see `zoo.save_pretrained`.

        Args:
            path: the release folder to write: absent, an empty folder or a release folder zoo wrote.
            card: the README.md text; default None: a generated model card.
            extra: more keys for config.json, JSON-serializable; default None.
            overwrite: replace an existing release folder at `path` (default True).

        Returns:
            The path of the written folder.
        """
        return save_pretrained(self, path, card=card, extra=extra, overwrite=overwrite)

    def record_swap(self, paths: list[str], mechanism: str, options: dict) -> None:
        """Keep `config` true to the model once zoo.attention.swap has put `mechanism` (with `options`) at
        `paths`: each swapped block's name goes into `attention` and the options into `attention_options`,
        so that a saved folder loads as the swapped model. Where this family's arguments cannot say it (a
        module other than a block's attention, per-block names or options the family takes no argument for),
        the config stays as it was and save_pretrained refuses the model, naming the first difference."""
        config = dict(self.config)
        depth, named = config.get("depth"), config.get("attention")
        if not isinstance(depth, int) or named is None:
            return
        names = [named] * depth if isinstance(named, str) else list(named)
        takes_options = "attention_options" in inspect.signature(type(self)).parameters
        options_per_block = per_block_options(config.get("attention_options"), depth, type(self).__name__)
        for path in paths:
            block = re.fullmatch(r"blocks\.(\d+)\.attn", path)
            if block is None or int(block.group(1)) >= depth:
                return
            names[int(block.group(1))] = mechanism
            options_per_block[int(block.group(1))] = dict(options)
        config["attention"] = names[0] if len(set(names)) == 1 else names
        config.pop("attention_options", None)
        if any(options_per_block):
            if not takes_options:
                return
            same = all(o == options_per_block[0] for o in options_per_block)
            config["attention_options"] = options_per_block[0] if same else [o or None for o in options_per_block]
        try:
            with torch.device("meta"):
                type(self)(**config)
        except (TypeError, ValueError):
            return  # the family cannot express it: saving refuses, naming the difference
        self.config = config


def _config_json(model: nn.Module, extra: dict | None) -> dict:
    config = {
        "format_version": FORMAT_VERSION,
        "class": type(model).__name__,
        "module": type(model).__module__,  # named in the error where the class is not registered; never imported
        "architecture": type(model).__name__,
        "model_name": getattr(model, "model_name", None),
        "args": model.config,
    }
    if type(model).__name__ in MODEL_TYPES:
        config["model_type"] = MODEL_TYPES[type(model).__name__]
    if getattr(model, "base_model", None):  # fine-tuned from this checkpoint (zoo/training/source.py)
        config["base_model"] = model.base_model
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


def save_pretrained(model: nn.Module, path, card: str | None = None, extra: dict | None = None,
                    overwrite: bool = True) -> Path:
    """Write a release folder atomically (zoo/utils/atomic.py): built beside `path`, then swapped in.

    Only an absent path, an empty folder or a release folder is ever replaced (the last only
    with overwrite=True); anything else is refused, naming the path.

    The folder holds config.json (the class and its constructor arguments, JSON), model.safetensors (the
    weights; tied tensors stored once) and README.md (the model card); `zoo.load(path)` reads it back.

    Args:
        model: the model to save, one of zoo's families (it keeps its constructor arguments in `config`).
        path (str | os.PathLike): the release folder to write: absent, an empty folder or a release folder
            zoo wrote.
        card: the README.md text; default None: a model card generated from the model and its config.
        extra: more keys for config.json (e.g. "metrics", "training"), JSON-serializable; default None.
        overwrite: replace an existing release folder at `path` (default True); False refuses with a
            FileExistsError instead.

    Returns:
        The path of the written folder.
    """
    from safetensors.torch import save_model

    check_config_builds(model)
    path = Path(path)
    config = _config_json(model, extra)

    def fill(staging: Path) -> None:
        (staging / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        save_model(model, str(staging / WEIGHTS))  # drops tied duplicates; load_release restores them
        (staging / CARD).write_text(card if card is not None else model_card(model, path.name, config, path))

    return replace_folder(path, fill, is_release_folder, "release folder", overwrite)


def check_config_builds(model: nn.Module) -> None:
    """Refuse, before anything is written, a model whose weights are not those its config builds (a block
    replaced after construction): its release folder would never load. The config's model is built on the
    meta device (shapes, no storage) and the state dicts' names and shapes compared."""
    owner = type(model).__name__
    config = getattr(model, "config", None)
    if not isinstance(config, dict):
        raise TypeError(f"save_pretrained needs a model that keeps its constructor arguments in `config` (zoo's "
                        f"families do), got {owner} without one")
    try:
        with torch.device("meta"):
            built = type(model)(**config)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{owner} cannot be saved: its config does not build it again ({e})") from None
    own_modules, built_modules = module_settings(model), module_settings(built)
    for name in [*own_modules, *(k for k in built_modules if k not in own_modules)]:
        if own_modules.get(name) != built_modules.get(name):
            raise ValueError(
                f"{owner} cannot be saved: {name} is {_difference(own_modules.get(name), built_modules.get(name))}"
                f", so the folder would load as another model. A module "
                "replaced or changed after construction does this; zoo.attention.swap records what a block's "
                "attention became where the family's arguments (attention=[...], attention_options=[...]) can "
                "say it. Construct the model with those arguments instead, then train or load weights into it")
    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    want = {k: tuple(v.shape) for k, v in built.state_dict().items()}
    differing = [f"{k}: the model has {own[k] if k in own else 'none'}, its config builds "
                 f"{want[k] if k in want else 'none'}" for k in [*own, *(k for k in want if k not in own)]
                 if own.get(k) != want.get(k)]
    if differing:
        raise ValueError(f"{owner} cannot be saved: its weights no longer match what its config builds (first "
                         f"difference: {differing[0]}), so the folder would never load; a module replaced after "
                         f"construction does this. Construct the model with the arguments instead (e.g. "
                         f"attention=[...], attention_options={{...}}), then train or load weights into it")


_PLAIN = (bool, int, float, str, type(None))


def _is_plain(value) -> bool:
    return isinstance(value, _PLAIN) or isinstance(value, (tuple, list)) and all(isinstance(v, _PLAIN) for v in value)


def module_settings(model: nn.Module) -> dict[str, tuple]:
    """Every submodule by name as (its class, its settings): the plain values it holds (numbers, strings, flags,
    tuples of them, such as a layer's causal flag, heads or clipped softmax's alpha), which its weights do not
    carry. Two models with the same settings and weights compute the same function; a swapped mechanism
    with softmax's weight shapes, which a comparison of shapes misses, differs here in its class or flags."""
    settings = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if not name:
            continue  # the model's own attributes are its config's
        values = tuple(sorted((key, tuple(value) if isinstance(value, list) else value)
                              for key, value in vars(module).items()
                              if not key.startswith("_") and key != "training" and _is_plain(value)))
        settings[name] = (f"{type(module).__module__}.{type(module).__qualname__}", values)
    return settings


def _difference(own: tuple | None, built: tuple | None) -> str:
    """How a module of the model differs from the one its config builds, in a few words."""
    if own is None or built is None:
        return "absent, but its config builds one" if own is None else "not built by its config"
    def named(setting: tuple) -> str:
        cls = setting[0].rpartition(".")[2]
        return f"{'an' if cls[0] in 'AEIOU' else 'a'} {cls}"

    if own[0] != built[0]:
        return f"{named(own)}, but its config builds {named(built)}"
    mine, theirs = dict(own[1]), dict(built[1])
    keys = [k for k in sorted({*mine, *theirs}) if mine.get(k) != theirs.get(k)]
    return (f"{named(own)} with " + ", ".join(f"{k}={mine.get(k)!r}" for k in keys)
            + ", but its config builds " + ", ".join(f"{k}={theirs.get(k)!r}" for k in keys))


def _aliases(model: nn.Module) -> dict[str, set[str]]:
    """For each state-dict name, every name that shares its storage (tied weights), itself included."""
    by_storage: dict[int | str, set[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        # empty tensors (elita's pos_dim=0) all report data pointer 0: they share nothing
        by_storage.setdefault(tensor.data_ptr() if tensor.numel() else name, set()).add(name)
    return {name: group for group in by_storage.values() for name in group}


def plan_weights(model: nn.Module, shapes: dict[str, tuple[int, ...]], file: Path, strict: bool = True,
                 drop_prefixes: tuple[str, ...] = ()) -> list[str]:
    """The names of the tensors to read from `file` (declared with `shapes`) into `model`, checked from the header
    alone: in strict mode every problem is reported in one error, before any tensor data is read."""
    shapes = {k: v for k, v in shapes.items() if not k.startswith(drop_prefixes)}
    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    aliases = _aliases(model)  # safetensors keeps one name of each tied group
    missing = [k for k in own if not (aliases[k] & shapes.keys()) and not k.startswith(drop_prefixes)]
    unexpected = [k for k in shapes if k not in own]
    mismatched = [f"{k}: checkpoint {v}, model {own[k]}" for k, v in shapes.items() if k in own and v != own[k]]
    if strict and (missing or unexpected or mismatched):
        lines = [f"the weights in {file} do not fit {type(model).__name__}:"]
        for title, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", mismatched)):
            if items:
                lines.append(f"  {title} ({len(items):,}): " + _listed(items))
        raise ValueError("\n".join(lines))
    keep = [k for k, v in shapes.items() if k in own and v == own[k]]
    if not keep and own:
        raise ValueError(f"none of the tensors in {file} fit {type(model).__name__} (it expects names such as "
                         f"{', '.join(list(own)[:3])}): strict=False loads part of a model's weights, never none")
    return keep


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], file: Path) -> None:
    """Load the tensors `plan_weights` chose; tied weights stored twice must agree."""
    for group in {frozenset(g) for g in _aliases(model).values() if len(g) > 1}:
        stored = sorted(group & state.keys())
        for other in stored[1:]:
            if not torch.equal(state[stored[0]], state[other]):
                raise ValueError(f"{file}: {stored[0]} and {other} are tied in {type(model).__name__} (one tensor), "
                                 "but the file holds two different values for them")
    model.load_state_dict(state, strict=False)


def _stored_grid(model: nn.Module, shapes: dict[str, tuple[int, ...]], file: Path) -> tuple[int, int] | None:
    """The patch grid of a learned position embedding stored for another image size than the model's (zoo.load
    with img_size=...), which loading resamples as timm does; None where the stored one fits as it is."""
    own, stored = getattr(model, "pos_embed", None), shapes.get("pos_embed")
    if not isinstance(own, nn.Parameter) or stored is None or tuple(stored) == tuple(own.shape) \
            or not hasattr(model, "stored_grid"):
        return None
    try:
        return model.stored_grid(tuple(stored))
    except ValueError as e:
        raise ValueError(f"{file}: {e}") from None


def _open_weights(name: str, f) -> bytes | int:
    """read_folder's reader: config.json's bytes, and for the weights a handle of their own (read later, in part)."""
    return os.dup(f.fileno()) if name == WEIGHTS else f.read()


def load_release(path, strict: bool = True, max_parameters: int | None = None, **overrides) -> nn.Module:
    """A model from a release folder, read as one version even while another process replaces it."""
    path = Path(path)
    if not (path / CONFIG).is_file() or not (path / WEIGHTS).is_file():
        found = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
        raise FileNotFoundError(f"a release folder needs {CONFIG} and {WEIGHTS}; {path} holds {found or 'nothing'}")
    files = read_folder(path, [CONFIG, WEIGHTS], _open_weights)
    weights = files[WEIGHTS]
    try:
        config = read_config(files[CONFIG], path / CONFIG)
        cls = ARCHITECTURES[config["class"]]
        args = {**config["args"], **overrides}
        new_head = "num_classes" in overrides and overrides["num_classes"] != config["args"].get("num_classes")
        names = args.get("label_names")
        if new_head and isinstance(names, list) and len(names) != overrides["num_classes"]:
            args["label_names"] = None  # the names of the old classifier's classes (timm passes them back in)
        # micro's num_queries passed as zoo.load's keyword: say it goes in attention_options, as zoo.create does
        check_overrides(Entry(path.name, config.get("family", ""), cls, config["args"]), overrides)
        try:  # the arguments come from config.json: say so in their errors
            check_budget(cls, args, max_parameters)
            model = cls(**args)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{path / CONFIG}: {e}") from None
        shapes = read_header(weights, path / WEIGHTS)
        stored_grid = _stored_grid(model, shapes, path / WEIGHTS)
        if stored_grid:  # checked and planned at the model's own size, resampled once read
            shapes = {**shapes, "pos_embed": tuple(model.pos_embed.shape)}
        drop = ("head.",) if new_head else ()  # a new classifier, as timm does
        keep = plan_weights(model, shapes, path / WEIGHTS, strict=strict, drop_prefixes=drop)
        state = read_tensors(weights, keep, path / WEIGHTS)
        if stored_grid and "pos_embed" in state:
            state["pos_embed"] = model.resample_pos_embed(state["pos_embed"], stored_grid)
            logging.getLogger(__name__).info("%s: pos_embed resampled from a %dx%d grid of patches to %dx%d, as timm "
                                             "does for another image size", path, *stored_grid, *model.grid)
        load_weights(model, state, path / WEIGHTS)
        left = [k for k, group in _aliases(model).items() if not group & set(keep)]
        if left:  # strict=False, or a new classifier: never without a word
            logging.getLogger(__name__).warning("%s: %d tensor(s) left at their random initialization: %s", path,
                                                len(left), _listed(left))
    finally:
        os.close(weights)
    model.model_name = config.get("model_name")
    model.base_model = config.get("base_model")
    return model.eval()


def load(source: str | os.PathLike, strict: bool = True, *, token: str | bool | None = None,
         cache_dir: str | os.PathLike | None = None, local_files_only: bool = False,
         max_parameters: int | None = None, **overrides) -> nn.Module:
    """A model in eval mode from a registered name (`name` or `name.tag`), a release folder or the Hub.

    `hf-hub:org/repo[@revision]` downloads through huggingface_hub's cache; token, cache_dir
    and local_files_only are passed on to it (and mean nothing for the other sources).
    A config whose model would exceed max_parameters (default 1e9, or $ZOO_MAX_PARAMETERS)
    is refused before anything is allocated.

    Args:
        source: a registered model with shipped weights, "name" or "name.tag" (e.g. "micro-vit-tiny.mnist";
            without a tag, the model's default); a release folder (config.json and model.safetensors); or
            "hf-hub:org/repo" or "hf-hub:org/repo@revision" on the Hugging Face Hub.
        strict: require the weights to fit the model exactly, every tensor present with its shape (default
            True); False loads those that fit and logs a warning naming the tensors left at random.
        token: the Hub token, only for hf-hub sources: a string, True for the one saved by `hf auth login`,
            False for none; default None: huggingface_hub's default. Never printed or stored.
        cache_dir: huggingface_hub's cache folder, only for hf-hub sources; default None: its default.
        local_files_only: only for hf-hub sources: use the cache, never the network (default False).
        max_parameters: the largest model to build, an int; default None: 1e9, or $ZOO_MAX_PARAMETERS.
        **overrides (Any): constructor arguments that replace the config's, e.g. num_classes=5 for a new, randomly
            initialized classifier head (its label_names then dropped), dynamic_img_size=True.

    Returns:
        The model, in eval mode, with `model_name` set.
    """
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"zoo.load expects a model name, a folder or 'hf-hub:org/repo', got {type(source).__name__}")
    text = str(source)
    if text.startswith("hf-hub:"):
        folder = download(text, token=token, cache_dir=cache_dir, local_files_only=local_files_only,
                          max_parameters=max_parameters)
        return load_release(folder, strict=strict, max_parameters=max_parameters, **overrides)
    if Path(text).is_dir():
        return load_release(text, strict=strict, max_parameters=max_parameters, **overrides)
    return load_release(checkpoint_folder(text), strict=strict, max_parameters=max_parameters, **overrides)


def rewrite_card(folder) -> None:
    """Write a release folder's README.md again from its config.json (atomically)."""
    folder = Path(folder)
    config = json.loads((folder / CONFIG).read_text())
    write_text_atomic(folder / CARD, model_card(load_release(folder), folder.name, config, folder))
