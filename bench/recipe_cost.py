"""What a text recipe costs on this machine before it is run: its optimizer steps timed, its hours projected.

    python bench/recipe_cost.py recipes/gpt-mini.warpeace.yaml recipes/ssd-gpt-mini.stdlib.yaml
    python bench/recipe_cost.py recipes/*-mini.*.yaml --threads 1      # the mini study, one run per core

For each recipe (a `zoo fit` config of a text model), the model it names is built with its overrides, at the
vocabulary and context of its data, and trained for a few steps (forward, backward, AdamW) on random tokens of its
batch shape, in the precision the recipe trains in (its trainer.precision; `auto` decides as `zoo fit` does, by a
bf16 matrix product's rate here), at --threads threads. The median step after one warm-up, times the recipe's
steps (train_samples / batch_size x max_epochs, or trainer.max_steps), is the projected training time.
Validation, data loading and export are left out, so a run takes somewhat longer. Speed does not depend on the
tokens, so random ones time the same work; what the steps cost on another machine this does not say. Results go
to bench/results/recipe_cost.json, a record per recipe and thread count, with the load average it ran under.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import yaml  # noqa: E402

import zoo  # noqa: E402
from bench.common import RESULTS, cpu_flags, locked, machine, print_table, read_runs  # noqa: E402
from zoo.data.sequences import STDLIB, LongContextText  # noqa: E402
from zoo.training.precision import resolve  # noqa: E402
from zoo.utils.atomic import write_text_atomic  # noqa: E402

OUT = RESULTS / "recipe_cost.json"
ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("ZOO_DATA", ROOT.parent / "shared" / "data"))


def recipe_shape(path: Path) -> dict:
    """A text recipe's model, overrides, batch shape, steps and the text its vocabulary comes from."""
    config = yaml.safe_load(path.read_text())
    try:
        model, data, trainer = config["model"]["init_args"], config["data"], config.get("trainer") or {}
        name, args = model["model_name"], data["init_args"]
    except (KeyError, TypeError):
        raise ValueError(f"{path} is not a zoo fit config of a model and its data (model.init_args.model_name, "
                         "data.init_args)") from None
    if not data.get("class_path", "").endswith(("LongContextText", "CharText")):
        raise ValueError(f"{path} trains on {data.get('class_path')}: expected a text recipe (LongContextText or "
                         "CharText data)")
    batch, samples = int(args.get("batch_size", 8)), int(args.get("train_samples", 8000))
    steps = trainer.get("max_steps") or samples // batch * int(trainer.get("max_epochs", 1))
    return {"model": name, "overrides": model.get("model_overrides") or {}, "batch": batch,
            "precision": str(trainer.get("precision", "32-true")),
            "context": int(args.get("context_length", 1024)), "steps": int(steps), "text": str(args.get("path"))}


def vocabulary(text: str) -> int:
    """The character vocabulary of the recipe's text, as its data module reads it: the standard library's, or a
    file's under ZOO_DATA (the recipes name it as data/<folder>/<file>)."""
    if text != STDLIB and text.startswith("data/"):
        text = str(DATA / Path(text).relative_to("data"))
    if text != STDLIB and not Path(text).is_file():
        raise ValueError(f"the recipe's text is not at {text}: set ZOO_DATA to the data folder")
    return LongContextText(text, context_length=64).tokenizer.vocab_size


def time_steps(shape: dict, vocab: int, steps: int, precision: str) -> tuple[float, int]:
    """The median seconds of an optimizer step of the recipe's model (after one warm-up) in `precision`
    ("bf16-mixed": autocast, as Lightning's; otherwise float32), and its parameters."""
    torch.manual_seed(0)
    model = zoo.create(shape["model"], **{**shape["overrides"], "vocab_size": vocab,
                                          "context_length": shape["context"]}).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, vocab, (shape["batch"], shape["context"] + 1), generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            logits = model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]), sum(p.numel() for p in model.parameters())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipes", nargs="+", type=Path, help="zoo fit configs of text models")
    parser.add_argument("--threads", type=int, default=1, help="threads per run (default 1: one run per core)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per recipe, after one warm-up")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.threads < 1 or args.steps < 1:
        parser.error(f"--threads and --steps count from 1, got {args.threads} and {args.steps}")
    try:
        read_runs(args.out)  # a file that is not this bench's is refused before anything is timed
        shapes = {path: recipe_shape(path) for path in args.recipes}
        torch.set_num_threads(args.threads)
        # after set_num_threads, as auto measures at these threads; once per setting, not per recipe
        precisions = {given: str(resolve(given, "cpu")[0]) for given in {s["precision"] for s in shapes.values()}}
        rows = []
        for path, shape in shapes.items():
            vocab = vocabulary(shape["text"])
            precision = precisions[shape["precision"]]
            seconds, params = time_steps(shape, vocab, args.steps, precision)
            record = {"recipe": path.stem, "model": shape["model"], "parameters": params, "vocabulary": vocab,
                      "batch": shape["batch"], "context": shape["context"], "steps": shape["steps"],
                      "threads": args.threads, "precision": precision, "seconds per step": round(seconds, 3),
                      "hours": round(seconds * shape["steps"] / 3600, 2), "load average": round(os.getloadavg()[0], 2)}
            rows.append(record)
            with locked(args.out.stem):
                results = read_runs(args.out)
                results["runs"][f"{path.stem}@{args.threads}"] = record
                results.update({"command": "python bench/recipe_cost.py " + " ".join(argv or sys.argv[1:]),
                                "machine": machine(), "cpu_flags": cpu_flags()})
                write_text_atomic(args.out, json.dumps(results, indent=2))
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise SystemExit(f"bench/recipe_cost.py: error: {error}") from None
    print_table(f"Projected training time at {args.threads} thread(s) on this machine", rows)


if __name__ == "__main__":
    main()
