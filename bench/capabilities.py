"""What each attention mechanism loses: mechanism x capability task x seed at one equal budget (issue 24).

    python bench/capabilities.py                     # run what is missing, then print the table
    python bench/capabilities.py --only 'mqar/*'     # runs whose key (task/model/seed) matches
    python bench/capabilities.py --list              # the runs and whether they are done, nothing run
    python bench/capabilities.py --table             # the table from bench/results/capabilities.json
    python bench/capabilities.py --tiny              # a smoke run: tiny models, few steps, its own file
    python bench/capabilities.py --grid --seeds 0    # Zoology's grid: MQAR against width and pairs
    python bench/capabilities.py --references stdlib # n-gram losses on a text task's test windows

Every run trains one model (`embed_dim` 64, 2 layers, 2 heads; the grid's smallest setting in
Zoology, Arora et al. 2023) for the same number of optimizer steps with the same batch, learning
rate and warm-up (`zoo.training.SequenceTask`, AdamW with cosine decay), then tests it on the
task's fixed test set at the training length and at 2x, 4x, 8x and 16x it (induction heads: to 8x).
A model with learned positions cannot be tested beyond them: its record says so (`not_tested`)
instead of a number.
Each run's record goes into bench/results/capabilities.json as soon as it ends (a temporary file,
then a rename, under a lock), so the script can be stopped and started again: finished runs are
skipped. Runs take one thread each.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, locked, machine, print_table  # noqa: E402
from zoo.utils.atomic import write_text_atomic  # noqa: E402

OUT = RESULTS / "capabilities.json"
TINY_OUT = RESULTS / "capabilities_tiny.json"
DATA = Path(os.environ.get("ZOO_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
# "name:sincos": the model with sinusoidal positions, so that softmax attention is also tested beyond its
# training length (with learned positions it cannot be); "elita-gpt-tiny:alibi": ELiTA with ALiBi's fading
# history instead of its sines (attention_options positions alibi, pos_dim 0); "micro-gpt-tiny:alibi": micro's
# mean fading the same way (attention_options positions alibi); "name:conv" below
MODELS = ("gpt-tiny", "gpt-tiny:sincos", "gpt-tiny:rope", "gpt-tiny:alibi", "quiet-gpt-tiny", "micro-gpt-tiny",
          "micro-gpt-tiny:alibi", "elita-gpt-tiny", "elita-gpt-tiny:alibi", "incontext-gpt-tiny",
          "hybrid-micro-gpt-tiny", "hybrid-elita-gpt-tiny", "hybrid-micro-gpt-tiny:conv", "hybrid-elita-gpt-tiny:conv",
          "hybrid-elita-gpt-tiny:conv1")
# the linear mechanisms' own fading history ("elita-gpt-tiny:alibi", "micro-gpt-tiny:alibi"): ELiTA drops its
# sines for it, micro's mean has none to drop
FADING = {"elita": {"positions": "alibi", "pos_dim": 0}, "micro": {"positions": "alibi"}}
# "name:conv": the model with a short causal convolution of this width at the start of every block
# (TextTransformer's short_conv; Based, Arora et al. 2024, pairs linear attention with such short ones);
# "name:conv1": in the first block only (hybrid-elita-conv1-gpt-tiny's form: decoding pays for one);
# "name:w128": the model at width 128 (Zoology's grid, below); variants combine: "name:conv:w128"
CONV_WIDTH = 4
# The hybrids at the suite's depth: linear-time blocks, then one softmax block last (bench/hybrid_placement.py),
# no positions (the linear blocks carry order)
MIXES = {"hybrid-micro-gpt-tiny": "micro", "hybrid-elita-gpt-tiny": "elita"}
# The calibration (issue 24): with GPT-2's initialization (an output layer tied to token embeddings of std 0.02)
# softmax attention stayed at chance on MQAR for 5,000 steps at this width and first reached 97% near 9,000;
# with PyTorch's own defaults (an untied output layer, embeddings of std 1) it passes 99% within 1,000 steps.
SIZE = {"embed_dim": 64, "depth": 2, "num_heads": 2, "tie_embeddings": False, "embed_std": 1.0}
FACTORS = (1, 2, 4, 8, 16)  # the test lengths, as multiples of the training length


def lengths(n: int) -> list[int]:
    return [n * f for f in FACTORS]


# task -> (data class in zoo.data, its arguments); batch size and steps are the budget's, below
TASKS = {
    # the calibrated setting (recipes/gpt-tiny.mqar.yaml): Zoology's smallest grid point, vocabulary 256
    "mqar": ("MQAR", {"vocab_size": 256, "sequence_length": 64, "num_pairs": 4, "test_lengths": lengths(64)}),
    # Mamba's task at 1/32 of its length (4,096): 16 data tokens among 96 noise tokens, then 16 markers
    "selective_copying": ("SelectiveCopying", {"vocab_size": 16, "sequence_length": 128, "num_tokens": 16,
                                               "test_lengths": lengths(128)}),
    # vocabulary 256 as for MQAR (recipes/gpt-tiny.induction.yaml has the calibration: softmax attention with
    # rotary positions 99.96%). Segments of at least a quarter of the length, of distinct tokens: 256 allows
    # lengths up to 1,023, so 2x, 4x and 8x, not 16x
    "induction_heads": ("InductionHeads", {"vocab_size": 256, "sequence_length": 64, "test_lengths": lengths(64)[:4]}),
    # Zoology's grid (their Figure 2) where this budget reaches: more pairs at the same length; with the ":w128"
    # models, accuracy against width and pairs (python bench/capabilities.py --grid)
    "mqar_p8": ("MQAR", {"vocab_size": 256, "sequence_length": 64, "num_pairs": 8}),
    "mqar_p16": ("MQAR", {"vocab_size": 256, "sequence_length": 64, "num_pairs": 16}),
    "listops": ("ListOps", {"max_depth": 10, "max_args": 10, "min_length": 100, "max_length": 500}),
    "pixel_mnist": ("PixelMNIST", {"root": str(DATA), "batch_size": 50}),  # LRA's batch
    "pixel_mnist_permuted": ("PixelMNIST", {"root": str(DATA), "permute": True, "batch_size": 50}),
    "warpeace": ("LongContextText", {"path": str(DATA / "warpeace" / "warpeace_input.txt"), "context_length": 1024,
                                     "batch_size": 8}),
    "stdlib": ("LongContextText", {"path": "stdlib", "context_length": 1024, "batch_size": 8}),
}
# Zoology's Figure 2 at this budget (--grid): MQAR accuracy against width and pairs, sequence length 64
GRID_TASKS = ("mqar", "mqar_p8", "mqar_p16")
GRID_MODELS = ("gpt-tiny", "micro-gpt-tiny", "elita-gpt-tiny", "hybrid-elita-gpt-tiny:conv")
GRID_WIDTHS = (64, 128)  # 64 is SIZE's
# batch_size where the task does not set its own (long sequences take fewer)
BUDGET = {"steps": 2000, "batch_size": 64, "lr": 1e-3, "warmup_steps": 100, "weight_decay": 0.1}
SEEDS = (0, 1, 2)
# --tiny: every task at a size that runs in seconds, to check the pipeline end to end
TINY_TASKS = {
    "mqar": ("MQAR", {"vocab_size": 64, "sequence_length": 32, "num_pairs": 4, "test_lengths": [64]}),
    "selective_copying": ("SelectiveCopying", {"sequence_length": 32, "num_tokens": 4, "test_lengths": [64]}),
    "induction_heads": ("InductionHeads", {"vocab_size": 64, "sequence_length": 32, "test_lengths": [64]}),
    "listops": ("ListOps", {"max_depth": 4, "max_args": 4, "min_length": 5, "max_length": 40}),
    "stdlib": ("LongContextText", {"path": "stdlib", "context_length": 64, "val_windows": 4}),
}
TINY_BUDGET = {"steps": 10, "batch_size": 8, "lr": 1e-3, "warmup_steps": 2, "weight_decay": 0.1}
TINY_SIZE = {"embed_dim": 32, "depth": 1, "num_heads": 2}
SAMPLES = {"MQAR", "SelectiveCopying", "InductionHeads", "ListOps"}  # generated: their set sizes are ours to choose


def build_data(task: str, spec: tuple, batch_size: int, seed: int, tiny: bool, full_lengths: bool = True):
    import zoo.data

    name, kwargs = spec
    kwargs = {"batch_size": batch_size, **kwargs, "seed": seed}
    if name in SAMPLES:
        kwargs.update({"val_samples": 16, "test_samples": 32} if tiny else {"val_samples": 200, "test_samples": 500})
    if not full_lengths:
        kwargs.pop("test_lengths", None)
    return getattr(zoo.data, name)(**kwargs)


def run_one(task: str, model: str, seed: int, tiny: bool, keep: Path | None = None) -> dict:
    """Train and test one model on one task; the record for the JSON. keep: a folder to save the trained
    model in, as a release folder (zoo.load reads it), for pictures of what it learned."""
    import lightning as L

    from zoo.training.sequence import SequenceTask

    spec = (TINY_TASKS if tiny else TASKS)[task]
    budget, size = (TINY_BUDGET, TINY_SIZE) if tiny else (BUDGET, SIZE)
    name, *variants = model.split(":")
    for variant in variants:
        if variant == "alibi" and name.split("-")[0] in FADING:  # the mechanism's own fading option
            size = {**size, "attention_options": dict(FADING[name.split("-")[0]])}
        elif variant == "conv":  # a short convolution at the start of every block (Based's local mixing)
            size = {**size, "short_conv": CONV_WIDTH}
        elif variant == "conv1":
            size = {**size, "short_conv": [CONV_WIDTH] + [0] * (size["depth"] - 1)}
        elif variant.startswith("w") and variant[1:].isdigit():  # Zoology's grid: the model at another width
            size = {**size, "embed_dim": int(variant[1:])}
        else:
            size = {**size, "pos_embed": variant}
    if name in MIXES:  # registered with 4 blocks; here at the suite's depth
        blocks = [MIXES[name]] * (size["depth"] - 1) + ["softmax"]
        size, name = {**size, "attention": blocks, "pos_embed": "none"}, "gpt-tiny"
    L.seed_everything(seed, verbose=False)
    data = build_data(task, spec, budget["batch_size"], seed, tiny)
    hyper = {k: budget[k] for k in ("lr", "warmup_steps", "weight_decay")}
    not_tested = None
    try:
        module = SequenceTask(name, size, data.data_info, **hyper)
    except ValueError as error:  # learned positions: tested at the training length only, and the record says why
        if "learned positions" not in str(error):
            raise
        not_tested = str(error)
        data = build_data(task, spec, budget["batch_size"], seed, tiny, full_lengths=False)
        module = SequenceTask(name, size, data.data_info, **hyper)
    trainer = L.Trainer(max_steps=budget["steps"], max_epochs=-1, limit_val_batches=0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu")
    start = time.perf_counter()
    trainer.fit(module, data)
    seconds = time.perf_counter() - start
    data.setup("test")
    metrics = module.evaluate(data.test_dataloader())
    if keep is not None:
        from zoo.models.pretrained import save_pretrained

        save_pretrained(module.model, keep, extra={"metrics": metrics})
    return {"task": task, "model": model, "seed": seed, **budget, "batch_size": data.batch_size, "size": size,
            "data": data.describe(),
            "train_seconds": round(seconds, 1), "metrics": metrics,
            "loss_by_position": module.position_loss.get("test"), "not_tested": not_tested}


def load(out: Path) -> dict:
    return json.loads(out.read_text()) if out.is_file() else {"runs": {}}


def add_record(out: Path, key: str, record: dict, command: str = "python bench/capabilities.py") -> None:
    """Put one run's record into the JSON: read, add, write, under a lock (runners may work side by side)."""
    with locked(out.stem):
        results = load(out)
        results["runs"][key] = record
        results.update({"command": command, "machine": machine()})
        write_text_atomic(out, json.dumps(results, indent=2))


def text_references(task: str, orders=(1, 2, 3, 4)) -> dict:
    """Held-out loss of n-gram models counted on a text task's training split, over the characters its test
    windows score: what reading only the last n - 1 characters reaches, beside the models' loss."""
    from bench.long_context import ngram_loss

    data = build_data(task, TASKS[task], 1, 0, False)
    scored = data.val_tokens[: data.val_windows * data.context_length + 1]
    vocab = data.tokenizer.vocab_size
    return {f"{n}-gram": round(ngram_loss(data.train_tokens, scored, n, vocab), 4) for n in orders}


def table(results: dict) -> None:
    rows = []
    for key, r in sorted(results["runs"].items()):
        m = r["metrics"]
        row = {"run": key, "train s": r["train_seconds"]}
        if r.get("loss_by_position"):
            buckets = list(r["loss_by_position"].items())
            row.update({f"loss {k}": v for k, v in buckets[-3:]})
        else:
            row.update({k.removeprefix("test/accuracy"): v for k, v in m.items() if k.startswith("test/accuracy@")})
        if r.get("not_tested"):
            row["note"] = "learned positions: training length only"
        rows.append(row)
    columns = sorted({c for row in rows for c in row}, key=lambda c: (c != "run", c != "train s", c))
    print_table("capabilities: test accuracy by length (@N), or loss by position for text", rows, columns)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="*", help="a pattern on run keys task/model/seed, e.g. 'mqar/*/0'")
    parser.add_argument("--models", nargs="+", default=None, help="default: every model of the suite")
    parser.add_argument("--seeds", nargs="+", type=int, default=None)
    parser.add_argument("--grid", action="store_true",
                        help=f"Zoology's grid instead: {', '.join(GRID_TASKS)} x {', '.join(GRID_MODELS)} at widths "
                             f"{' and '.join(map(str, GRID_WIDTHS))}")
    parser.add_argument("--tiny", action="store_true", help="tiny models and data, few steps (a smoke run)")
    parser.add_argument("--out", type=Path, default=None, help=f"the JSON (default {OUT}; with --tiny {TINY_OUT})")
    parser.add_argument("--references", metavar="TASK", choices=[t for t, (name, _) in TASKS.items()
                                                                  if name == "LongContextText"],
                        help="print n-gram references for a text task's test windows (warpeace, stdlib), run nothing")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--table", action="store_true")
    args = parser.parse_args(argv)
    if args.references:
        try:
            references = text_references(args.references)
        except FileNotFoundError as error:  # War and Peace outside ZOO_DATA
            parser.error(str(error))
        print(f"{args.references}: n-gram models on its test windows (nats per character)", references)
        return
    out = args.out or (TINY_OUT if args.tiny else OUT)
    seeds = args.seeds if args.seeds is not None else ([0] if args.tiny else list(SEEDS))
    if args.grid and (args.models or args.tiny):
        parser.error("--grid runs its own models and sizes: narrow it with --only, e.g. --only 'mqar_p8/*'")
    if args.grid:
        models = [m + ("" if w == SIZE["embed_dim"] else f":w{w}") for m in GRID_MODELS for w in GRID_WIDTHS]
        tasks = GRID_TASKS
    else:  # the grid's extra tasks only with --grid
        models = args.models or list(MODELS)
        tasks = [t for t in (TINY_TASKS if args.tiny else TASKS) if t not in GRID_TASKS[1:]]
    runs = [(t, m, s) for s in seeds for t in tasks for m in models if fnmatch.fnmatch(f"{t}/{m}/{s}", args.only)]
    if not runs and not args.table:
        parser.error(f"--only {args.only!r} matches no run of these tasks, models and seeds (keys are "
                     "task/model/seed, e.g. 'mqar/gpt-tiny/0'; --list shows them)")
    done = load(out)["runs"]
    if args.list:
        for t, m, s in runs:
            print(f"{t}/{m}/{s}: {'done' if f'{t}/{m}/{s}' in done else 'to run'}")
        return
    if not args.table:
        torch.set_num_threads(1)
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        for t, m, s in runs:
            key = f"{t}/{m}/{s}"
            if key in load(out)["runs"]:
                continue
            print(f"{key} ...", flush=True)
            try:
                record = run_one(t, m, s, args.tiny)
            except FileNotFoundError as error:  # a task's data outside ZOO_DATA (MNIST, War and Peace)
                parser.error(f"{key}: {error}")
            add_record(out, key, record)
    table(load(out))


if __name__ == "__main__":
    main()
