"""Why the clipped-softmax control can fail to train: the attention rows it leaves empty.

    python bench/clipped_rows.py     # after `python bench/leaderboard.py --only 'mnist-controls/*'`

clip((zeta - gamma) softmax + gamma, 0, 1) with gamma = -alpha / T turns a uniform row (1/T each)
into (1 - alpha + alpha / T) / T, below zero for alpha > T / (T - 1), and the clip passes no
gradient there. A fresh model attends almost uniformly, so with our alpha = 4 almost every row
starts empty. This script measures, per block of clipped-vit-tiny, the share of rows whose
weights are all zero and the share of weights above zero, on the first 512 MNIST test images:
for fresh models (torch.manual_seed(s), then the recipe's construction) and for the leaderboard's
trained seeds. It prints a table and writes bench/results/clipped_rows.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.common import print_table, write_json  # noqa: E402
from bench.leaderboard import GROUPS, Run  # noqa: E402

MODEL = "clipped-vit-tiny"


def first_test_images(data_root: Path, count: int = 512) -> torch.Tensor:
    from zoo.data import MNIST

    dm = MNIST(root=str(data_root), batch_size=count, download=False)
    dm.setup("test")
    return next(iter(dm.test_dataloader()))[0]


@torch.no_grad()
def empty_rows(model, images) -> list[dict]:
    """Per attention layer: the share of (image, head, query) rows with every weight 0, and of weights > 0."""
    from zoo.viz import capture

    with capture(model.eval()) as maps:
        model(images)
    return [{"layer": m.layer, "empty rows": float((m.weights.amax(-1) == 0).float().mean()),
             "weights > 0": float((m.weights > 0).float().mean())} for m in maps]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", type=Path, default=Path("../shared/data"))
    args = parser.parse_args()
    import zoo

    torch.set_num_threads(1)
    group = next(g for g in GROUPS if g.name == "mnist-controls")
    recipe = yaml.safe_load((REPO / "recipes" / f"{group.recipe_of}.{group.tag}.yaml").read_text())
    overrides = recipe["model"]["init_args"].get("model_overrides") or {}  # what the controls trained with
    images = first_test_images(args.data_root)
    rows = []
    for seed in group.seeds:
        torch.manual_seed(seed)
        rows += [{"model": f"fresh, seed {seed}", **r} for r in empty_rows(zoo.create(MODEL, **overrides), images)]
    for seed in group.seeds:
        release = Run(group, MODEL, seed).folder / "release"
        if release.is_dir():
            rows += [{"model": f"trained, seed {seed}", **r} for r in empty_rows(zoo.load(release), images)]
        else:
            print(f"skipped {release}: not trained yet")
    print_table(f"{MODEL}: attention rows the clip empties (first {len(images)} MNIST test images)", rows,
                ["model", "layer", "empty rows", "weights > 0"])
    write_json("clipped_rows", {"command": "python bench/clipped_rows.py", "model": MODEL,
                                "images": len(images), "rows": rows})


if __name__ == "__main__":
    main()
