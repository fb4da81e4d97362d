"""Test accuracy through timm's data pipeline: timm's defaults before zoo registered its configs
(crop_pct=0.875, bicubic) against each checkpoint's own config (crop_pct=1.0), and model.preprocess.

    python bench/timm_pipeline.py [--data-root ../shared/data]

Writes bench/results/timm_pipeline.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import timm  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402
from PIL import Image  # noqa: E402

import zoo  # noqa: E402,F401  (registers the models with timm)
from bench.common import print_table, write_json  # noqa: E402

CHECKPOINTS = ["vit_tiny.mnist", "micro_vit_tiny.mnist", "quiet_vit_tiny.fashion"]


def accuracy(model, x: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.no_grad():
        return 100 * (model(x).argmax(-1) == labels).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", default=os.environ.get("ZOO_DATA", "../shared/data"))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    rows = []
    for name in CHECKPOINTS:
        dataset = torchvision.datasets.FashionMNIST if "fashion" in name else torchvision.datasets.MNIST
        test = dataset(args.data_root, train=False, download=False)
        images = [Image.fromarray(i.numpy(), mode="L") for i in test.data]
        model = timm.create_model(name, pretrained=True).eval()
        cfg = timm.data.resolve_model_data_config(model)
        row = {"checkpoint": name}
        for label, config in (("old_defaults", dict(cfg, crop_pct=0.875, interpolation="bicubic")),
                              ("model_config", cfg)):
            transform = timm.data.create_transform(**config)
            row[label] = accuracy(model, torch.stack([transform(i) for i in images]), test.targets)
        row["preprocess"] = accuracy(model, model.preprocess(test.data.numpy()[:, None]), test.targets)
        rows.append(row)
        print(row, flush=True)
    print_table("Test accuracy (%) through timm's pipeline", rows,
                ["checkpoint", "old_defaults", "model_config", "preprocess"])
    print(f"\nwrote {write_json('timm_pipeline', {'command': 'python bench/timm_pipeline.py', 'rows': rows})}")


if __name__ == "__main__":
    main()
