"""Quiet attention and outliers: activation kurtosis, max |x| and int8 after training.

    python bench/outliers.py            # every finished leaderboard run of the study's groups
    python bench/outliers.py --table    # the table from bench/results/outliers.json

The quiet attention write-up ("Quiet Attention: A Novel Modification to Softmax Function for Attention
Mechanism") claims that a head which can attend to nothing keeps the activations
free of outliers, so the model quantizes better. Bondarenko, Nagel and Blankevoort 2023
("Quantizable Transformers") measured it for their clipped softmax and gated attention;
this script measures it the same way for the models bench/leaderboard.py trained
(softmax, quiet, micro, elita, fused pooling, and the two controls), seed by seed:

- float: the test metric in float32 (test accuracy; validation loss for tiny-shakespeare);
- outliers: on the validation set, each watched layer's (block output, attention output,
  MLP output) Pearson kurtosis per image or sequence (a Gaussian gives 3) averaged over the
  inputs, then over the layers; and the largest |x| of any of them (zoo.quantization.outliers);
- W8A8: the paper's fake quantization (zoo.quantization.fake_quant), activation ranges from
  16 training batches, the head in float; the metric and its degradation from float;
- torchao: int8 dynamic-activation, int8-weight quantization, per-tensor, of every linear
  layer but the head (what one would deploy), its metric and degradation, and its forward
  time against float32's (a ratio from one rotation, 1 thread, batch 64 images or 12
  sequences of 64 tokens), eagerly and, for seed 0 of the mnist and shakespeare groups, both
  under torch.compile;
- during training (the text runs): kurtosis and max |x| every 100 steps (TrackOutliers),
  from which the table gives the largest seen.

Degradation is positive when quantization makes the model worse: accuracy points lost, or
loss gained. Results are written after each run, and a run already in the JSON is skipped
(`--redo` measures again).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, cpu_flags, locked, print_table, timeit_rotation, write_json  # noqa: E402
from bench.leaderboard import GROUPS, Run  # noqa: E402

STUDY = ("mnist", "mnist-controls", "shakespeare", "shakespeare-controls", "shakespeare-4x", "shakespeare-small")
OUT = RESULTS / "outliers.json"


def data_module(group: str, seed: int, data_root: Path):
    if group.startswith("shakespeare"):
        from zoo.data import CharText

        return CharText(path=str(data_root / "tinyshakespeare" / "input.txt"), context_length=64, batch_size=12,
                        seed=seed)
    from zoo.data import MNIST

    dm = MNIST(root=str(data_root), batch_size=128, seed=seed, download=False)
    dm.setup("fit")
    return dm


@torch.no_grad()
def metric(model, loader, text: bool) -> float:
    """Test accuracy, or mean per-token cross-entropy for text."""
    total, count = 0.0, 0
    for x, y in loader:
        out = model(x)
        if text:
            total += float(F.cross_entropy(out.float().flatten(0, 1), y.flatten(), reduction="sum"))
            count += y.numel()
        else:
            total += float((out.argmax(-1) == y).sum())
            count += len(y)
    return total / count


@torch.no_grad()
def outlier_stats(model, loader) -> dict:
    from zoo.quantization import ActivationStats

    with ActivationStats(model) as stats:
        for x, _ in loader:
            model(x)
    summary = stats.summary()
    return {"kurtosis": summary["kurtosis"], "max_abs": summary["max_abs"], "inputs": summary["inputs"],
            "layers": summary["layers"]}


def torchao_int8(model):
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_
    from torchao.quantization.granularity import PerTensor

    quantized = copy.deepcopy(model)
    quantize_(quantized, Int8DynamicActivationInt8WeightConfig(granularity=PerTensor()),
              filter_fn=lambda module, name: isinstance(module, torch.nn.Linear) and name != "head")
    return quantized


def measure(run: Run, data_root: Path) -> dict:
    import zoo
    from zoo.quantization import W8A8

    text = run.group.name.startswith("shakespeare")
    model = zoo.load(run.folder / "release").float().eval()
    dm = data_module(run.group.name, run.seed, data_root)
    evaluation = dm.val_dataloader() if text else dm.test_dataloader()
    degrade = (lambda q, f: q - f) if text else (lambda q, f: f - q)
    row = {"key": run.key, "group": run.group.name, "model": run.model, "seed": run.seed,
           "metric_name": "val/loss" if text else "test/acc"}
    row["float"] = metric(model, evaluation, text)
    row.update(outlier_stats(model, dm.val_dataloader()))
    w8a8 = W8A8(model).calibrate(dm.train_dataloader())
    row["w8a8"] = metric(w8a8, evaluation, text)
    row["w8a8_degradation"] = degrade(row["w8a8"], row["float"])
    int8 = torchao_int8(model)
    row["torchao_int8"] = metric(int8, evaluation, text)
    row["torchao_degradation"] = degrade(row["torchao_int8"], row["float"])
    x = next(iter(dm.val_dataloader()))[0][: 12 if text else 64]
    with torch.no_grad():
        t_float, t_int8 = timeit_rotation([lambda: model(x), lambda: int8(x)], rounds=50)
    row["torchao_speedup"] = t_float / t_int8
    row["float_ms"], row["torchao_ms"] = t_float * 1e3, t_int8 * 1e3
    if run.seed == 0 and run.group.name in ("mnist", "shakespeare"):  # compiled too, as torchao means its kernels
        # to run: once per model of the two main groups, as each compile takes about 30 s
        compiled_float, compiled_int8 = torch.compile(model), torch.compile(int8)
        with torch.no_grad():
            t_float, t_int8 = timeit_rotation([lambda: compiled_float(x), lambda: compiled_int8(x)], rounds=50)
        row["torchao_speedup_compiled"] = t_float / t_int8
        row["float_compiled_ms"], row["torchao_compiled_ms"] = t_float * 1e3, t_int8 * 1e3
    curve = run.folder / "outliers.jsonl"
    if curve.is_file():
        points = [json.loads(line) for line in curve.read_text().splitlines() if line.strip()]
        row["training"] = {"steps": [p["step"] for p in points], "kurtosis": [p["kurtosis"] for p in points],
                           "max_abs": [p["max_abs"] for p in points]}
    return row


SUMMARIZED = ("float", "kurtosis", "max_abs", "w8a8", "w8a8_degradation", "torchao_int8", "torchao_degradation",
              "torchao_speedup")


def summarize(rows: dict) -> list[dict]:
    cells = {}
    for row in rows.values():
        cells.setdefault((row["group"], row["model"]), []).append(row)
    out = []
    for (group, model), runs in sorted(cells.items(), key=lambda kv: (STUDY.index(kv[0][0]), kv[0][1])):
        cell = {"group": group, "model": model, "metric": runs[0]["metric_name"],
                "seeds": sorted(r["seed"] for r in runs)}
        for name in SUMMARIZED:
            values = [r[name] for r in runs]
            cell[name] = {"mean": statistics.fmean(values),
                          "std": statistics.stdev(values) if len(values) > 1 else None}
        compiled = [r["torchao_speedup_compiled"] for r in runs if "torchao_speedup_compiled" in r]
        if compiled:
            cell["torchao_speedup_compiled_seed0"] = compiled[0]
        peaks = [max(r["training"]["kurtosis"]) for r in runs if r.get("training")]
        if peaks:
            cell["training_peak_kurtosis"] = max(peaks)
            cell["training_peak_max_abs"] = max(max(r["training"]["max_abs"]) for r in runs if r.get("training"))
        out.append(cell)
    return out


def fmt(stat: dict, scale: float = 1.0, digits: int = 2) -> str:
    mean, std = stat["mean"] * scale, stat["std"]
    return f"{mean:.{digits}f}" + (f" ± {std * scale:.{digits}f}" if std is not None else "")


def table(results: dict, markdown: bool = False) -> None:
    rows = []
    for cell in results.get("cells", []):
        acc = cell["metric"] == "test/acc"
        scale, digits = (100.0, 2) if acc else (1.0, 3)
        rows.append({"group": cell["group"], "model": cell["model"], "seeds": len(cell["seeds"]),
                     "metric": "test acc %" if acc else "val loss",
                     "float": fmt(cell["float"], scale, digits), "kurtosis": fmt(cell["kurtosis"], digits=1),
                     "max abs": fmt(cell["max_abs"], digits=1), "W8A8": fmt(cell["w8a8"], scale, digits),
                     "W8A8 drop": fmt(cell["w8a8_degradation"], scale, digits),
                     "torchao int8": fmt(cell["torchao_int8"], scale, digits),
                     "torchao drop": fmt(cell["torchao_degradation"], scale, digits),
                     "int8 speed": fmt(cell["torchao_speedup"]) + "x",
                     "compiled": (f"{cell['torchao_speedup_compiled_seed0']:.2f}x"
                                  if "torchao_speedup_compiled_seed0" in cell else "-"),
                     "train peak kurt": (f"{cell['training_peak_kurtosis']:.1f}"
                                         if "training_peak_kurtosis" in cell else "-")})
    if not markdown:
        print_table("outliers (bench/results/outliers.json)", rows, list(rows[0]) if rows else ["group"])
        return
    columns = list(rows[0]) if rows else ["group"]
    print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(f"`{v}`" if k == "model" else str(v) for k, v in row.items()) + " |")


def add_row(key: str, row: dict) -> None:
    """Put one run's row into the JSON: read, add, write, under a lock (two of these may run side by side)."""
    with locked("outliers"):
        results = json.loads(OUT.read_text()) if OUT.is_file() else {"rows": {}}
        results["rows"][key] = row
        results["cells"] = summarize(results["rows"])
        write_json("outliers", {"command": "python bench/outliers.py", "cpu_flags": cpu_flags(), "threads": 1,
                                "rows": results["rows"], "cells": results["cells"]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", nargs="+", default=list(STUDY), choices=STUDY)
    parser.add_argument("--data-root", default="../shared/data")
    parser.add_argument("--redo", action="store_true", help="measure again runs already in the JSON")
    parser.add_argument("--table", action="store_true", help="only print the table from the JSON")
    parser.add_argument("--markdown", action="store_true", help="print the README's table from the JSON")
    args = parser.parse_args()
    results = json.loads(OUT.read_text()) if OUT.is_file() else {"rows": {}}
    if args.markdown:
        table(results, markdown=True)
        return
    if not args.table:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        board = RESULTS / "leaderboard.json"
        finished = json.loads(board.read_text())["runs"] if board.is_file() else {}
        groups = {g.name: g for g in GROUPS}
        for name in args.groups:
            g = groups[name]
            for seed in g.seeds:
                for model in g.models:
                    run = Run(g, model, seed)
                    if run.key not in finished or (run.key in results["rows"] and not args.redo):
                        continue
                    row = measure(run, Path(args.data_root))
                    add_row(run.key, row)
                    print(f"{run.key}: float {row['float']:.4f}, kurtosis {row['kurtosis']:.1f}, max|x| "
                          f"{row['max_abs']:.1f}, W8A8 {row['w8a8']:.4f}, torchao {row['torchao_int8']:.4f} "
                          f"({row['torchao_speedup']:.2f}x)", flush=True)
        if OUT.is_file():
            results = json.loads(OUT.read_text())
    table(results)


if __name__ == "__main__":
    main()
