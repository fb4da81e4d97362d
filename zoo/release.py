"""Release folders: config.json + model.safetensors + README.md, written atomically and loaded strictly.

A release folder is all a model needs to be rebuilt bit for bit: the architecture and
every constructor argument (JSON), the weights (safetensors, never pickle), and a
model card. `zoo.load` accepts a registered name (with an optional `.tag`), a folder,
or `hf-hub:org/repo[@revision]`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from torch import nn

from zoo.card import model_card

CONFIG, WEIGHTS, CARD = "config.json", "model.safetensors", "README.md"
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

    def save_pretrained(self, path: str | os.PathLike, card: str | None = None, extra: dict | None = None) -> Path:
        return save_pretrained(self, path, card=card, extra=extra)


def _config_json(model: nn.Module, extra: dict | None) -> dict:
    config = {
        "format_version": FORMAT_VERSION,
        "class": type(model).__name__,
        "architecture": type(model).__name__,
        "model_name": getattr(model, "model_name", None),
        "args": model.config,
    }
    cfg = getattr(model, "pretrained_cfg", None)
    if cfg is not None and config["model_name"]:
        # The keys timm reads from a Hub config.json: `timm.create_model("hf-hub:org/repo")`
        # builds `architecture` from timm's registry with `model_args`.
        config["architecture"] = config["model_name"].replace("-", "_")
        config["model_args"] = model.config
        config["num_classes"] = model.num_classes
        config["num_features"] = model.num_features
        config["pretrained_cfg"] = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}
    return {**config, **(extra or {})}


def save_pretrained(model: nn.Module, path, card: str | None = None, extra: dict | None = None) -> Path:
    """Write a release folder atomically: build it beside `path`, then swap it in with renames."""
    from safetensors.torch import save_model

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    config = _config_json(model, extra)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        (staging / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
        save_model(model, str(staging / WEIGHTS))  # drops tied duplicates; load_release restores them
        (staging / CARD).write_text(card if card is not None else model_card(model, path.name, config))
        old = None
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            path.rename(old)
        staging.rename(path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


def write_text_atomic(path, text: str) -> Path:
    """`text` written to a temporary file beside `path`, then renamed over it: never half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path, data) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def _aliases(model: nn.Module) -> dict[str, set[str]]:
    """For each state-dict name, every name that shares its storage (tied weights), itself included."""
    by_storage: dict[int, set[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        by_storage.setdefault(tensor.data_ptr(), set()).add(name)
    return {name: group for group in by_storage.values() for name in group}


def load_weights(model: nn.Module, file: Path, strict: bool = True, drop_prefixes: tuple[str, ...] = ()) -> None:
    """Load safetensors weights; in strict mode every problem is reported in one error."""
    from safetensors.torch import load_file

    state = load_file(str(file))
    state = {k: v for k, v in state.items() if not k.startswith(drop_prefixes)}
    own = model.state_dict()
    aliases = _aliases(model)  # safetensors keeps one name of each tied group
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
    model.load_state_dict(state, strict=False)


def load_release(path, strict: bool = True, **overrides) -> nn.Module:
    from zoo.registry import ARCHITECTURES, _entries

    path = Path(path)
    if not (path / CONFIG).is_file() or not (path / WEIGHTS).is_file():
        found = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
        raise FileNotFoundError(f"a release folder needs {CONFIG} and {WEIGHTS}; {path} holds {found or 'nothing'}")
    config = json.loads((path / CONFIG).read_text())
    _entries()  # make sure every architecture is registered
    arch = config.get("class")
    if arch not in ARCHITECTURES:
        raise ValueError(f"{path / CONFIG} names class {arch!r}; zoo knows {sorted(ARCHITECTURES)}")
    args = {**config["args"], **overrides}
    model = ARCHITECTURES[arch](**args)
    model.model_name = config.get("model_name")
    drop = ()
    if "num_classes" in overrides and overrides["num_classes"] != config["args"].get("num_classes"):
        drop = ("head.",)  # a new classifier, as timm does
    load_weights(model, path / WEIGHTS, strict=strict, drop_prefixes=drop)
    return model.eval()


def load(source: str | os.PathLike, strict: bool = True, *, token: str | bool | None = None,
         cache_dir: str | os.PathLike | None = None, local_files_only: bool = False, **overrides) -> nn.Module:
    """A model in eval mode from a registered name (`name` or `name.tag`), a release folder or the Hub.

    `hf-hub:org/repo[@revision]` downloads through huggingface_hub's cache; token, cache_dir
    and local_files_only are passed on to it (and mean nothing for the other sources).
    """
    text = str(source)
    if text.startswith("hf-hub:"):
        from zoo.hub import download

        folder = download(text, token=token, cache_dir=cache_dir, local_files_only=local_files_only)
        return load_release(folder, strict=strict, **overrides)
    if Path(text).is_dir():
        return load_release(text, strict=strict, **overrides)
    return load_release(checkpoint_folder(text), strict=strict, **overrides)


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
