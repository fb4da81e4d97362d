"""The leaderboard: every attention mechanism on the same recipe and budget, three seeds (issue 13).

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
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, cpu_flags, locked, print_table  # noqa: E402
from zoo.atomic import write_text_atomic  # noqa: E402
from zoo.training.timeline import read as read_timeline  # noqa: E402
from zoo.training.timeline import time_to  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "bench" / "runs" / "leaderboard"
OUT = RESULTS / "leaderboard.json"
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
)


@dataclass
class Run:
    group: Group
    model: str
    seed: int
    folder: Path = field(init=False)

    def __post_init__(self):
        self.folder = RUNS / self.group.name / self.model / f"seed{self.seed}"

    @property
    def key(self) -> str:
        return f"{self.group.name}/{self.model}/seed{self.seed}"

    @property
    def recipe(self) -> Path:
        return REPO / "recipes" / f"{self.group.recipe_of or self.model}.{self.group.tag}.yaml"

    def command(self, data_root: Path) -> list[str]:
        data = (["--data.init_args.path", str(data_root / "tinyshakespeare" / "input.txt")]
                if self.group.data == "text" else ["--data.init_args.root", str(data_root)])
        args = ["zoo", "fit", "--config", str(self.recipe.relative_to(REPO)), *data,
                "--seed_everything", str(self.seed), "--data.init_args.seed", str(self.seed),
                *(["--model.init_args.model_name", self.model] if self.group.recipe_of else []),
                *(arg.format(folder=self.folder.relative_to(REPO)) for arg in self.group.extra),
                "--trainer.default_root_dir", str(self.folder.relative_to(REPO)),
                "--export.dirpath", str((self.folder / "release").relative_to(REPO)),
                "--trainer.enable_progress_bar", "false",
                "--trainer.callbacks+=zoo.training.timeline.Timeline",
                "--trainer.callbacks.path", str((self.folder / "timeline.jsonl").relative_to(REPO))]
        if (self.folder / "checkpoints" / "release" / "last.ckpt").is_file():
            args += ["--ckpt_path", "last"]
        return args

    def record(self, command: list[str], seconds_here: float) -> dict:
        """What the finished run leaves: the release's test metrics, its size and its times."""
        config = json.loads((self.folder / "release" / "config.json").read_text())
        training = config["training"]
        timeline = read_timeline(self.folder / "timeline.jsonl")
        with safe_open(self.folder / "release" / "model.safetensors", "pt") as f:
            params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # tied weights stored once
        g = self.group
        reached = None
        if g.target is not None and g.val_metric:
            entry = time_to(self.folder / "timeline.jsonl", g.val_metric, g.target, g.higher_is_better)
            if entry is not None:
                reached = {"seconds": entry["seconds"], "epoch": entry["epoch"], "step": entry["step"],
                           g.val_metric: entry["metrics"][g.val_metric]}
        return {"group": g.name, "model": self.model, "seed": self.seed, "metrics": config["metrics"],
                "metric": config["metrics"].get(g.metric), "params": params,
                "train_seconds": timeline[-1]["seconds"] if timeline else training.get("seconds"),
                "wall_seconds_last_process": round(seconds_here, 1),
                "epochs": training.get("epochs"), "steps": training.get("steps"),
                "precision": training.get("precision"), "precision_reason": training.get("precision_reason"),
                "target_reached_on_validation": reached, "command": " ".join(command),
                "threads": training.get("threads"), "finished": time.strftime("%Y-%m-%d %H:%M:%S")}


def all_runs() -> list[Run]:
    return [Run(g, m, s) for g in GROUPS for s in g.seeds for m in g.models]


def load() -> dict:
    if OUT.is_file():
        return json.loads(OUT.read_text())
    return {"runs": {}}


def add_record(key: str, record: dict) -> None:
    """Put one run's record into the JSON: read, add, write, under a lock (runners may work side by side)."""
    with locked("leaderboard"):
        results = load()
        results["runs"][key] = record
        save(results)


def running(run: Run) -> bool:
    """Whether another live process is training this run now (its pid file names one)."""
    try:
        pid = int((run.folder / "running.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def save(results: dict) -> None:
    results["command"] = "python bench/leaderboard.py"
    results["machine"] = {"python": platform.python_version(), "torch": torch.__version__,
                          "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "cpu_flags": cpu_flags()}
    results["groups"] = {g.name: {"models": list(g.models), "seeds": list(g.seeds), "metric": g.metric,
                                  "target": g.target,
                                  "recipe": f"recipes/{g.recipe_of or '<model>'}.{g.tag}.yaml",
                                  "extra_arguments": list(g.extra), "notes": g.notes} for g in GROUPS}
    results["cells"] = cells(results)
    write_text_atomic(OUT, json.dumps(results, indent=2))


def cells(results: dict) -> list[dict]:
    """Mean and sample standard deviation per (group, model) over the finished seeds."""
    out = []
    for g in GROUPS:
        for model in g.models:
            done = sorted((r for r in results["runs"].values()
                           if r["group"] == g.name and r["model"] == model and r.get("metric") is not None),
                          key=lambda r: r["seed"])  # values in seed order, whatever order the runs finished in
            if not done:
                continue
            values = [r["metric"] for r in done]
            times = [r["train_seconds"] for r in done if r.get("train_seconds") is not None]
            reached = [r["target_reached_on_validation"]["seconds"] for r in done
                       if r.get("target_reached_on_validation")]
            cell = {"group": g.name, "model": model, "metric": g.metric, "seeds": [r["seed"] for r in done],
                    "mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else None,
                    "values": values, "params": done[0]["params"],
                    "train_minutes_mean": statistics.fmean(times) / 60 if times else None,
                    "precision": sorted({r["precision"] for r in done})}
            if g.target is not None:
                cell["target"] = g.target
                cell["seeds_meeting_target"] = sum(g.meets(v) for v in values)
                cell["mean_meets_target"] = g.meets(cell["mean"])
                cell["validation_reached_target_in_minutes"] = [round(s / 60, 1) for s in reached]
            out.append(cell)
    return out


def run_all(runs: list[Run], jobs: int, data_root: Path, threads: int) -> None:
    done = load()["runs"]
    pending = [r for r in runs if r.key not in done and not running(r)]
    print(f"{len(runs) - len(pending)} of {len(runs)} runs done or running elsewhere; "
          f"{len(pending)} to run, {jobs} at a time", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    active: list[tuple[Run, subprocess.Popen, list[str], float]] = []
    while pending or active:
        while pending and len(active) < jobs:
            run = pending.pop(0)
            if run.key in load()["runs"] or running(run):  # another runner took it meanwhile
                continue
            run.folder.mkdir(parents=True, exist_ok=True)
            command = run.command(data_root)
            with open(run.folder / "fit.log", "a") as log:
                print(f"start {run.key}: {' '.join(command)}", flush=True)
                process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
            (run.folder / "running.pid").write_text(str(process.pid))
            active.append((run, process, command, time.monotonic()))
        time.sleep(5)
        for item in list(active):
            run, process, command, started = item
            if process.poll() is None:
                continue
            active.remove(item)
            (run.folder / "running.pid").unlink(missing_ok=True)
            if process.returncode != 0:
                print(f"FAILED {run.key} (exit {process.returncode}); see {run.folder / 'fit.log'}", flush=True)
                continue
            record = run.record(command, time.monotonic() - started)
            add_record(run.key, record)
            print(f"done {run.key}: {run.group.metric} {record['metric']:.4f} in "
                  f"{record['train_seconds'] / 60:.1f} min", flush=True)


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
    for g in GROUPS:
        group_cells = [c for c in results.get("cells", []) if c["group"] == g.name]
        if not group_cells:
            continue
        percent = g.metric.endswith("acc")
        recipe = f"recipes/{g.recipe_of or '<model>'}.{g.tag}.yaml"
        print(f"\n**{g.name}** ({g.metric}{', %' if percent else ''}; {recipe}{'; ' + g.notes if g.notes else ''})\n")
        head = "| model | params | mean ± std | seeds | each seed | minutes per run |"
        rule = "|---|---|---|---|---|---|"
        if g.target is not None:
            head += " target | validation reached it after (min) |"
            rule += "---|---|"
        print(head + "\n" + rule)
        for c in group_cells:
            scale, digits = (100.0, 2) if percent else (1.0, 3)
            std = f" ± {c['std'] * scale:.{digits}f}" if c["std"] is not None else " (one run)"
            each = ", ".join(f"{v * scale:.{digits}f}" for v in c["values"])
            line = (f"| `{c['model']}` | {c['params'] / 1e3:.0f}k | {c['mean'] * scale:.{digits}f}{std} | "
                    f"{len(c['seeds'])} | {each} | {c['train_minutes_mean']:.1f} |")
            if g.target is not None:
                verdict = f"{c['seeds_meeting_target']}/{len(c['seeds'])} seeds >= {g.target * scale:g}"
                line += f" {verdict} | {', '.join(map(str, c['validation_reached_target_in_minutes'])) or '-'} |"
            print(line)


def ship(results: dict, pattern: str = "*") -> None:
    """Copy each shipping group's seed-0 release to checkpoints/<model>.<tag>/, its card carrying the table.

    Only groups whose every seed has finished ship: a card gives the mean and spread of all its seeds.
    """
    from zoo.atomic import replace_folder
    from zoo.card import model_card
    from zoo.release import CARD, CONFIG, is_release_folder, load_release

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
                                     "command": "python bench/leaderboard.py",
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
    parser.add_argument("--data-root", default=os.environ.get("ZOO_DATA", "../shared/data"))
    parser.add_argument("--list", action="store_true", help="list the runs and whether each is done")
    parser.add_argument("--table", action="store_true", help="only print the table from the JSON")
    parser.add_argument("--ship", action="store_true", help="copy the seed-0 runs to checkpoints/")
    parser.add_argument("--markdown", action="store_true", help="print the README's tables from the JSON")
    args = parser.parse_args()
    runs = [r for r in all_runs() if fnmatch.fnmatch(r.key, args.only)]
    results = load()
    if args.list:
        for r in runs:
            state = ("done" if r.key in results["runs"] else "running" if running(r)
                     else "started" if (r.folder / "checkpoints").exists() else "to run")
            print(f"{r.key:45s} {state}")
        return
    if args.ship:
        ship(results, args.only)
        return
    if args.markdown:
        markdown(results)
        return
    if not args.table:
        run_all(runs, args.jobs, Path(args.data_root), args.threads)  # as given: it goes into the cards
        results = load()
    table(results)


if __name__ == "__main__":
    main()
