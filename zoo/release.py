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
import math
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


def _config_json(model: nn.Module, extra: dict | None) -> dict:
    config = {
        "format_version": FORMAT_VERSION,
        "class": type(model).__name__,
        "architecture": type(model).__name__,
        "model_name": getattr(model, "model_name", None),
        "args": model.config,
    }
    if getattr(model, "base_model", None):  # fine-tuned from this checkpoint (zoo/training/source.py)
        config["base_model"] = model.base_model
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
        config = parse_json((path / CONFIG).read_bytes(), path / CONFIG)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and "format_version" in config and "class" in config


def save_pretrained(model: nn.Module, path, card: str | None = None, extra: dict | None = None,
                    overwrite: bool = True) -> Path:
    """Write a release folder atomically (zoo/atomic.py): built beside `path`, then swapped in.

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

    path = Path(path)
    config = _config_json(model, extra)

    def fill(staging: Path) -> None:
        (staging / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        save_model(model, str(staging / WEIGHTS))  # drops tied duplicates; load_release restores them
        (staging / CARD).write_text(card if card is not None else model_card(model, path.name, config, path))

    return replace_folder(path, fill, is_release_folder, "release folder", overwrite)


def write_json_atomic(path, data) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def _aliases(model: nn.Module) -> dict[str, set[str]]:
    """For each state-dict name, every name that shares its storage (tied weights), itself included."""
    by_storage: dict[int, set[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        by_storage.setdefault(tensor.data_ptr(), set()).add(name)
    return {name: group for group in by_storage.values() for name in group}


MAX_DEPTH = 32  # zoo's configs nest 3 levels; json itself fails (RecursionError) near 1000
MAX_DIGITS = 100  # Python refuses to read integers of more than 4300 digits, without naming the field


class _LongInteger(str):
    """An integer literal too long to be a config value, kept as text until its field is known."""


def parse_json(data: bytes | str, file: Path):
    """A JSON document, refused in one line naming the file (and the field, for an overlong integer)."""
    try:
        value = json.loads(data, parse_int=lambda text: _LongInteger(text) if len(text) > MAX_DIGITS else int(text))
    except UnicodeDecodeError:
        raise ValueError(f"{file} is not a UTF-8 text file; expected zoo's config.json") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{file} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}") from None
    except RecursionError:
        raise ValueError(f"{file} nests its JSON too deeply (more than {MAX_DEPTH} levels); "
                         "expected zoo's config.json") from None
    pending = [(value, "", 1)]  # walked without recursion: the depth is not known to be small yet
    while pending:
        item, where, depth = pending.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"{file} nests its JSON {depth} levels deep at {where or 'the top'}; zoo reads at most "
                             f"{MAX_DEPTH} (expected zoo's config.json)")
        if isinstance(item, _LongInteger):
            raise ValueError(f"{file}: {where or 'the document'} is an integer of {len(item.lstrip('-')):,} digits; "
                             f"zoo reads integers of at most {MAX_DIGITS} digits")
        children = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        pending += [(child, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}" if where else key,
                     depth + 1) for key, child in children]
    return value


def read_config(data: bytes, file: Path) -> dict:
    """config.json's object, refused with the file and field named when it is not one zoo can read."""
    from zoo.registry import ARCHITECTURES, _entries

    config = parse_json(data, file)
    if not isinstance(config, dict):
        raise ValueError(f"{file} must hold a JSON object, got a JSON {type(config).__name__}")
    version = config.get("format_version")
    if version is None:
        raise ValueError(f"{file} has no format_version: it was not written by zoo's save_pretrained")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"{file}: format_version must be a positive integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise ValueError(f"{file} has format_version {version}, written by a newer zoo; this zoo "
                         f"reads format_version {FORMAT_VERSION}: upgrade zoo (pip install -U attention-zoo)")
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


FLOAT_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}  # with their sizes in bytes
MAX_HEADER = 100_000_000  # safetensors' own limit on the header
SHOWN = 10  # names listed in an error; the rest are counted


def _listed(items: list[str]) -> str:
    more = f"; and {len(items) - SHOWN:,} more" if len(items) > SHOWN else ""
    return "; ".join(items[:SHOWN]) + more


def read_header(fd: int, file: Path) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor a safetensors file declares, read from its header alone (os.pread: no tensor
    data is read). Refused with a reason when the file is truncated, not safetensors, declares tensors it
    does not hold, or anything but floating-point tensors (zoo's weights are all floating point)."""
    size = os.fstat(fd).st_size
    if size < 8:
        raise ValueError(f"{file} is not a safetensors file: {size} bytes, too short for a header")
    length = int.from_bytes(os.pread(fd, 8, 0), "little")
    if length > size - 8:
        raise ValueError(f"{file} is truncated or not a safetensors file: its header should take {length:,} bytes, "
                         f"the file holds {size - 8:,} after the length")
    if length > MAX_HEADER:
        raise ValueError(f"{file} is not a safetensors file zoo reads: its header takes {length:,} bytes, "
                         f"more than safetensors' limit of {MAX_HEADER:,}")
    try:
        header = json.loads(os.pread(fd, length, 8))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ValueError(f"{file} is not a safetensors file: its header is not JSON") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file} is not a safetensors file: its header is not a JSON object")
    shapes, data_size, end = {}, size - 8 - length, 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info.get("dtype") if isinstance(info, dict) else None
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"{file}: tensor {name!r} is stored as {dtype}; zoo's weights are floating point "
                             f"({', '.join(FLOAT_DTYPES)}), and other types are never cast silently")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not (_whole_numbers(shape) and _whole_numbers(offsets) and len(offsets) == 2
                and offsets[1] - offsets[0] == math.prod(shape) * FLOAT_DTYPES[dtype]):
            raise ValueError(f"{file} is not a valid safetensors file: tensor {name!r} declares shape {shape} "
                             f"and data offsets {offsets}, which do not agree")
        shapes[name], end = tuple(shape), max(end, offsets[1])
    if end > data_size:
        raise ValueError(f"{file} is truncated or not a safetensors file: its header declares {end:,} bytes of "
                         f"tensors, the file holds {data_size:,} after the header")
    return shapes


def _whole_numbers(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)


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


def read_tensors(fd: int, names: list[str], file: Path) -> dict[str, torch.Tensor]:
    """The tensors `names` of the open safetensors file `fd`, mapped from it (mmap) rather than read whole: only
    these tensors' bytes are ever touched. Each must hold finite values."""
    from safetensors import SafetensorError, safe_open

    # The same open file by name (a magic link on Linux, /dev/fd elsewhere): the version read_folder opened.
    source = next((p for p in (f"/proc/self/fd/{fd}", f"/dev/fd/{fd}") if os.path.exists(p)), None)
    try:
        if source is None:  # no such names for open files on this system: read the file through the handle
            from safetensors.torch import load

            everything = load(os.pread(fd, os.fstat(fd).st_size, 0))
            state = {name: everything[name] for name in names}
        else:
            with safe_open(source, framework="pt") as f:
                state = {name: f.get_tensor(name) for name in names}
    except SafetensorError as e:
        raise ValueError(f"{file} is not a valid safetensors file: {e}") from None
    for name, tensor in state.items():  # a NaN weight makes every output NaN: say so at load, not later
        if not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{file}: tensor {name!r} holds NaN or infinite values (a diverged or damaged "
                             "checkpoint); zoo loads only finite weights")
    return state


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
    from zoo.models.arguments import check_budget
    from zoo.registry import ARCHITECTURES

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
        from zoo.hub import download

        folder = download(text, token=token, cache_dir=cache_dir, local_files_only=local_files_only,
                          max_parameters=max_parameters)
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
