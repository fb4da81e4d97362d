"""Measure a release folder's metrics again, on the data its card names, and compare with the card."""

from __future__ import annotations

import importlib
import inspect
import json
import os
from pathlib import Path

import torch

from zoo.models.pretrained import load
from zoo.models.registry import checkpoint_roots
from zoo.models.release_files import CONFIG, WEIGHTS, is_release_folder
from zoo.utils.atomic import check_parents

# Metrics that a check compares; "points" are hundredths (percentage points for accuracy).
CHECKED = ("test/acc", "test/acc_top5", "test/auroc", "val/loss", "val/bpc")
TOLERANCE_POINTS = 0.2


def shipped_folders() -> list[Path]:
    return sorted({p.parent for root in checkpoint_roots() for p in root.glob(f"*/{CONFIG}")}, key=lambda p: p.name)


def datamodule_for(config: dict, data_root: str | os.PathLike):
    """The data module a release was evaluated on, rebuilt from its config.json over `data_root`."""
    data = (config.get("training") or {}).get("data") or {}
    if "class_path" not in data:
        raise ValueError("this release records no data module (it was not exported by `zoo fit`); nothing to check")
    module, _, name = data["class_path"].rpartition(".")
    if not module.startswith("zoo.data"):
        raise ValueError(f"refusing to import {data['class_path']!r}: only zoo.data modules are rebuilt")
    if "file" in data and (Path(data["file"]).is_absolute() or ".." in Path(data["file"]).parts):
        raise ValueError(f"the data file must lie under the data root, got {data['file']!r}")
    cls = getattr(importlib.import_module(module), name)
    takes_root = "root" in inspect.signature(cls).parameters  # the standard library's source needs no root
    location = ({"path": str(Path(data_root) / data["file"])} if "file" in data
                else {"root": str(data_root)} if takes_root else {})
    init_args = dict(data["init_args"])
    workers = init_args.get("num_workers")
    if isinstance(workers, int) and not isinstance(workers, bool):  # a config may ask for 64; fork no more than fit
        init_args["num_workers"] = max(0, min(workers, cores()))
    return cls(**init_args, **location)


def data_samples(config: dict, data_root, count: int) -> torch.Tensor:
    """The first `count` inputs of the data the release was evaluated on (test split, prepared as in training),
    from `data_root` as it is: nothing is downloaded."""
    datamodule = datamodule_for(config, data_root)
    if hasattr(datamodule, "download"):  # pictures read data that is there; they never fetch it
        datamodule.download = False
    datamodule.setup("test")
    x = next(iter(datamodule.test_dataloader()))[0]
    return x[:count]


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def prepared_data(folder: str | os.PathLike, data_root: str | os.PathLike):
    """(config, test data set up) of the release at `folder`, from `data_root` as it is: a check reads the
    data that is there and never downloads, so a missing data set is refused in one line naming it and the root
    (and nothing is created there)."""
    config = json.loads((Path(folder) / CONFIG).read_text())
    try:
        datamodule = datamodule_for(config, data_root)
        if hasattr(datamodule, "download"):
            datamodule.download = False
        datamodule.setup("test")
    except FileNotFoundError:
        name = ((config.get("training") or {}).get("data") or {}).get("name") or "its"
        raise FileNotFoundError(f"{Path(folder).name}: the {name} data is not under the data root {data_root}; "
                                "give --data-root the folder that holds it (zoo check never downloads)") from None
    from zoo.data.sequences import STDLIB  # here: zoo.data imports Lightning, which `zoo viz` never needs

    data = (config.get("training") or {}).get("data") or {}
    here = datamodule.describe()["splits"] if data["init_args"].get("path") == STDLIB else None
    if here is not None and here != data.get("splits"):
        # the standard library differs between Python versions: another one's text would give other figures, a
        # failed check that is no fault of the weights
        raise ValueError(f"{Path(folder).name} was measured on {data.get('source')} ({data.get('splits')}); this "
                         f"Python's standard library is another text ({here}): check it with that Python")
    return config, datamodule


def measure(folder: str | os.PathLike, data_root: str | os.PathLike, prepared=None) -> dict:
    """The metrics of the release at `folder`, measured now, in float32, the way `export` measured them.
    prepared: what prepared_data gave, where the caller checked the data first."""
    from zoo.training import task_class

    config, datamodule = prepared or prepared_data(folder, data_root)
    task = task_class(config["model_name"])(model_name=config["model_name"], model_overrides=config["args"])
    task.model = load(folder)
    return task.evaluate(datamodule.test_dataloader())


def compare(card: dict, measured: dict, tolerance: float = TOLERANCE_POINTS) -> list[dict]:
    rows = []
    for name in CHECKED:
        if name in card:
            diff = 100 * abs(measured[name] - card[name])
            rows.append({"metric": name, "card": card[name], "measured": measured[name],
                         "diff_points": round(diff, 4), "ok": diff <= tolerance})
    return rows


def check(folder: str | os.PathLike, data_root: str | os.PathLike, prepared=None) -> list[dict]:
    config, datamodule = prepared or prepared_data(folder, data_root)
    return compare(config.get("metrics") or {}, measure(folder, data_root, (config, datamodule)))


def check_table_path(path, folders) -> Path:
    """`path` for `zoo check --json`, refused before anything is measured where writing the table would damage
    something: inside a release folder (one of `folders` or any other), a link, or over a file that is not a
    previous check table."""
    return json_output_path(path, is_check_table, "zoo check", "a zoo check table", folders)


def json_output_path(path, ours, command: str, what: str, folders=()) -> Path:
    """`path` for a command's `--json` output, refused before any work where writing there would damage
    something: inside a release folder (one of `folders` or any other), a link, a folder, or a file that
    `ours` does not recognise as `what`, the command's own earlier output."""
    path = Path(path)
    target = Path(os.path.realpath(path))
    checked = {Path(os.path.realpath(f)) for f in folders}
    for parent in target.parents:
        if parent in checked or is_release_folder(parent) or ((parent / CONFIG).is_file()
                                                              and (parent / WEIGHTS).is_file()):
            raise FileExistsError(f"--json {path} lies inside the release folder {parent}; writing the table there "
                                  "would change the release: choose a path outside it")
    if path.is_symlink():
        raise FileExistsError(f"--json {path} is a symbolic link; {command} writes only to a real path")
    if target.is_dir():
        raise IsADirectoryError(f"--json {path} is a folder; give a file name, e.g. {path / 'check.json'}")
    if target.exists() and not ours(target):
        raise FileExistsError(f"--json {path} exists and is not {what}; {command} replaces only its own "
                              "output: choose another path, or move the file away yourself")
    check_parents(path, "--json")
    return path


def is_check_table(path) -> bool:
    """Whether the file holds what `zoo check --json` writes: a JSON list of rows with a release, metric and ok."""
    try:
        rows = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(rows, list) and all(isinstance(r, dict) and {"release", "metric", "ok"} <= r.keys()
                                          for r in rows)
