"""Measure a release folder's metrics again, on the data its card names, and compare with the card."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

from zoo.release import CONFIG, checkpoint_roots, load

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
    module, _, cls = data["class_path"].rpartition(".")
    if not module.startswith("zoo.data"):
        raise ValueError(f"refusing to import {data['class_path']!r}: only zoo.data modules are rebuilt")
    if "file" in data and (Path(data["file"]).is_absolute() or ".." in Path(data["file"]).parts):
        raise ValueError(f"the data file must lie under the data root, got {data['file']!r}")
    location = {"path": str(Path(data_root) / data["file"])} if "file" in data else {"root": str(data_root)}
    return getattr(importlib.import_module(module), cls)(**data["init_args"], **location)


def measure(folder: str | os.PathLike, data_root: str | os.PathLike) -> dict:
    """The metrics of the release at `folder`, measured now, in float32, the way `export` measured them."""
    from zoo.training import task_class

    config = json.loads((Path(folder) / CONFIG).read_text())
    task = task_class(config["model_name"])(model_name=config["model_name"], model_overrides=config["args"])
    task.model = load(folder)
    datamodule = datamodule_for(config, data_root)
    datamodule.setup("test")
    return task.evaluate(datamodule.test_dataloader())


def compare(card: dict, measured: dict, tolerance: float = TOLERANCE_POINTS) -> list[dict]:
    rows = []
    for name in CHECKED:
        if name in card:
            diff = 100 * abs(measured[name] - card[name])
            rows.append({"metric": name, "card": card[name], "measured": measured[name],
                         "diff_points": round(diff, 4), "ok": diff <= tolerance})
    return rows


def check(folder: str | os.PathLike, data_root: str | os.PathLike) -> list[dict]:
    config = json.loads((Path(folder) / CONFIG).read_text())
    return compare(config.get("metrics") or {}, measure(folder, data_root))
