"""`zoo leaderboard --recipe RECIPE --models a,b --seeds 3`: several models on one recipe, several seeds each.

    zoo leaderboard --recipe quickstart --models vit-tiny,micro-vit-tiny --seeds 3 --jobs 2
    zoo leaderboard --recipe my.yaml --models vit-tiny,micro-vit-tiny --seeds 3 -- --data.init_args.root DATA
    zoo leaderboard --recipe my.yaml --models vit-tiny,micro-vit-tiny --seeds 3 --table

Runs each model x seed under `zoo fit` (zoo.training.leaderboard), skipping runs that have a
record, and prints one markdown table of mean ± std over the seeds. Arguments after `--` go
to every `zoo fit`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

# zoo's two tasks, and the one each family of models trains with
TASKS = {"zoo.training.ClassificationTask", "zoo.training.classification.ClassificationTask",
         "zoo.training.LanguageModelTask", "zoo.training.language_model.LanguageModelTask"}
MAX_SEEDS = 1000
LOWER_IS_BETTER = ("loss", "perplexity", "bits", "bpb", "bpc", "error")


def leaderboard_command(argv: list[str]) -> None:
    from zoo.training import leaderboard

    argv = list(argv)
    fit_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        prog="zoo leaderboard", description="Train several models with one recipe, several seeds each, under `zoo "
                                            "fit`, and print the table of mean ± std over the seeds. Runs that "
                                            "have a record in --out are skipped, so it can be stopped and started "
                                            "again. Arguments after -- go to every `zoo fit`.")
    parser.add_argument("--recipe", required=True, help="a recipe file, or a packaged recipe's name (`zoo recipes`)")
    parser.add_argument("--models", required=True, help="registered model names, comma-separated (`zoo models`)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per model (default 3)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads per run (default: the cores shared among the jobs)")
    parser.add_argument("--runs", default="runs/leaderboard", help="where each run's folder goes: "
                        "RUNS/NAME/MODEL/seedS (default runs/leaderboard)")
    parser.add_argument("--out", default=None, help="the results JSON (default RUNS/leaderboard.json)")
    parser.add_argument("--name", default=None, help="the group's name in the JSON (default: the recipe's name)")
    parser.add_argument("--metric", default=None, help="the release's metric the table reports (default test/acc "
                        "for classification, val/loss for language models)")
    parser.add_argument("--target", type=float, default=None,
                        help="a value of the metric to count seeds against and time validation to reach")
    parser.add_argument("--list", action="store_true", help="list the runs and their state; run nothing")
    parser.add_argument("--table", action="store_true", help="print the table from --out; run nothing")
    args = parser.parse_args(own)

    group, runs, out = plan(args, fit_args)
    results = leaderboard.load(out)  # refuses a file that is not a leaderboard's before any work
    before, now = results.get("groups", {}).get(group.name), group.describe()
    if before is not None and not (args.list or args.table):
        changed = [key for key in ("recipe", "metric", "target", "extra_arguments") if before.get(key) != now[key]]
        if changed:  # its records would be skipped as done, or mixed with runs of another recipe
            raise ValueError(f"{out} already holds a group {group.name} run with another {', '.join(changed)} "
                             f"({', '.join(f'{k}: {before[k]}' for k in changed)}); give another --name or --out")
    if args.list:
        for run in runs:
            print(f"{run.key:45s} {run.state(results)}")
        return
    failed = []
    if not args.table:
        command = shlex.join(["zoo", "leaderboard", *argv])
        threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
        failed = leaderboard.run_all(runs, out, [group], command, args.jobs, threads)
        results = leaderboard.load(out)
    text = leaderboard.markdown(results, [group])
    print(text if text else f"no finished runs of {group.name} in {out} yet")
    if failed:
        raise ChildProcessError(f"{len(failed)} of {len(runs)} runs failed ({', '.join(failed)}); each run's fit.log "
                                "says why")


def plan(args, fit_args: list[str]):
    """The group, its runs and the results file, every argument checked before anything runs."""
    from zoo.cli.recipes import read_recipe, resolve_recipe
    from zoo.models.registry import entry
    from zoo.training import leaderboard, task_class
    from zoo.utils.atomic import check_parents, check_writable_folder

    for flag, value in (("--seeds", args.seeds), ("--jobs", args.jobs), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    if args.seeds > MAX_SEEDS:  # a typo's count of runs, each a training
        raise ValueError(f"--seeds must be at most {MAX_SEEDS}, got {args.seeds}")
    try:
        path, note = resolve_recipe(args.recipe)
    except FileNotFoundError as error:  # it speaks of --config, the flag of zoo fit
        raise FileNotFoundError(str(error).replace("--config", "--recipe", 1)) from None
    if note:
        print(f"zoo: note: {note}", file=sys.stderr)
    recipe = read_recipe(path)
    for section in ("model", "data"):
        flag = f"--{section}"
        if section not in recipe and not any(a == flag or a.startswith((flag + ".", flag + "=")) for a in fit_args):
            raise ValueError(f"recipe {path} has no {section}: section; zoo leaderboard trains the recipe's "
                             f"{'task with each model' if section == 'model' else 'data'} (or give --{section} "
                             "after --)")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models:
        raise ValueError(f"--models expects registered model names separated by commas, got {args.models!r}")
    if len(set(models)) < len(models):
        raise ValueError(f"--models names a model twice: {args.models}")
    for model in models:
        try:
            entry(model)
        except ValueError as error:  # it names the closest ones
            raise ValueError(f"--models: {error}") from None
    task = _class_path(recipe.get("model"))
    if task in TASKS:
        for model in models:
            wanted = task_class(model).__name__
            if not task.endswith("." + wanted):
                raise ValueError(f"--models {model} trains with zoo.training.{wanted}; recipe {path} trains "
                                 f"{task}: give models of one kind, or a recipe for {model}")
    metric = args.metric or ("val/loss" if task and task.endswith("LanguageModelTask") else "test/acc")
    higher_is_better = not any(word in metric.rsplit("/", 1)[-1] for word in LOWER_IS_BETTER)
    data = _class_path(recipe.get("data"))
    seed_data = data is not None and "." in data and leaderboard.takes_seed(data)
    if not seed_data:
        print(f"zoo leaderboard: note: the data module {data or '(from the arguments)'} takes no seed here; each "
              "seed draws the initialization and what seed_everything seeds, the data split stays the same",
              file=sys.stderr)
    name = args.name or path.name.removesuffix(".yaml")
    if not name or name in (".", "..") or "/" in name or os.sep in name:
        raise ValueError(f"--name must be a plain name (it names a folder under --runs), got {name!r}")
    group = leaderboard.Group(name, str(path), tuple(models), tuple(range(args.seeds)), metric, higher_is_better,
                              args.target, _validation_metric(metric) if args.target is not None else None,
                              tuple(fit_args), set_model_name=True, seed_data=seed_data)
    runs_folder = Path(args.runs)
    check_writable_folder(runs_folder, "--runs")
    out = Path(args.out) if args.out else runs_folder / "leaderboard.json"
    if out.is_dir():
        raise IsADirectoryError(f"--out {out} is a folder; expected the path of a JSON file to write")
    check_parents(out, "--out")
    runs = [leaderboard.Run(group, model, seed, runs_folder) for seed in group.seeds for model in models]
    return group, runs, out


def _class_path(section) -> str | None:
    """A recipe section's class: `{class_path: X, init_args: ...}`, or the short form `X`."""
    if isinstance(section, dict):
        section = section.get("class_path")
    return section if isinstance(section, str) else None


def _validation_metric(metric: str) -> str:
    """test/acc -> val/acc: what the timeline records during training."""
    split, _, name = metric.rpartition("/")
    return f"val/{name}" if split else metric
