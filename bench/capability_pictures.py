"""Where a query's attention goes on MQAR or induction heads, in models that succeed and in ones that do not.

    python bench/capability_pictures.py            # MQAR: trains the models it lacks, then measures and draws
    python bench/capability_pictures.py --task induction_heads
    python bench/capability_pictures.py --table    # the table from bench/results/capability_pictures.json
    python bench/capability_pictures.py --models gpt-tiny:alibi gpt-tiny:rope --name mqar_positions  # other models,
                                                   # into files of their own
    python bench/capability_pictures.py --task induction_heads --models hybrid-elita-gpt-tiny:conv
        hybrid-micro-gpt-tiny:conv --lr 1e-3 --name induction_hybrids  # every model at one rate, not its cell's

Each model is trained on the task exactly as bench/capabilities.py trains it (its key TASK/MODEL/0: the same data,
budget, seed and learning rate: the one its cell's sweep chose in bench/results/capabilities.json, else the
budget's) unless --lr gives a rate, and kept as a release folder under bench/runs/capabilities/, one per rate.
Test sequences then go through zoo.viz.capture. MQAR: a query at position q repeats the key of pair p; the answer,
p's value, sits at position 2p + 1. Induction heads: the token at q appeared once before, at p, and the answer is
the token that followed it, at p + 1. "On the answer" is the weight a query's row puts on that position (mean over
queries, per layer and head); spreading a row evenly over what it sees would put 1 / (q + 1) there ("even"). "On
itself" is the weight on the query's own token: for elita the gate g_i on V x_i, the rest of its output being its
running mean of earlier tokens.
For micro the row is the weight of each token in the mean that the query subtracts; for elita, the convex
mix of the token itself and its running mean (zoo.viz.capture says what each mechanism gives).

MQAR also asks where recall fails: accuracy by how far back the answer lies (query position minus answer
position, in bands that double: 1, 2-3, 4-7, ...) over the whole fixed test set at every test length the
model's positions reach, and the weight each answer (a value) puts on its key, the token before it: the
first step of recall, where the value takes in which key it belongs to ("layer i on its key").

Induction heads is split by the answer's own position: accuracy over the whole test set at the
training length, in the same doubling bands, by the answer's position a, the tokens 0..a being what a running
mean (elita's history) holds there ("by answer position").

Writes docs/images/NAME_attention.png (each model's last layer on one test sequence, one panel per head),
docs/images/NAME_on_answer.png (the best head's weight on the answer, per layer and model),
docs/images/NAME_by_distance.png (MQAR: accuracy against the distance, at each model's longest test length) and
bench/results/capability_pictures.json (MQAR) or capability_pictures_NAME.json; NAME is the task unless
--name says otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import capabilities  # noqa: E402
from bench.common import RESULTS, machine, print_table, save_figure  # noqa: E402
from zoo.utils.atomic import write_text_atomic  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = RESULTS / "capability_pictures.json"
KEPT = ROOT / "bench" / "runs" / "capabilities"
IMAGES = ROOT / "docs" / "images"
# per task: models that succeed beside ones that fail (bench/capabilities.py's names)
MODELS = {"mqar": ("gpt-tiny", "micro-gpt-tiny", "elita-gpt-tiny", "hybrid-micro-gpt-tiny",
                   "hybrid-elita-gpt-tiny:conv"),
          "induction_heads": ("gpt-tiny:rope", "elita-gpt-tiny", "hybrid-micro-gpt-tiny:conv",
                              "hybrid-elita-gpt-tiny:conv", "hybrid-elita-gpt-tiny:conv1")}
TITLES = {"mqar": "MQAR: last layer, query rows against key columns (answers at columns 1, 3, 5, 7)",
          "induction_heads": "induction heads: last layer, query rows against key columns (an induction head is the "
                             "stripe below the diagonal: each query on the token after its first occurrence)"}
SEQUENCES = 100  # test sequences measured


def output(name: str) -> Path:
    return OUT if name == "mqar" else RESULTS / f"capability_pictures_{name}.json"


def answers(x: torch.Tensor, y: torch.Tensor, num_pairs: int) -> list[tuple[int, int, int]]:
    """(sequence, query position, answer position) for every scored query: the answer is the value beside
    the key the query repeats (keys at 0, 2, ..., values at 1, 3, ...)."""
    found = []
    for b, q in (y != -100).nonzero().tolist():
        pair = (x[b, 0: 2 * num_pairs: 2] == x[b, q]).nonzero()
        found.append((b, q, 2 * int(pair[0, 0]) + 1))
    return found


def induction_answers(x: torch.Tensor, y: torch.Tensor) -> list[tuple[int, int, int]]:
    """(sequence, query position, answer position) for every scored token of induction heads: the token at q
    appeared once before, at p, and the answer is the token that followed it, at p + 1."""
    found = []
    for b, q in (y != -100).nonzero().tolist():
        earlier = (x[b, :q] == x[b, q]).nonzero()
        found.append((b, q, int(earlier[0, 0]) + 1))
    return found


def band(distance: int) -> tuple[int, str]:
    """The band a distance falls in, as its first distance and its name: 1, 2-3, 4-7, 8-15, ..."""
    low = 1 << (distance.bit_length() - 1)
    return low, str(low) if low == 1 else f"{low}-{2 * low - 1}"


def band_start(name: str) -> int:
    """A band's first distance, from its name (the JSON's keys)."""
    return int(name.split("-")[0])


def recall_by_band(predicted: torch.Tensor, y: torch.Tensor, where: list[tuple[int, int, int]], of) -> dict:
    """{band's first value: [correct, queries]} over the scored queries `where` (sequence, query position,
    answer position), each counted in the band of of(query position, answer position)."""
    counts = {}
    for b, q, a in where:
        hit = counts.setdefault(band(of(q, a))[0], [0, 0])
        hit[0] += int(predicted[b, q] == y[b, q])
        hit[1] += 1
    return counts


def recall_by_distance(predicted: torch.Tensor, x: torch.Tensor, y: torch.Tensor, num_pairs: int) -> dict:
    """MQAR's recall_by_band, the distance being the query's position minus its answer's."""
    return recall_by_band(predicted, y, answers(x, y, num_pairs), lambda q, a: q - a)


def on_answer(weights: list[torch.Tensor], where: list[tuple[int, int, int]]) -> tuple[torch.Tensor, float]:
    """The mean weight on the answer per layer and head (layers, heads), and the even spread's 1 / (q + 1)."""
    per_query = torch.stack([torch.stack([w[b, :, q, a] for w in weights]) for b, q, a in where])
    return per_query.mean(0), sum(1 / (q + 1) for _, q, _ in where) / len(where)


def look(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, where: list[tuple[int, int, int]]):
    """Run the model on x under zoo.viz.capture: ({accuracy on y's scored tokens, per layer and head the mean
    weight on the answer and on the query itself over the queries `where`, each layer's attention}, every layer's
    weights, the even spread's weight on the answer). Leaves the model's mode as it found it."""
    from zoo.viz import capture

    training = model.training
    model.eval()
    with capture(model) as maps, torch.no_grad():
        logits = model(x)
    model.train(training)
    weights = [m.weights.float() for m in maps]
    weight, even = on_answer(weights, where)
    itself, _ = on_answer(weights, [(b, q, q) for b, q, _ in where])
    scored = y != -100
    accuracy = float((logits.argmax(-1)[scored] == y[scored]).float().mean())
    return {"accuracy": round(accuracy, 4),
            "on_answer": [[round(float(v), 4) for v in layer] for layer in weight],
            "on_itself": [[round(float(v), 4) for v in layer] for layer in itself],
            "attention": [m.kind for m in maps]}, weights, even


def measure(folder: Path, data, task: str = "mqar") -> tuple[dict, torch.Tensor]:
    import zoo

    model = zoo.load(str(folder)).eval()
    x, y = next(iter(torch.utils.data.DataLoader(data.test_sets[0], batch_size=SEQUENCES)))
    where = answers(x, y, data.num_pairs) if task == "mqar" else induction_answers(x, y)
    seen, weights, even = look(model, x, y, where)
    record = {"accuracy": seen["accuracy"], "queries": len(where), "even": round(even, 4),
              **{k: seen[k] for k in ("on_answer", "on_itself", "attention")}}
    if task == "mqar":
        on_key, key_even = on_answer(weights, [(b, a, a - 1) for b, _, a in where])
        record["on_key"] = [[round(float(v), 4) for v in layer] for layer in on_key]
        record["on_key_even"] = round(key_even, 4)  # an answer near the start sees few tokens: even is high
        record["by_distance"] = distances(model, data)
    else:
        record["by_answer_position"] = answer_positions(model, data)
    return record, weights[-1][0]  # the last layer's heads on the first sequence


def recall_over(model, test_set, batch_size: int, count) -> dict:
    """count(predicted, x, y) ({band's first value: [correct, queries]}, one batch's) summed over a whole test
    set: {band's name: [correct, queries]}, bands in order."""
    counts = {}
    for x, y in torch.utils.data.DataLoader(test_set, batch_size=batch_size):
        with torch.no_grad():
            predicted = model(x).argmax(-1)
        for low, (hits, total) in count(predicted, x, y).items():
            counts[low] = [a + b for a, b in zip(counts.get(low, [0, 0]), (hits, total))]
    return {band(low)[1]: counts[low] for low in sorted(counts)}


def distances(model, data) -> dict:
    """recall_by_distance over each whole test set whose length the model's positions reach (learned
    positions: up to their context): {length: {band's name: [correct, queries]}}."""
    from zoo.training.sequence import position_reach

    return {str(length): recall_over(model, test_set, max(1, SEQUENCES * 64 // length),
                                     lambda predicted, x, y: recall_by_distance(predicted, x, y, data.num_pairs))
            for length, test_set in zip(data.test_lengths, data.test_sets) if length <= position_reach(model)}


def answer_positions(model, data) -> dict:
    """Induction heads: recall_by_band over the whole test set at the training length, by the answer's own
    position a (a running mean there holds the a + 1 tokens 0..a): {band's name: [correct, queries]}."""
    return recall_over(model, data.test_sets[0], SEQUENCES,
                       lambda predicted, x, y: recall_by_band(predicted, y, induction_answers(x, y), lambda q, a: a))


def training_rate(task: str, model: str, lr: float | None) -> float:
    """The rate a picture's model trains at: lr if given, else the one the suite's runs of the cell use."""
    if lr is not None:
        return lr
    return capabilities.wanted_lr(capabilities.load(capabilities.OUT), task, model, capabilities.BUDGET["lr"])


def draw(records: dict, last: dict, task: str = "mqar", name: str = "mqar") -> None:
    from zoo.viz import figures

    IMAGES.mkdir(parents=True, exist_ok=True)
    maps = torch.cat([last[m] for m in records])
    labels = [f"{m}\nhead {h}, lr {records[m]['lr']:g} ({records[m]['accuracy']:.0%})"
              for m in records for h in range(len(last[m]))]
    figure = figures.heatmaps_figure(maps, labels, title=TITLES[task])
    save_figure(figure, IMAGES / f"{name}_attention.png")
    layers = max(len(r["on_answer"]) for r in records.values())
    series = {f"layer {i}": [max(r["on_answer"][i]) if i < len(r["on_answer"]) else 0 for r in records.values()]
              for i in range(layers)}
    series["even spread"] = [r["even"] for r in records.values()]
    figure = figures.bars_figure([f"{m}\nlr {r['lr']:g}" for m, r in records.items()], series,
                                 "weight on the answer (best head)",
                                 f"{'MQAR' if task == 'mqar' else 'induction heads'}: how much of a query's row "
                                 "lands on the token it must recall")
    save_figure(figure, IMAGES / f"{name}_on_answer.png")
    if task == "mqar":  # recall by distance, at the longest length each model reaches
        series = {}
        for model, r in records.items():
            length, bands = max(r["by_distance"].items(), key=lambda item: int(item[0]))
            series[f"{model} (lr {r['lr']:g}, length {length})"] = (
                [band_start(k) for k in bands], [100 * hit / total for hit, total in bands.values()])
        figure = figures.lines_figure(series, "answer this many tokens back (first of a band: 1, 2-3, 4-7, ...)",
                                      "accuracy %", "MQAR: recall against how far back the answer lies", log=False)
        figure.axes[0].set_xscale("log", base=2)
        figure.axes[0].legend(loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the lines, not over them
        save_figure(figure, IMAGES / f"{name}_by_distance.png")


def table(results: dict, task: str = "mqar") -> None:
    rows = [{"model": m, "lr": r.get("lr", "-"), "accuracy": r["accuracy"], "even": r["even"],
             **{f"layer {i} best head": max(v) for i, v in enumerate(r["on_answer"])},
             **{f"layer {i} on itself": round(sum(v) / len(v), 4) for i, v in enumerate(r.get("on_itself", []))},
             **{f"layer {i} on its key": max(v) for i, v in enumerate(r.get("on_key", []))},
             **({"on its key, even": r["on_key_even"]} if "on_key_even" in r else {})}
            for m, r in results["models"].items()]
    print_table(f"{task}: weight a query puts on its answer (mean over queries)", rows, list(rows[0]))
    rows = [{"model": m, "length": length, **{k: f"{hit / total:.1%} of {total}" for k, (hit, total) in bands.items()}}
            for m, r in results["models"].items() for length, bands in r.get("by_distance", {}).items()]
    if rows:
        columns = ["model", "length"] + sorted({k for row in rows for k in row} - {"model", "length"},
                                               key=band_start)
        print_table(f"{task}: accuracy by how far back the answer lies (query position - answer position)", rows,
                    columns)
    rows = [{"model": m, **{k: f"{hit / total:.1%} of {total}" for k, (hit, total) in r["by_answer_position"].items()}}
            for m, r in results["models"].items() if "by_answer_position" in r]
    if rows:
        columns = ["model"] + sorted({k for row in rows for k in row} - {"model"}, key=band_start)
        print_table(f"{task}: accuracy by the answer's position (the tokens a running mean holds there)", rows,
                    columns)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="mqar", choices=list(MODELS))
    parser.add_argument("--models", nargs="+", default=None, help="bench/capabilities.py's names (default: the "
                                                                   "task's pair of successes and failures)")
    parser.add_argument("--name", default=None, help="the stem of the JSON and pictures written (default: the "
                                                     "task); give one with --models or --lr, so as not to replace the "
                                                     "task's")
    parser.add_argument("--lr", type=float, default=None, help="train every model at this rate (default: each at "
                                                                 "the rate the suite's runs of its cell use)")
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args(argv)
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        parser.error(f"--lr must be a positive number, got {args.lr}")
    task, name = args.task, args.name or args.task
    if not re.fullmatch(r"[A-Za-z0-9_]+", name):
        raise SystemExit(f"bench/capability_pictures.py: error: --name must be letters, digits and '_' (it names "
                         f"files), got {name!r}")
    if (args.models or args.lr is not None) and args.name is None:
        raise SystemExit(f"bench/capability_pictures.py: error: {'--models' if args.models else '--lr'} needs --name, "
                         f"so that the task's own results ({output(task).name}) and pictures are not replaced")
    args.models = args.models or list(MODELS[task])
    for model in args.models:  # the suite's models and their variants (bench/capabilities.py's MODELS)
        if why := capabilities.unbuildable(model):
            raise SystemExit(f"bench/capability_pictures.py: error: --models {model}: {why}")
    if not args.table:
        torch.set_num_threads(1)
        records, last = {}, {}
        for model in args.models:
            lr = training_rate(task, model, args.lr)
            folder = KEPT / f"{task}-{model.replace(':', '-')}-0-lr{lr:g}"  # (no colon in a folder name)
            if not (folder / "config.json").is_file():
                print(f"training {task}/{model}/0 at lr {lr:g} ...", flush=True)
                capabilities.run_one(task, model, 0, tiny=False, keep=folder, lr=lr)
            data = capabilities.build_data(task, capabilities.TASKS[task], 64, 0, tiny=False,
                                           full_lengths=task == "mqar")  # MQAR: recall by distance at every length
            data.setup("test")
            records[model], last[model] = measure(folder, data, task)
            records[model] = {"lr": lr, **records[model]}
        draw(records, last, task, name)
        command = " ".join(["python bench/capability_pictures.py"] + ([] if task == "mqar" else ["--task", task])
                           + (["--models", *args.models] if args.models != list(MODELS[task]) else [])
                           + (["--lr", f"{args.lr:g}"] if args.lr is not None else [])
                           + (["--name", name] if args.name else []))
        write_text_atomic(output(name), json.dumps({"models": records, "command": command, "machine": machine()},
                                                   indent=2))
    table(json.loads(output(name).read_text()), task)


if __name__ == "__main__":
    main()
