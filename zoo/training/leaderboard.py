"""The leaderboard: several models trained with the same recipe and budget, several seeds each.

    zoo leaderboard --recipe quickstart --models vit-tiny,micro-vit-tiny --seeds 3

A group is one recipe, its models and seeds. Each run is `zoo fit --config RECIPE` with
`--seed_everything S --data.init_args.seed S` (the data seed only where the recipe's data
module takes one), the model's name where the recipe is shared, in a folder of its own,
RUNS/GROUP/MODEL/seedS (logs, checkpoints, a timeline of validation metrics against wall
time, the exported release with its test metrics). When a run ends, its record goes into
the results JSON at once, under a lock (runners may work side by side) and through a
temporary file and a rename. So a leaderboard can be stopped at any time and started
again: a run with a record is skipped, and a run that was cut off resumes from its last
checkpoint (`--ckpt_path last`). bench/leaderboard.py runs the zoo's own groups with it.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from zoo.training.timeline import read as read_timeline
from zoo.training.timeline import time_to
from zoo.utils.atomic import locked, write_text_atomic

FIT = [sys.executable, "-m", "zoo.cli"]  # `zoo` of this interpreter, whatever `zoo` the PATH finds
POLL_SECONDS = 1.0


@dataclass(frozen=True)
class Group:
    """Models trained with one recipe each, several seeds: one column of the table."""

    name: str
    recipe: str  # the recipe file; "{model}" stands for each model's name
    models: tuple[str, ...]
    seeds: tuple[int, ...]
    metric: str  # the release's metric the table reports
    higher_is_better: bool = True
    target: float | None = None
    val_metric: str | None = None  # what the timeline reads to time reaching the target
    extra: tuple[str, ...] = ()  # more `zoo fit` arguments; "{folder}" is the run's folder
    notes: str = ""
    set_model_name: bool = False  # pass --model.init_args.model_name: one recipe shared by the models
    seed_data: bool = True  # pass --data.init_args.seed too (the data module takes a seed)
    data: tuple[str, ...] = ()  # arguments that point the recipe at this machine's data (not in the JSON)

    def meets(self, value: float, target: float | None = None) -> bool:
        target = self.target if target is None else target
        return value >= target if self.higher_is_better else value <= target

    def recipe_for(self, model: str) -> str:
        return self.recipe.replace("{model}", model)

    def describe(self) -> dict:
        """The group as the results JSON lists it."""
        return {"models": list(self.models), "seeds": list(self.seeds), "metric": self.metric, "target": self.target,
                "recipe": self.recipe.replace("{model}", "<model>"), "extra_arguments": list(self.extra),
                "notes": self.notes}


@dataclass
class Run:
    group: Group
    model: str
    seed: int
    runs: Path  # the folder that holds every group's runs

    @property
    def folder(self) -> Path:
        return Path(self.runs) / self.group.name / self.model / f"seed{self.seed}"

    @property
    def key(self) -> str:
        return f"{self.group.name}/{self.model}/seed{self.seed}"

    def command(self, data: Sequence[str] | None = None) -> list[str]:
        """The `zoo fit` command line of this run (paths relative to the current folder where they lie in it);
        `data` replaces the group's data arguments."""
        g, folder = self.group, _shown(self.folder)
        args = ["zoo", "fit", "--config", _shown(Path(g.recipe_for(self.model))),
                *(g.data if data is None else data),
                "--seed_everything", str(self.seed),
                *(["--data.init_args.seed", str(self.seed)] if g.seed_data else []),
                *(["--model.init_args.model_name", self.model] if g.set_model_name else []),
                *(arg.replace("{folder}", folder) for arg in g.extra),
                "--trainer.default_root_dir", folder,
                "--export.dirpath", str(Path(folder) / "release"),
                "--trainer.enable_progress_bar", "false",
                "--trainer.callbacks+=zoo.training.timeline.Timeline",
                "--trainer.callbacks.path", str(Path(folder) / "timeline.jsonl")]
        if (self.folder / "checkpoints" / "release" / "last.ckpt").is_file():  # ExportRelease names it `release`
            args += ["--ckpt_path", "last"]
        return args

    def record(self, command: list[str], seconds_here: float) -> dict:
        """What the finished run leaves: the release's metrics, its size and its times."""
        from safetensors import safe_open

        config = json.loads((self.folder / "release" / "config.json").read_text())
        training = config.get("training", {})
        timeline_path = self.folder / "timeline.jsonl"
        timeline = read_timeline(timeline_path) if timeline_path.is_file() else []
        with safe_open(self.folder / "release" / "model.safetensors", "pt") as f:
            params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # tied weights stored once
        g = self.group
        reached = None
        if g.target is not None and g.val_metric and timeline:
            entry = time_to(timeline_path, g.val_metric, g.target, g.higher_is_better)
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

    def running(self) -> bool:
        """Whether another live process is training this run now (its pid file names one)."""
        try:
            os.kill(int((self.folder / "running.pid").read_text()), 0)
        except (OSError, ValueError):
            return False
        return True

    def state(self, results: dict) -> str:
        return ("done" if self.key in results["runs"] else "running" if self.running()
                else "started" if (self.folder / "checkpoints").exists() else "to run")


def _shown(path: Path) -> str:
    """`path` relative to the current folder where it lies inside it (commands read shorter), else as it is."""
    path = Path(path)
    if path.is_absolute():
        with contextlib.suppress(ValueError):
            return str(path.relative_to(Path.cwd()))
    return str(path)


def load(out) -> dict:
    """The results JSON at `out` (an empty one where there is none), refused where it is not a leaderboard's."""
    out = Path(out)
    if out.is_dir():
        raise IsADirectoryError(f"the leaderboard's results {out} is a folder; expected a JSON file to write")
    if not out.exists():
        return {"runs": {}}
    try:
        results = json.loads(out.read_text())
    except (ValueError, UnicodeDecodeError):
        results = None
    if not isinstance(results, dict) or not isinstance(results.get("runs"), dict):
        raise FileExistsError(f"{out} exists and is not a leaderboard's results (a JSON object with \"runs\"); "
                              "zoo rewrites only its own results: give another file")
    return results


def add_record(out, run: Run, record: dict, groups: Sequence[Group], command: str) -> None:
    """Put one run's record into the JSON: read, add, write, under the lock."""
    with locked(Path(out)):
        results = load(out)
        results["runs"][run.key] = record
        save(out, results, groups, command)


def save(out, results: dict, groups: Sequence[Group], command: str) -> None:
    """Write `results` with the machine, the groups and their cells; another command's groups in the same file
    keep their description and cells."""
    import torch

    from zoo.training.precision import cpu_flags

    names = {g.name for g in groups}
    results["command"] = command
    results["machine"] = {"python": platform.python_version(), "torch": torch.__version__,
                          "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "cpu_flags": cpu_flags()}
    results["groups"] = {**results.get("groups", {}), **{g.name: g.describe() for g in groups}}
    results["cells"] = [c for c in results.get("cells", []) if c["group"] not in names] + cells(results, groups)
    write_text_atomic(out, json.dumps(results, indent=2))


def cells(results: dict, groups: Sequence[Group]) -> list[dict]:
    """Mean and sample standard deviation per (group, model) over the finished seeds."""
    out = []
    for g in groups:
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
                    "precision": sorted({r["precision"] for r in done}, key=str)}
            if g.target is not None:
                cell["target"] = g.target
                cell["seeds_meeting_target"] = sum(g.meets(v) for v in values)
                cell["mean_meets_target"] = g.meets(cell["mean"])
                cell["validation_reached_target_in_minutes"] = [round(s / 60, 1) for s in reached]
            out.append(cell)
    return out


def run_all(runs: Sequence[Run], out, groups: Sequence[Group], command: str, jobs: int = 1,
            threads: int | None = None) -> list[str]:
    """Run what has no record yet, `jobs` at a time with `threads` threads each; return the keys that failed."""
    done = load(out)["runs"]
    pending = [r for r in runs if r.key not in done and not r.running()]
    print(f"{len(runs) - len(pending)} of {len(runs)} runs done or running elsewhere; "
          f"{len(pending)} to run, {jobs} at a time", flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    active: list[tuple[Run, subprocess.Popen, list[str], float]] = []
    failed = []
    while pending or active:
        while pending and len(active) < jobs:
            run = pending.pop(0)
            if run.key in load(out)["runs"] or run.running():  # another runner took it meanwhile
                continue
            run.folder.mkdir(parents=True, exist_ok=True)
            args = run.command()
            with open(run.folder / "fit.log", "a") as log:
                print(f"start {run.key}: {' '.join(args)}", flush=True)
                process = subprocess.Popen([*FIT, *args[1:]], env=env, stdout=log, stderr=subprocess.STDOUT)
            (run.folder / "running.pid").write_text(str(process.pid))
            active.append((run, process, args, time.monotonic()))
        time.sleep(POLL_SECONDS)
        for item in list(active):
            run, process, args, started = item
            if process.poll() is None:
                continue
            active.remove(item)
            (run.folder / "running.pid").unlink(missing_ok=True)
            if process.returncode != 0:
                failed.append(run.key)
                print(f"FAILED {run.key} (exit {process.returncode}): {_last_line(run.folder / 'fit.log')}; "
                      f"see {run.folder / 'fit.log'}", flush=True)
                continue
            record = run.record(args, time.monotonic() - started)
            add_record(out, run, record, groups, command)
            if record["metric"] is None:
                print(f"done {run.key}, but its release has no {run.group.metric}; it has "
                      f"{', '.join(record['metrics']) or 'no metrics'}", flush=True)
            else:
                minutes = f" in {record['train_seconds'] / 60:.1f} min" if record["train_seconds"] is not None else ""
                print(f"done {run.key}: {run.group.metric} {record['metric']:.4f}{minutes}", flush=True)
    return failed


def _last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def markdown(results: dict, groups: Sequence[Group]) -> str:
    """One markdown table per group, every figure from the JSON: mean ± std, each seed, minutes, the target."""
    lines = []
    for g in groups:
        group_cells = [c for c in results.get("cells", []) if c["group"] == g.name]
        if not group_cells:
            continue
        percent = g.metric.endswith("acc")
        about = "; ".join(filter(None, [g.describe()["recipe"], g.notes]))
        lines += ["", f"**{g.name}** ({g.metric}{', %' if percent else ''}; {about})", ""]
        head = "| model | params | mean ± std | seeds | each seed | minutes per run |"
        rule = "|---|---|---|---|---|---|"
        if g.target is not None:
            head += " target | validation reached it after (min) |"
            rule += "---|---|"
        lines += [head, rule]
        for c in group_cells:
            scale, digits = (100.0, 2) if percent else (1.0, 3)
            std = f" ± {c['std'] * scale:.{digits}f}" if c["std"] is not None else " (one run)"
            each = ", ".join(f"{v * scale:.{digits}f}" for v in c["values"])
            minutes = f"{c['train_minutes_mean']:.1f}" if c["train_minutes_mean"] is not None else "-"
            line = (f"| `{c['model']}` | {c['params'] / 1e3:.0f}k | {c['mean'] * scale:.{digits}f}{std} | "
                    f"{len(c['seeds'])} | {each} | {minutes} |")
            if g.target is not None:
                verdict = f"{c['seeds_meeting_target']}/{len(c['seeds'])} seeds >= {g.target * scale:g}"
                line += f" {verdict} | {', '.join(map(str, c['validation_reached_target_in_minutes'])) or '-'} |"
            lines.append(line)
    return "\n".join(lines)


def takes_seed(class_path: str) -> bool:
    """Whether the data module `class_path` takes a `seed` argument (its own or, through **kwargs, a parent's)."""
    module, _, name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module), name, None)
    if not isinstance(cls, type):
        raise ImportError(f"the data module {class_path} is not a class in {module}")
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        parameters = inspect.signature(klass.__init__).parameters
        if "seed" in parameters:
            return True
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return False
    return False
