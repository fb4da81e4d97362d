"""The leaderboard: every attention mechanism on the same recipe and budget, three seeds.

    python bench/leaderboard.py                      # run what is missing, two at a time, then print the table
    python bench/leaderboard.py --only 'text*' --jobs 1
    python bench/leaderboard.py --list               # the runs and their state, nothing run
    python bench/leaderboard.py --table              # the table from bench/results/leaderboard.json
    python bench/leaderboard.py --ship               # seed-0 releases -> checkpoints/, cards with the table

Each run is the recipe `recipes/<model>.<tag>.yaml` (the shipped checkpoint's recipe, so
that the seed-0 run *is* the checkpoint) under `zoo fit`, with `--seed_everything S
--data.init_args.seed S`: the seed draws the initialization, the data order and the
augmentation, and for the image sets also which 10% of the training split is held out for
validation (the test split is always the official one). A run writes its own folder under
bench/runs/leaderboard/ (logs, checkpoints, a timeline of validation metrics against wall
time, the exported release with its test metrics); when it ends, its record goes into
bench/results/leaderboard.json at once (written to a temporary file, then renamed). So
the script can be stopped at any time and started again: finished runs are skipped, and
a run that was cut off resumes from its last checkpoint (`--ckpt_path last`, which ends
bit for bit like an uninterrupted run).

Runs take one thread each (`--jobs` of them at a time, 2 by default on this 2-core
machine), so their times are wall-clock times with the other core busy.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, print_table  # noqa: E402
from zoo.training import leaderboard  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "bench" / "runs" / "leaderboard"
OUT = RESULTS / "leaderboard.json"
COMMAND = "python bench/leaderboard.py"
DATA_ROOT = Path(os.environ.get("ZOO_DATA", "../shared/data"))  # relative to the repository, where the runs start
IMAGE_MODELS = ("vit-tiny", "quiet-vit-tiny", "micro-vit-tiny", "fused-pool-vit-tiny")
TEXT_MODELS = ("gpt-tiny", "quiet-gpt-tiny", "micro-gpt-tiny", "elita-gpt-tiny")
# Outliers form during training: the text runs log kurtosis and max |x| every 100 steps (bench/outliers.py).
TRACK_OUTLIERS = ("--trainer.callbacks+=zoo.training.outliers.TrackOutliers", "--trainer.callbacks.every_n_steps",
                  "100", "--trainer.callbacks.path", "{folder}/outliers.jsonl")


@dataclass(frozen=True)
class Group:
    """One column of the table: models trained with one recipe each on one data set, several seeds."""

    name: str
    tag: str  # the recipe and checkpoint tag: recipes/<model>.<tag>.yaml
    models: tuple[str, ...]
    seeds: tuple[int, ...]
    metric: str  # the test metric the table reports
    higher_is_better: bool
    target: float | None = None
    val_metric: str | None = None  # what the timeline reads to time reaching the target
    extra: tuple[str, ...] = ()  # more `zoo fit` arguments; "{folder}" is the run's folder
    recipe_of: str | None = None  # train every model with this model's recipe (the outlier controls)
    ships: bool = True  # whether its seed-0 runs are the shipped checkpoints
    data: str = "root"  # "root": --data.init_args.root DATA; "text": the tiny-shakespeare file under it
    notes: str = ""

    def meets(self, value: float, target: float | None = None) -> bool:
        target = self.target if target is None else target
        return value >= target if self.higher_is_better else value <= target

    def data_arguments(self, data_root: Path) -> tuple[str, ...]:
        if self.data == "text":
            return "--data.init_args.path", str(Path(data_root) / "tinyshakespeare" / "input.txt")
        return "--data.init_args.root", str(data_root)

    def board(self, data_root: Path = DATA_ROOT) -> leaderboard.Group:
        """This group as zoo.training.leaderboard runs it."""
        return leaderboard.Group(
            self.name, f"recipes/{self.recipe_of or '{model}'}.{self.tag}.yaml", self.models, self.seeds,
            self.metric, self.higher_is_better, self.target, self.val_metric, self.extra, self.notes,
            set_model_name=self.recipe_of is not None, data=self.data_arguments(data_root))


GROUPS = (
    Group("mnist", "mnist", IMAGE_MODELS, (0, 1, 2), "test/acc", True, 0.99, "val/acc"),
    Group("fashion", "fashion", IMAGE_MODELS, (0, 1, 2), "test/acc", True, 0.90, "val/acc"),
    Group("shakespeare", "shakespeare", TEXT_MODELS, (0, 1, 2), "val/loss", False, data="text",
          extra=TRACK_OUTLIERS, notes="nanoGPT's CPU budget: context 64, batch 12, 2000 steps"),
    Group("shakespeare-controls", "shakespeare", ("clipped-gpt-tiny", "gated-gpt-tiny"), (0, 1, 2), "val/loss",
          False, data="text", extra=TRACK_OUTLIERS, recipe_of="gpt-tiny", ships=False,
          notes="the outlier study's positive controls, on gpt-tiny's recipe"),
    Group("adrenal", "adrenal", ("fused-3d-tiny",), (0, 1, 2), "test/auroc", True, 0.85, "val/auroc",
          notes="64³ volumes in 8³ patches, 40 epochs, the checkpoint with the best validation AUROC"),
    Group("shakespeare-4x", "shakespeare", TEXT_MODELS, (0,), "val/loss", False, data="text", ships=False,
          extra=("--data.init_args.train_samples", "96000", "--trainer.val_check_interval", "2000",
                 *TRACK_OUTLIERS),
          notes="the same recipe with 4x the steps (8000), one seed"),
    Group("shakespeare-small", "shakespeare", ("gpt-small", "quiet-gpt-small"), (0, 1, 2), "val/loss", False,
          data="text", recipe_of="gpt-tiny", ships=False,
          extra=("--data.init_args.train_samples", "48000", "--trainer.val_check_interval", "1000", *TRACK_OUTLIERS),
          notes="width 384, 6 blocks (10.7M parameters), 4000 steps: do outliers form at a larger scale?"),
    Group("mnist-controls", "mnist", ("clipped-vit-tiny", "gated-vit-tiny"), (0, 1, 2), "test/acc", True, 0.99,
          "val/acc", recipe_of="vit-tiny", ships=False,
          notes="the outlier study's positive controls, on vit-tiny's recipe"),
    Group("shakespeare-hybrids", "shakespeare", ("hybrid-micro-gpt-tiny", "hybrid-elita-gpt-tiny",
                                                 "hybrid-micro-conv-gpt-tiny", "hybrid-elita-conv-gpt-tiny",
                                                 "hybrid-elita-conv1-gpt-tiny", "incontext-gpt-tiny"), (0, 1, 2),
          "val/loss", False, data="text", extra=TRACK_OUTLIERS, notes="one softmax block among linear "
          "ones (with short convolutions in every block, in the first only, or none), and the in-context bias; "
          "the shakespeare group's recipe"),
    Group("shakespeare-yardsticks", "shakespeare", ("window-gpt-tiny", "gla-gpt-tiny", "deltanet-gpt-tiny",
                                                    "ssd-gpt-tiny"), (0, 1, 2), "val/loss", False, data="text",
          extra=TRACK_OUTLIERS, ships=False, notes="the field's yardsticks: a sliding window of 64 tokens (the whole "
          "context here), GLA, Gated DeltaNet and Mamba-2's SSD in every block; the shakespeare group's recipe"),
    Group("mnist-hybrids", "mnist", ("hybrid-micro-vit-tiny", "incontext-vit-tiny"), (0, 1, 2), "test/acc", True,
          0.99, "val/acc", notes="the image hybrid and the in-context bias on the MNIST recipe"),
)


class Run(leaderboard.Run):
    """A run of one of the groups above, in bench/runs/leaderboard/GROUP/MODEL/seedS."""

    def __init__(self, group: Group, model: str, seed: int, data_root: Path = DATA_ROOT):
        super().__init__(group.board(data_root), model, seed, RUNS)
        self.spec = group

    def command(self, data_root: Path | None = None) -> list[str]:
        """`zoo fit` with paths relative to the repository: run it from there."""
        return super().command(None if data_root is None else self.spec.data_arguments(data_root))


def boards(data_root: Path = DATA_ROOT) -> list[leaderboard.Group]:
    return [g.board(data_root) for g in GROUPS]


def all_runs(data_root: Path = DATA_ROOT) -> list[Run]:
    return [Run(g, m, s, data_root) for g in GROUPS for s in g.seeds for m in g.models]


def load() -> dict:
    return leaderboard.load(OUT)


def table(results: dict) -> None:
    rows = []
    for cell in results.get("cells", []):
        std = f" ± {cell['std']:.4f}" if cell["std"] is not None else " (one seed)"
        row = {"group": cell["group"], "model": cell["model"], "metric": cell["metric"],
               "mean ± std": f"{cell['mean']:.4f}{std}", "seeds": len(cell["seeds"]),
               "params": cell["params"], "minutes": f"{cell['train_minutes_mean']:.1f}"}
        if "target" in cell:
            row["target"] = f"{cell['target']}: {cell['seeds_meeting_target']}/{len(cell['seeds'])} seeds"
            row["val reached (min)"] = ", ".join(map(str, cell["validation_reached_target_in_minutes"])) or "-"
        rows.append(row)
    print_table("leaderboard (bench/results/leaderboard.json)", rows,
                ["group", "model", "metric", "mean ± std", "seeds", "params", "minutes", "target",
                 "val reached (min)"])


def markdown(results: dict) -> None:
    """The README's tables: one per group, every figure from the JSON."""
    print(leaderboard.markdown(results, boards()))


def ship(results: dict, pattern: str = "*") -> None:
    """Copy each shipping group's seed-0 release to checkpoints/<model>.<tag>/, its card carrying the table.

    Only groups whose every seed has finished ship: a card gives the mean and spread of all its seeds.
    """
    from zoo.models.card import model_card
    from zoo.models.pretrained import load_release
    from zoo.models.release_files import CARD, CONFIG, is_release_folder
    from zoo.utils.atomic import replace_folder

    by_cell = {(c["group"], c["model"]): c for c in results.get("cells", [])}
    for g in GROUPS:
        if not g.ships:
            continue
        for model in g.models:
            key = f"{g.name}/{model}/seed0"
            if not fnmatch.fnmatch(key, pattern):
                continue
            missing = [s for s in g.seeds if f"{g.name}/{model}/seed{s}" not in results["runs"]]
            if missing:
                print(f"not shipped: {g.name}/{model} still lacks seeds {missing}")
                continue
            source = Run(g, model, 0).folder / "release"
            target = REPO / "checkpoints" / f"{model}.{g.tag}"
            config = json.loads((source / CONFIG).read_text())
            cell = by_cell[(g.name, model)]
            config["leaderboard"] = {"group": g.name, "metric": cell["metric"], "seeds": cell["seeds"],
                                     "mean": cell["mean"], "std": cell["std"], "values": cell["values"],
                                     "command": COMMAND,
                                     "results": "bench/results/leaderboard.json"}

            def fill(staging: Path, source=source, config=config, name=target.name) -> None:
                for file in source.iterdir():
                    if file.name != CONFIG:
                        shutil.copy2(file, staging / file.name)
                (staging / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
                (staging / CARD).write_text(model_card(load_release(staging), name, config))

            replace_folder(target, fill, is_release_folder, "release folder")
            print(f"shipped {key} -> {target.relative_to(REPO)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="*", help="runs whose key GROUP/MODEL/seedS matches this wildcard")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--threads", type=int, default=1, help="threads per run")
    parser.add_argument("--data-root", default=str(DATA_ROOT))
    parser.add_argument("--list", action="store_true", help="list the runs and whether each is done")
    parser.add_argument("--table", action="store_true", help="only print the table from the JSON")
    parser.add_argument("--ship", action="store_true", help="copy the seed-0 runs to checkpoints/")
    parser.add_argument("--markdown", action="store_true", help="print the README's tables from the JSON")
    args = parser.parse_args()
    os.chdir(REPO)  # the commands name the recipes, the runs and a relative data root from the repository
    data_root = Path(args.data_root)  # as given: it goes into the cards
    runs = [r for r in all_runs(data_root) if fnmatch.fnmatch(r.key, args.only)]
    results = load()
    if args.list:
        for r in runs:
            print(f"{r.key:45s} {r.state(results)}")
        return
    if args.ship:
        ship(results, args.only)
        return
    if args.markdown:
        markdown(results)
        return
    if not args.table:
        leaderboard.run_all(runs, OUT, boards(data_root), COMMAND, args.jobs, args.threads)
        results = load()
    table(results)


if __name__ == "__main__":
    main()
