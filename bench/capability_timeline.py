"""When a capability appears during training, and where attention goes as it does.

    python bench/capability_timeline.py               # the ELiTA hybrid with convolutions on induction heads,
                                                      # at 1e-3, 3e-3 and 1e-2
    python bench/capability_timeline.py --lr 1e-3 --steps 3000  # longer training at one rate
    python bench/capability_timeline.py --table       # the table from bench/results/capability_timeline.json

bench/capability_pictures.py measures trained models only: swept to 1e-2, the ELiTA hybrid with convolutions
learns induction and its ELiTA block's gate on the token itself is open (0.75 in one head); at 1e-3 it fails and
the gate stays shut (0.016). That cannot say whether the gate opens first and recall follows, or the other way
round. Here the model trains exactly as bench/capabilities.py trains TASK/MODEL/0 (the same data, budget and
seed) at each rate given, and every --every optimizer steps a callback measures, on the first 100 validation
sequences (never the test set): accuracy on the scored tokens, and per layer and head the mean weight a query
puts on itself (ELiTA: its gate g_i) and on the answer (capability_pictures' measures).

Each finished run is added to bench/results/capability_timeline.json at once (a run already there is skipped);
docs/images/TASK_MODEL_timeline.png (MODEL's colons as dashes) draws every run of the model on the task:
accuracy, the gate (the first layer's largest head on itself) and the last layer's best head on the answer,
against the step.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import capabilities, capability_pictures  # noqa: E402
from bench.common import RESULTS, print_table, save_figure  # noqa: E402

OUT = RESULTS / "capability_timeline.json"
IMAGES = capability_pictures.IMAGES
TASKS = ("induction_heads", "mqar")  # the tasks whose answer position capability_pictures knows


def run(task: str, model: str, lr: float, steps: int, every: int, tiny: bool = False) -> dict:
    """Train TASK/MODEL/0 as the capability suite does, at lr for steps, measured before training and every
    `every` steps (and at the last); tiny: the suite's tiny task and model (a smoke run)."""
    import lightning as L

    data, module, budget, *_ = capabilities.prepare(task, model, 0, tiny, lr, steps)
    data.setup("fit")
    x, y = next(iter(torch.utils.data.DataLoader(data.val_set, batch_size=capability_pictures.SEQUENCES)))
    where = (capability_pictures.induction_answers(x, y) if task == "induction_heads"
             else capability_pictures.answers(x, y, data.num_pairs))
    points = {}

    class Measure(L.Callback):
        def on_train_start(self, trainer, pl_module):
            points[0] = capability_pictures.look(pl_module.model, x, y, where)[0]

        def on_train_batch_end(self, trainer, pl_module, *args):
            if trainer.global_step % every == 0 or trainer.global_step == steps:
                points[trainer.global_step] = capability_pictures.look(pl_module.model, x, y, where)[0]

    start = time.perf_counter()
    capabilities.quiet_trainer(steps, [Measure()]).fit(module, data)
    seconds = time.perf_counter() - start  # the snapshots' time included
    attention = points[0]["attention"]
    return {"task": task, "model": model, "seed": 0, **budget, "every": every, "sequences": len(x),
            "train_seconds": round(seconds, 1), "threads": torch.get_num_threads(),
            "queries": len(where), "attention": attention,
            "points": {str(step): {k: v for k, v in point.items() if k != "attention"}
                       for step, point in sorted(points.items())}}


def key(task: str, model: str, lr: float, steps: int) -> str:
    return f"{task}/{model}@{lr:g}x{steps}"


# the picture's measures of one snapshot: accuracy, the first layer's largest head on the token itself (in the
# ELiTA hybrids, whose first block is ELiTA's, its gate) and the last layer's best head on the answer
MEASURES = {"accuracy on validation": lambda p: p["accuracy"],
            "first layer on the token itself": lambda p: max(p["on_itself"][0]),
            "last layer on the answer": lambda p: max(p["on_answer"][-1])}
LEVELS = (0.1, 0.5)  # the table's: the first step at which a measure reaches each


def series(record: dict, measure) -> tuple[list[int], list[float]]:
    return [int(s) for s in record["points"]], [measure(p) for p in record["points"].values()]


def image(task: str, model: str) -> Path:
    return IMAGES / f"{task}_{model.replace(':', '-')}_timeline.png"


def draw(records: list[dict]) -> None:
    from zoo.viz import figures

    panels = {name: {f"lr {r['lr']:g}, {r['steps']} steps": series(r, measure) for r in records}
              for name, measure in MEASURES.items()}
    first = records[0]
    figure = figures.line_panels_figure(panels, "optimizer step", f"{first['model']} on {first['task']}, seed 0 "
                                        f"({' then '.join(first['attention'])}): measured on validation")
    save_figure(figure, image(first["task"], first["model"]))


def table(records: list[dict]) -> None:
    rows = []
    for r in records:
        row = {"run": key(r["task"], r["model"], r["lr"], r["steps"])}
        for name, measure in MEASURES.items():
            steps, values = series(r, measure)
            for level in LEVELS:
                row[f"{name} >= {level}"] = next((s for s, v in zip(steps, values) if v >= level), "-")
        row["accuracy at the end"] = r["points"][str(r["steps"])]["accuracy"]
        rows.append(row)
    print_table("the first step at which each measure reaches a level (measured every --every steps)", rows,
                list(rows[0]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=TASKS, default="induction_heads")
    parser.add_argument("--model", choices=capabilities.MODELS, default="hybrid-elita-gpt-tiny:conv")
    parser.add_argument("--lr", type=float, nargs="+", default=[1e-3, 3e-3, 1e-2])
    parser.add_argument("--steps", type=int, default=capabilities.BUDGET["steps"],
                        help="optimizer steps (the schedule's cosine decay stretches to them)")
    parser.add_argument("--every", type=int, default=100, help="measure every this many optimizer steps")
    parser.add_argument("--table", action="store_true", help="print the table and draw from the JSON, train nothing")
    args = parser.parse_args(argv)
    for lr in args.lr:
        if not (math.isfinite(lr) and lr > 0):
            parser.error(f"--lr must be positive numbers, got {lr}")
    if args.steps < 1 or args.every < 1:
        parser.error(f"--steps and --every count optimizer steps from 1, got {args.steps} and {args.every}")
    try:
        runs = capabilities.load(OUT)["runs"]
    except ValueError as error:  # a file there that is not this script's JSON: refused, never overwritten
        parser.error(str(error))
    if not args.table:
        torch.set_num_threads(1)
        for lr in args.lr:
            name = key(args.task, args.model, lr, args.steps)
            if name not in runs:
                print(f"{name} ...", flush=True)
                capabilities.add_record(OUT, name, run(args.task, args.model, lr, args.steps, args.every),
                                        command="python bench/capability_timeline.py")
    runs = capabilities.load(OUT)["runs"]
    records = [r for r in runs.values() if r["task"] == args.task and r["model"] == args.model]
    if not records:
        parser.error(f"no run of {args.model} on {args.task} in {OUT} yet: run it without --table")
    table(records)
    draw(records)


if __name__ == "__main__":
    main()
