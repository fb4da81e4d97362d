"""What each attention mechanism loses: mechanism x capability task x seed at one equal budget.

    python bench/capabilities.py                     # run what is missing, then print the table
    python bench/capabilities.py --only 'mqar/*'     # runs whose key (task/model/seed) matches
    python bench/capabilities.py --list              # the runs and whether they are done, nothing run
    python bench/capabilities.py --table             # the table from bench/results/capabilities.json
    python bench/capabilities.py --tiny              # a smoke run: tiny models, few steps, its own file
    python bench/capabilities.py --grid --seeds 0    # Zoology's grid: MQAR against width and pairs
    python bench/capabilities.py --mini --sweep      # the mini models on Zoology's harder MQAR (hours a run here)
    python bench/capabilities.py --mini --sweep --accelerator gpu \
        --out bench/results/capabilities_gpu.json    # ... on one CUDA GPU: a file of its own, each record's device
    python bench/capabilities.py --references stdlib # n-gram losses on a text task's test windows
    python bench/capabilities.py --sweep --only 'mqar/*'  # each cell's learning rate from a sweep at seed 0
    python bench/capabilities.py --sweep --sweep-seeds 3 --only 'mqar/gpt-tiny/*' \
        --out bench/results/capabilities_sweep_seeds.json  # the rate chosen on the mean of seeds 0, 1 and 2
    python bench/capabilities.py --markdown          # the README's tables: mean ± std over seeds, from the JSON
    python bench/capabilities.py --estimate --only 'listops/*' --seeds 0  # minutes a run would take here
    python bench/capabilities.py --grid --steps 8000 --out bench/results/capabilities_8000_steps.json \
        --only 'mqar_p16/gpt-tiny/0'                 # off the equal budget: longer training, a file of its own
    python bench/capabilities.py --models gpt-tiny:alibi:bias_max2 --only 'mqar/*' \
        --out bench/results/capabilities_alibi_slopes.json  # a variant outside the suite: a file of its own
    python bench/capabilities.py --readme README.md  # the tables into README's <!-- capabilities:TASK --> markers
        # (TASK also "grid", "sweep": each sweep's validation accuracy at every rate it ran, and "compute":
        #  the training hours every results file of COMPUTE_FILES holds)
        # (with --out bench/results/capabilities_alibi_slopes.json: into <!-- capabilities_alibi_slopes:TASK -->)
        # (with --out bench/results/capabilities_sweep_seeds.json also "repeats": how its seed-0 points repeat
        #  the suite's sweep points, rate by rate, on the same or another kind of CPU)

Every run trains one model (`embed_dim` 64, 2 layers, 2 heads; the grid's smallest setting in
Zoology, Arora et al. 2023) for the same number of optimizer steps with the same batch, learning
rate and warm-up (`zoo.training.SequenceTask`, AdamW with cosine decay), then tests it on the
task's fixed test set at the training length and at 2x, 4x, 8x and 16x it (induction heads: to 8x).
A model with learned positions cannot be tested beyond them: its record says so (`not_tested`)
instead of a number.
The learning rate is the budget's 1e-3 unless the cell (task and model) was swept: `--sweep` trains seed 0
at each of SWEEP_LRS (climbing on through SWEEP_CLIMB while the largest rate is the best), keeps the one with
the best validation accuracy as seed 0's run, as Zoology does, and later seeds of that cell train at it.
With --sweep-seeds K it trains seeds 0 to K-1 at each rate and chooses on their mean: one seed can choose a
rate where it alone learns the task.
Each run's record goes into bench/results/capabilities.json as soon as it ends (a temporary file,
then a rename, under a lock), so the script can be stopped and started again: finished runs are
skipped. Runs take one thread each unless --threads says otherwise.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import re
import statistics
import sys
import time
import warnings
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zoo  # noqa: E402
from bench import common  # noqa: E402
from bench.common import RESULTS, locked, machine, print_table, write_json  # noqa: E402
from zoo.data.sequences import TEST_SEED, VAL_SEED, fixed_seed  # noqa: E402
from zoo.release.check import cores  # noqa: E402
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
          "hybrid-elita-gpt-tiny:conv1",
          # the field's yardsticks: a sliding window of 64 tokens (rotary positions), GLA, Gated DeltaNet, Mamba-2's SSD
          "window-gpt-tiny", "gla-gpt-tiny", "deltanet-gpt-tiny", "ssd-gpt-tiny")
# the linear mechanisms' own fading history ("elita-gpt-tiny:alibi", "micro-gpt-tiny:alibi"): ELiTA drops its
# sines for it, micro's mean has none to drop
FADING = {"elita": {"positions": "alibi", "pos_dim": 0}, "micro": {"positions": "alibi"}}
# "name:conv": the model with a short causal convolution of this width at the start of every block
# (TextTransformer's short_conv; Based, Arora et al. 2024, pairs linear attention with such short ones);
# "name:conv1": in the first block only (hybrid-elita-conv1-gpt-tiny's form: decoding pays for one);
# "name:w128": the model at width 128 (Zoology's grid, below); "name:alibi:bias_max2": ALiBi with the slopes
# 2^(-2 h / heads) (the paper's exponent 8 replaced by 2: at 2 heads 1/2 and 1/4, the steepest two of the
# paper's eight heads), "name:alibi:bias_max2-16" 2 in the first block and 16 in the second; tried outside
# the suite (a file of its own, below); variants combine: "name:conv:w128". "name:shipped" is the registered
# architecture exactly as `zoo.create(name)` builds it (its width, depth, heads and initialization), with only
# the task's vocabulary and length: the model a figure for `name` itself must be measured on; "name:calibrated"
# is that architecture with the suite's calibrated initialization (SIZE's untied output layer and embeddings of
# std 1, below), which the mini study's MQAR runs take: a figure for it is named as this variant
CONV_WIDTH = 4
# The hybrids at the suite's depth: linear-time blocks, then one softmax block last (bench/hybrid_placement.py),
# no positions (the linear blocks carry order)
MIXES = {"hybrid-micro-gpt-tiny": "micro", "hybrid-elita-gpt-tiny": "elita"}
# The calibration: with GPT-2's initialization (an output layer tied to token embeddings of std 0.02)
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
    # and its next sequence length, 128, at Zoology's 8 pairs there and twice that (vocabulary still 256)
    "mqar128_p8": ("MQAR", {"vocab_size": 256, "sequence_length": 128, "num_pairs": 8}),
    "mqar128_p16": ("MQAR", {"vocab_size": 256, "sequence_length": 128, "num_pairs": 16}),
    # the mini study (--mini): Zoology's harder settings with its vocabulary of 8,192, 64 pairs at 256 and 512
    # tokens and 128 at 512, for the width-256, 6-block models
    "mqar256_p64": ("MQAR", {"vocab_size": 8192, "sequence_length": 256, "num_pairs": 64}),
    "mqar512_p64": ("MQAR", {"vocab_size": 8192, "sequence_length": 512, "num_pairs": 64}),
    "mqar512_p128": ("MQAR", {"vocab_size": 8192, "sequence_length": 512, "num_pairs": 128}),
    "listops": ("ListOps", {"max_depth": 10, "max_args": 10, "min_length": 100, "max_length": 500}),
    "pixel_mnist": ("PixelMNIST", {"root": str(DATA), "batch_size": 50}),  # LRA's batch
    "pixel_mnist_permuted": ("PixelMNIST", {"root": str(DATA), "permute": True, "batch_size": 50}),
    "warpeace": ("LongContextText", {"path": str(DATA / "warpeace" / "warpeace_input.txt"), "context_length": 1024,
                                     "batch_size": 8}),
    "stdlib": ("LongContextText", {"path": "stdlib", "context_length": 1024, "batch_size": 8}),
}
# Zoology's Figure 2 at this budget (--grid): MQAR accuracy against width and pairs, sequence lengths 64 and 128
GRID_TASKS = ("mqar", "mqar_p8", "mqar_p16", "mqar128_p8", "mqar128_p16")
GRID_MODELS = ("gpt-tiny", "micro-gpt-tiny", "elita-gpt-tiny", "hybrid-elita-gpt-tiny:conv",
               "window-gpt-tiny", "gla-gpt-tiny", "deltanet-gpt-tiny", "ssd-gpt-tiny")  # and the yardsticks
GRID_WIDTHS = (64, 128)  # 64 is SIZE's
# The mini study's MQAR (--mini): the registered mini models (width 256, 6 blocks) with
# the suite's calibrated initialization (":calibrated", below), on Zoology's harder settings
MINI_TASKS = ("mqar256_p64", "mqar512_p64", "mqar512_p128")
MINI_MODELS = ("gpt-mini", "elita-gpt-mini", "incontext-gpt-mini", "hybrid-elita-conv1-gpt-mini", "ssd-gpt-mini")
# batch_size where the task does not set its own (long sequences take fewer)
BUDGET = {"steps": 2000, "batch_size": 64, "lr": 1e-3, "warmup_steps": 100, "weight_decay": 0.1}
SEEDS = (0, 1, 2)
# Zoology chooses each cell's learning rate on the validation split, from 1e-4 to 1e-2; ours are half-decade
# steps around the calibrated 1e-3 (with three points, to 3e-3, every MQAR cell chose the top one, so 1e-2 joined).
# A best rate on the grid's top edge says only that the best lies at or above it, so a sweep climbs on, one rate
# of SWEEP_CLIMB at a time, while its largest rate so far is its best (twenty cells chose 1e-2 before it climbed).
# The text tasks are not swept: their held-out text is their test text, no split to choose on
SWEEP_LRS = (3e-4, 1e-3, 3e-3, 1e-2)
SWEEP_CLIMB = (3e-2, 1e-1)
SWEEP_MARKS = ("sweep", "sweep_seeds")  # the keys a sweep adds to the records it chose (sweep_marks, marks_in)
VALIDATED = {"MQAR", "SelectiveCopying", "InductionHeads", "ListOps", "PixelMNIST"}  # tasks with a validation split
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


def model_spec(model: str, tiny: bool = False) -> tuple[str, dict]:
    """The registered name and the size arguments (zoo.create's) of a suite model "name:variant:...", the
    variants described at MODELS."""
    size = TINY_SIZE if tiny else SIZE
    name, *variants = model.split(":")
    if variants == ["shipped"]:  # the registered architecture as shipped: its own size, depth and initialization
        return name, {}
    if variants == ["calibrated"]:  # its own size and depth, the suite's initialization
        return name, {k: size[k] for k in ("tie_embeddings", "embed_std") if k in size}
    for variant in variants:
        if variant == "alibi" and name.split("-")[0] in FADING:  # the mechanism's own fading option
            size = {**size, "attention_options": dict(FADING[name.split("-")[0]])}
        elif variant == "conv":  # a short convolution at the start of every block (Based's local mixing)
            size = {**size, "short_conv": CONV_WIDTH}
        elif variant == "conv1":
            size = {**size, "short_conv": [CONV_WIDTH] + [0] * (size["depth"] - 1)}
        elif variant.startswith("w") and variant[1:].isdigit():  # Zoology's grid: the model at another width
            size = {**size, "embed_dim": int(variant[1:])}
        elif re.fullmatch(r"bias_max\d+(-\d+)*", variant):  # ALiBi's slopes
            exponents = [int(e) for e in variant.removeprefix("bias_max").split("-")]  # all blocks', or each's
            options = [{**size.get("attention_options", {}), "alibi_bias_max": e} for e in exponents]
            size = {**size, "attention_options": options[0] if len(options) == 1 else options}
        else:
            size = {**size, "pos_embed": variant}
    if name in MIXES:  # registered with 4 blocks; here at the suite's depth
        blocks = [MIXES[name]] * (size["depth"] - 1) + ["softmax"]
        size, name = {**size, "attention": blocks, "pos_embed": "none"}, "gpt-tiny"
    return name, size


def unbuildable(model: str, tiny: bool = False) -> str | None:
    """Why zoo cannot build the suite model `model` ("name:variant:..."), or None when it can."""
    name, size = model_spec(model, tiny)
    if name not in zoo.list_models():
        return f"unknown model {name!r}; the suite's are {', '.join(MODELS)} (variants after ':', see MODELS)"
    try:
        zoo.create(name, vocab_size=16, context_length=16, **size)
    except ValueError as error:
        return str(error)
    return None


def prepare(task: str, model: str, seed: int, tiny: bool, lr: float | None = None, steps: int | None = None):
    """One run's data, SequenceTask, budget and model size, and why it is not tested beyond its training
    length (None: it is). lr, steps: instead of the budget's."""
    import lightning as L

    from zoo.training.sequence import SequenceTask

    spec = (TINY_TASKS if tiny else TASKS)[task]
    budget = TINY_BUDGET if tiny else BUDGET
    name, size = model_spec(model, tiny)
    L.seed_everything(seed, verbose=False)
    data = build_data(task, spec, budget["batch_size"], seed, tiny)
    budget = {**budget, "lr": budget["lr"] if lr is None else lr, "steps": budget["steps"] if steps is None else steps}
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
    return data, module, budget, size, not_tested


def quiet_trainer(steps: int, callbacks=(), accelerator: str = "cpu"):
    """A quiet Trainer on one device for `steps` optimizer steps: no validation, logger, checkpoints or progress
    bar. accelerator: "cpu" (the suite's records) or "gpu" (one CUDA device, float32 with TF32 matmuls)."""
    import lightning as L

    if accelerator == "gpu":  # TF32 as Lightning advises on tensor-core GPUs; the record says so (device_of)
        torch.set_float32_matmul_precision("high")
    return L.Trainer(max_steps=steps, max_epochs=-1, limit_val_batches=0, logger=False, callbacks=list(callbacks),
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     accelerator=accelerator, devices=1)


def device_of(accelerator: str) -> str:
    """What a record trained on, in words: "cpu", or the CUDA device's name and its float32 matmul precision."""
    if accelerator == "cpu":
        return "cpu"
    return f"cuda: {torch.cuda.get_device_name()}, float32 matmuls {torch.get_float32_matmul_precision()}"


def run_one(task: str, model: str, seed: int, tiny: bool, keep: Path | None = None, lr: float | None = None,
            steps: int | None = None, accelerator: str = "cpu") -> dict:
    """Train and test one model on one task; the record for the JSON. keep: a folder to save the trained
    model in, as a release folder (zoo.load reads it), for pictures of what it learned; lr, steps: instead of
    the budget's (the schedule's cosine decay stretches to the steps); accelerator: quiet_trainer's."""

    data, module, budget, size, not_tested = prepare(task, model, seed, tiny, lr, steps)
    trainer = quiet_trainer(budget["steps"], accelerator=accelerator)
    start = time.perf_counter()
    trainer.fit(module, data)
    seconds = time.perf_counter() - start
    module.to(trainer.strategy.root_device)  # Lightning hands the model back on the CPU: test where it trained
    validated = (TINY_TASKS if tiny else TASKS)[task][0] in VALIDATED
    validation = module.evaluate(data.val_dataloader(), stage="val") if validated else None
    data.setup("test")
    metrics = module.evaluate(data.test_dataloader())
    if keep is not None:
        from zoo.models.pretrained import save_pretrained

        save_pretrained(module.model.cpu(), keep, extra={"metrics": metrics})
    return {"task": task, "model": model, "seed": seed, **budget, "batch_size": data.batch_size, "size": size,
            "data": data.describe(), "train_seconds": round(seconds, 1), "threads": torch.get_num_threads(),
            "cpu_flags": common.cpu_flags(),  # a rerun repeats a record to the digit on the same kernels only
            **({} if accelerator == "cpu" else {"device": device_of(accelerator)}),  # the CPU's records as they were
            "metrics": metrics, "validation": validation,
            # which validation sets it was measured on: zoo.data's fixed sets move with VAL_SEED (stale_points)
            "validation_seed": VAL_SEED if validated else None,
            "test_seeds": test_seeds(data.describe()),
            "loss_by_position": module.position_loss.get("test"), "not_tested": not_tested}


def test_seeds(data: dict) -> dict[str, int] | None:
    """The seed of the first sequence of each fixed test set of a generated task (by length), today; None for
    a task that reads its test set (pixel MNIST, text). `data` is a record's, as SequenceData.describe gives it."""
    lengths = data["init_args"].get("test_lengths")
    return None if lengths is None else {str(n): fixed_seed(TEST_SEED, n, 0) for n in lengths}


def stale_test(record: dict) -> bool:
    """Whether a run was tested on other test sets than today's: those at lengths that are multiples of 256 moved
    off seed 0's training sequences (zoo.data.sequences.TRAINING_SEEDS). Records from before that carry no
    "test_seeds": their sets were drawn from TEST_SEED + length * 2**24 + index."""
    today = test_seeds(record["data"])
    if today is None:
        return False
    measured = record.get("test_seeds") or {n: _seed_before_test_seeds(int(n)) for n in today}
    return measured != today


def _seed_before_test_seeds(length: int) -> int:
    """The first test sequence's seed at `length` in records from before "test_seeds" (stale_test)."""
    return TEST_SEED + length * 2**24


def load(out: Path) -> dict:
    return common.read_runs(out)


def add_record(out: Path, key: str, record: dict, command: str = "python bench/capabilities.py",
               section: str = "runs") -> None:
    """Put one run's record into the JSON's `section` ("runs", or "sweep" for the learning-rate sweep's):
    read, add, write, under a lock (runners may work side by side)."""
    with locked(out.stem):
        results = load(out)
        results.setdefault(section, {})[key] = record
        results.update({"command": command, "machine": machine()})
        write_text_atomic(out, json.dumps(results, indent=2))


def seconds_per_step(task: str, model: str, steps: int = 4) -> float:
    """The median wall time of one training step of a run, over `steps` steps after a first one (warm-up)."""
    import lightning as L

    data, module, *_ = prepare(task, model, 0, False)
    ends = []

    class Clock(L.Callback):
        def on_train_batch_end(self, *args):
            ends.append(time.perf_counter())

    quiet_trainer(steps + 1, [Clock()]).fit(module, data)
    return statistics.median(b - a for a, b in zip(ends, ends[1:]))


def estimate(cells: list[tuple[str, str]]) -> list[dict]:
    """Seconds per step and minutes per run of each (task, model), measured here, and the ratio to softmax
    attention's (gpt-tiny, timed in the same run) on the same task: what a run would cost before it is run."""
    rows = []
    for task in dict.fromkeys(t for t, _ in cells):
        baseline = seconds_per_step(task, "gpt-tiny")
        for m in ["gpt-tiny", *(m for t, m in cells if t == task and m != "gpt-tiny")]:
            step = baseline if m == "gpt-tiny" else seconds_per_step(task, m)
            rows.append({"task": task, "model": m, "s per step": round(step, 3),
                         "min per run": round(step * BUDGET["steps"] / 60, 1), "x gpt-tiny": round(step / baseline, 2)})
    return rows


def keep_estimates(rows: list[dict]) -> None:
    """Put these rows into bench/results/capabilities_estimate.json in place of earlier ones of the same task
    and model, keeping the rest: each row's ratio was taken against gpt-tiny in its own run, so rows from
    different runs stand side by side."""
    path = common.RESULTS / "capabilities_estimate.json"
    fresh = {(r["task"], r["model"]) for r in rows}
    with locked("capabilities_estimate"):
        earlier = json.loads(path.read_text())["rows"] if path.is_file() else []
        write_json("capabilities_estimate",
                   {"rows": [r for r in earlier if (r["task"], r["model"]) not in fresh] + rows})


def sweep_key(task: str, model: str, lr: float, seed: int = 0) -> str:
    return f"{task}/{model}/{seed}@{lr:g}"


def sweep_point(results: dict, task: str, model: str, lr: float, seed: int = 0) -> dict | None:
    return results.get("sweep", {}).get(sweep_key(task, model, lr, seed))


def _rank(points: list[dict]) -> tuple:
    """How good one rate is, from its points (one per sweep seed): the mean validation accuracy, ties going to
    the lower mean validation loss, then to the smaller rate. A run that diverged (NaN or inf) loses every tie."""
    losses = [p["validation"]["val/loss"] for p in points]
    loss = statistics.mean(losses) if all(map(math.isfinite, losses)) else math.inf
    return statistics.mean(p["validation"]["val/accuracy"] for p in points), -loss, -points[0]["lr"]


def _points(results: dict, task: str, model: str, rates: list[float], seeds: int) -> list[list[dict]] | None:
    """Each rate's points on seeds 0 to seeds - 1; None while one is missing."""
    points = [[sweep_point(results, task, model, lr, s) for s in range(seeds)] for lr in rates]
    return None if any(None in at_rate for at_rate in points) else points


def sweep_rates(results: dict, task: str, model: str, seeds: int = 1) -> list[float]:
    """The rates a cell's sweep trains its seeds at: SWEEP_LRS, then each of SWEEP_CLIMB in turn while the
    largest rate run so far is the best. Ends at the first rate not yet run on every seed (the one the sweep
    runs next)."""
    rates, climb = list(SWEEP_LRS), iter(SWEEP_CLIMB)
    while True:
        points = _points(results, task, model, rates, seeds)
        if points is None or max(points, key=_rank) is not points[-1] or (higher := next(climb, None)) is None:
            return rates
        rates.append(higher)


def chosen_lr(results: dict, task: str, model: str, seeds: int = 1) -> float | None:
    """A swept cell's learning rate: the rate of sweep_rates whose points on `seeds` seeds score best on
    validation (_rank); None until all have run."""
    points = _points(results, task, model, sweep_rates(results, task, model, seeds), seeds)
    return None if points is None else max(points, key=_rank)[0]["lr"]


def sweep_scores(results: dict, task: str, model: str, seeds: int = 1) -> dict[str, float]:
    """Validation accuracy at each rate the cell's sweep ran, the mean over its seeds, as its records list it."""
    return {f"{lr:g}": statistics.mean(sweep_point(results, task, model, lr, s)["validation"]["val/accuracy"]
                                       for s in range(seeds))
            for lr in sweep_rates(results, task, model, seeds)}


def sweep_marks(results: dict, task: str, model: str, seeds: int) -> dict:
    """What a sweep on `seeds` seeds writes into each of its records beside the run: the scores it chose on, and
    the seed count where it is not 1 (so one-seed records stay as they were)."""
    return {"sweep": sweep_scores(results, task, model, seeds)} | ({"sweep_seeds": seeds} if seeds > 1 else {})


def marks_in(record: dict) -> dict:
    """The sweep's marks (sweep_marks) a record carries; empty for a run no sweep chose."""
    return {key: record[key] for key in SWEEP_MARKS if key in record}


def sweep_seeds(results: dict, task: str, model: str) -> int:
    """How many seeds the cell's sweep scored each rate on (--sweep-seeds), as its seed 0's record says."""
    return results["runs"].get(f"{task}/{model}/0", {}).get("sweep_seeds", 1)


def wanted_lr(results: dict, task: str, model: str, default: float) -> float:
    """The rate a cell's runs train at: its sweep's choice, else the budget's (`default`)."""
    chosen = chosen_lr(results, task, model, sweep_seeds(results, task, model))
    return default if chosen is None else chosen


def stale_points(results: dict, task: str, model: str) -> list[str]:
    """The cell's sweep points measured on another validation set than today's: before VAL_SEED moved, the
    synthetic tasks' validation sequences were the first of their test sequences, so those points chose on test
    data, and no point on today's validation set compares with them."""
    return [key for key, record in results.get("sweep", {}).items()
            if key.rsplit("/", 1)[0] == f"{task}/{model}" and record.get("validation_seed") != VAL_SEED]


def sweep(out: Path, task: str, model: str, tiny: bool, seeds: int = 1, accelerator: str = "cpu") -> None:
    """Train seeds 0 to seeds - 1 at each rate of sweep_rates not yet run, then make each seed's run at the
    rate that scores best on validation over those seeds (the mean) that seed's record.
    Stale points (stale_points) move to the JSON's "sweep_stale" section first, and their rates run again."""
    with locked(out.stem):
        results = load(out)
        stale = stale_points(results, task, model)
        if stale:
            for key in stale:
                results.setdefault("sweep_stale", {})[key] = results["sweep"].pop(key)
            write_text_atomic(out, json.dumps(results, indent=2))
    while (chosen := chosen_lr(results := load(out), task, model, seeds)) is None:
        lr, seed = next((lr, s) for lr in sweep_rates(results, task, model, seeds) for s in range(seeds)
                        if sweep_point(results, task, model, lr, s) is None)
        print(f"{sweep_key(task, model, lr, seed)} ...", flush=True)
        record = run_one(task, model, seed, tiny, lr=lr, accelerator=accelerator)
        add_record(out, sweep_key(task, model, lr, seed), record, section="sweep")
    marks = sweep_marks(results, task, model, seeds)
    for s in range(seeds):
        add_record(out, f"{task}/{model}/{s}", {**results["sweep"][sweep_key(task, model, chosen, s)], **marks})


def text_references(task: str, orders=(1, 2, 3, 4)) -> dict:
    """Held-out loss of n-gram models counted on a text task's training split, over the characters its test
    windows score: what reading only the last n - 1 characters reaches, beside the models' loss."""
    from bench.long_context import ngram_loss

    data = build_data(task, TASKS[task], 1, 0, False)
    scored = data.val_tokens[: data.val_windows * data.context_length + 1]
    vocab = data.tokenizer.vocab_size
    return {f"{n}-gram": round(ngram_loss(data.train_tokens, scored, n, vocab), 4) for n in orders}


def _cell(values: list[float], scale: float, digits: int) -> str:
    """mean ± sample std (n - 1), or the one value."""
    if not values:
        return "-"
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean * scale:.{digits}f}"
    std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
    return f"{mean * scale:.{digits}f} ± {std * scale:.{digits}f}"


def _by_cell(results: dict, task: str) -> dict[str, list[dict]]:
    """The task's records grouped by model, each group in seed order."""
    cells = {}
    for record in sorted(results["runs"].values(), key=lambda r: r["seed"]):
        if record["task"] == task:
            cells.setdefault(record["model"], []).append(record)
    return cells


def _about(records: list[dict]) -> list[str]:
    """The seeds, learning rate (marked when swept; "on test" when chosen before VAL_SEED moved) and minutes per
    run of one cell.

    Minutes are averaged over runs of the same thread count only (records before --threads ran at one):
    a run at two threads beside none is not the same measure as one at one thread beside another.
    """
    rates = sorted({f"{r['lr']:g}" for r in records})
    chosen_by = [r for r in records if "sweep" in r]
    swept = ""
    if chosen_by:  # a choice made on the validation sequences that were test sequences says so (stale_points)
        seeds = chosen_by[0].get("sweep_seeds", 1)
        on_test = not all(r.get("validation_seed") == VAL_SEED for r in chosen_by)
        swept = f" (swept{f' on {seeds} seeds' if seeds > 1 else ''}{' on test' if on_test else ''})"
    by_threads: dict[int, list[float]] = {}
    for r in records:
        by_threads.setdefault(r.get("threads", 1), []).append(r["train_seconds"] / 60)
    minutes = "; ".join(f"{statistics.mean(m):.1f}" + (f" ({n} threads)" if n != 1 else "")
                        for n, m in sorted(by_threads.items()))
    seeds = ", ".join(str(r["seed"]) for r in records)
    if stale := [str(r["seed"]) for r in records if stale_test(r)]:  # to run again: said until it has
        seeds += f" (old test sets: {', '.join(stale)})"
    return [seeds, " / ".join(rates) + swept, minutes]


TEXT_BUCKETS = ("8-16", "64-128", "512-1024")  # positions early, middle and late in a 1,024-token window


# the grid's models at its other widths ("gpt-tiny:w128"): rows of the grid's table, not of MQAR's
GRID_VARIANTS = {f"{m}:w{w}" for m in GRID_MODELS for w in GRID_WIDTHS if w != SIZE["embed_dim"]}


def _task_order(task: str) -> tuple:
    """A table's order of tasks: TASKS' order, any other task after them by name."""
    return (list(TASKS).index(task) if task in TASKS else len(TASKS), task)


def _suite_order(model: str) -> tuple:
    """A table's row order: the suite's models in MODELS' order, each variant outside the suite
    ("gpt-tiny:alibi:bias_max2") after the suite model it varies, variants by their numbers (2, 2-8, 2-16, 4)."""
    base = max((m for m in MODELS if model == m or model.startswith(m + ":")), key=len, default=None)
    numbers = [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", model)]  # the base sorts first
    return (MODELS.index(base) if base else len(MODELS), numbers)


# A suite model is the registered name's family at the suite's size (SIZE: width 64, 2 blocks, 2 heads; a hybrid
# one linear block then one softmax block), not the registered architecture: the tables say so in their header,
# and name a row measured on the registered architecture itself ("name:shipped") as such.
MODEL_HEAD = "model, at the suite's size"


def _model_head(models) -> str:
    """The model column's heading: a table of registered architectures only ("name:shipped") is not at the
    suite's size, and says so."""
    models = list(models)
    if models and all(m.endswith(":calibrated") for m in models):
        return "model, as registered but initialized as the suite's"
    return "model, as registered" if models and all(m.endswith(":shipped") for m in models) else MODEL_HEAD


def _named(model: str) -> str:
    name, _, variant = model.partition(":")
    return f"`{name}` as registered" if variant == "shipped" else f"`{model}`"


def markdown(results: dict, first: dict | None = None) -> dict[str, str]:
    """The README's tables by name, every figure from the JSON: one per task (test accuracy in %, loss in nats
    per character for text, as mean ± sample std over the seeds run; the seeds, the learning rate and minutes per
    run), "grid" for Zoology's grid, "sweep" for what the sweeps chose from (sweep_table), and "repeats" for how
    its seed-0 sweep points repeat those of `first`, the equal-budget file (repeat_table). Models in the suite's
    order, variants after theirs (_suite_order); "-": not tested (learned positions)."""
    tables = {}
    for task, (data_name, _) in TASKS.items():
        cells = _by_cell(results, task)
        models = sorted((m for m in cells if m not in GRID_VARIANTS), key=_suite_order)
        if task in GRID_TASKS[1:] or not models:
            continue
        text = data_name == "LongContextText"
        if text:
            heads = ["loss", *(f"{lo}-{int(hi) - 1}" for lo, hi in (b.split("-") for b in TEXT_BUCKETS))]
        else:
            lengths_run = sorted({int(k.split("@")[1]) for m in models for r in cells[m] for k in r["metrics"]
                                  if k.startswith("test/accuracy@")})
            heads = [f"@{n}" for n in lengths_run] if len(lengths_run) > 1 else ["accuracy"]
        lines = [f"| {_model_head(models)} | {' | '.join(heads)} | seeds | lr | min per run |",
                 "|---" * (len(heads) + 4) + "|"]
        for m in models:
            records = cells[m]
            if text:
                values = [[r["metrics"]["test/loss"] for r in records]]
                values += [[r["loss_by_position"][b] for r in records if b in r["loss_by_position"]]
                           for b in TEXT_BUCKETS]  # a window shorter than a bucket leaves it "-"
                shown = [_cell(v, 1.0, 3 if i == 0 else 2) for i, v in enumerate(values)]
            else:
                shown = [_cell([r["metrics"][f"test/accuracy@{n}"] for r in records
                                if f"test/accuracy@{n}" in r["metrics"]], 100.0, 1) for n in lengths_run]
            lines.append(f"| {_named(m)} | {' | '.join(shown)} | {' | '.join(_about(records))} |")
        tables[task] = "\n".join(lines)
    grid = {t: _by_cell(results, t) for t in GRID_TASKS}
    rows = [(m, w) for m in GRID_MODELS for w in GRID_WIDTHS
            if any(_grid_name(m, w) in grid[t] for t in GRID_TASKS[1:])]
    if rows:
        first_length = TASKS[GRID_TASKS[0]][1]["sequence_length"]  # named only where a column's differs
        heads = [f"{a['num_pairs']} pairs" + (f" at {a['sequence_length']}" if a["sequence_length"] != first_length
                                              else "") for a in (TASKS[t][1] for t in GRID_TASKS)]
        lines = [f"| {MODEL_HEAD} | width | {' | '.join(heads)} | seeds | lr | min per run |",
                 "|---" * (len(heads) + 5) + "|"]
        for m, w in rows:
            records = [grid[t].get(_grid_name(m, w), []) for t in GRID_TASKS]
            shown = [_cell([r["metrics"]["test/accuracy"] for r in rs], 100.0, 1) for rs in records]
            seeds, rates, minutes = (" / ".join(_about(rs)[i] if rs else "-" for rs in records) for i in range(3))
            lines.append(f"| {_named(m)} | {w} | {' | '.join(shown)} | {seeds} | {rates} | {minutes} |")
        tables["grid"] = "\n".join(lines)
    if summary := summary_table(results):
        tables["summary"] = summary
    if swept := sweep_table(results):
        tables["sweep"] = swept
    if first is not None and (repeated := repeat_table(results, first)):
        tables["repeats"] = repeated
    return tables


# The summary's columns: (task, test length or None for the task's one figure, heading)
SUMMARY = (("mqar", 64, "MQAR"), ("mqar", 1024, "MQAR at 16x"), ("induction_heads", 64, "induction"),
           ("induction_heads", 512, "induction at 8x"), ("selective_copying", 128, "copying"),
           ("selective_copying", 256, "copying at 2x"), ("listops", None, "ListOps"),
           ("pixel_mnist", None, "pixel MNIST"), ("stdlib", None, "stdlib, nats/char"))


def summary_table(results: dict) -> str | None:
    """One row per model of the suite, one column per task (SUMMARY): the mean over its seeds of test accuracy in %
    (loss for text), so that a page can open with every task at once; None unless the file holds every task."""
    cells = {task: _by_cell(results, task) for task, _, _ in SUMMARY}
    if not all(cells.values()):
        return None
    models = sorted({m for m in cells["mqar"] if m not in GRID_VARIANTS}, key=_suite_order)
    lines = [f"| {MODEL_HEAD} | {' | '.join(head for _, _, head in SUMMARY)} |", "|---" * (len(SUMMARY) + 1) + "|"]
    for m in models:
        shown = []
        for task, n, _ in SUMMARY:
            records = cells[task].get(m, [])
            if TASKS[task][0] == "LongContextText":
                values = [r["metrics"]["test/loss"] for r in records]
                shown.append(f"{statistics.fmean(values):.3f}" if values else "-")
                continue
            key = "test/accuracy" if n is None else f"test/accuracy@{n}"
            values = [r["metrics"][key] for r in records if key in r["metrics"]]
            shown.append(f"{100 * statistics.fmean(values):.1f}" if values else "-")
        lines.append(f"| {_named(m)} | {' | '.join(shown)} |")
    return "\n".join(lines)


def sweep_table(results: dict) -> str | None:
    """What the sweeps chose from: each swept cell's validation accuracy in % at every rate it ran (the mean
    over the seeds it scored on, as its records carry it), the chosen rate in bold; None when nothing was swept.
    Tasks not in TASKS are left out, as from the task tables."""
    chosen = sorted((r for r in results["runs"].values() if r["seed"] == 0 and "sweep" in r and r["task"] in TASKS),
                    key=lambda r: (_task_order(r["task"]), _suite_order(r["model"])))
    if not chosen:
        return None
    rates = sorted({float(lr) for r in chosen for lr in r["sweep"]})
    lines = [f"| task | {_model_head(r['model'] for r in chosen)} | {' | '.join(f'{lr:g}' for lr in rates)} | seeds |",
             "|---" * (len(rates) + 3) + "|"]
    for r in chosen:
        scores = {float(lr): f"{100 * v:.1f}" for lr, v in r["sweep"].items()}
        shown = [f"**{scores[lr]}**" if lr == r["lr"] and lr in scores else scores.get(lr, "-") for lr in rates]
        seeds = ", ".join(map(str, range(r.get("sweep_seeds", 1))))
        lines.append(f"| {r['task']} | {_named(r['model'])} | {' | '.join(shown)} | {seeds} |")
    return "\n".join(lines)


# every results file of the suite and its off-budget and variant runs, as the README reports them (compute_table)
COMPUTE_FILES = ("capabilities", "capabilities_sweep_seeds", "capabilities_alibi_slopes",
                 "capabilities_alibi_slopes_swept", "capabilities_4000_steps", "capabilities_8000_steps")


def compute_table(files: dict[str, dict]) -> str:
    """The training time each results file holds, in hours at the runs' own thread counts: its runs, its sweep
    points, and what running it all again from nothing would take. A run that a sweep chose (seed 0, or seeds 0
    to K-1 with --sweep-seeds K) is one of the sweep's points when run again, so it counts once. The suite's file
    (the first) by task, then one row a file, then the total; training time only (no testing or building)."""
    def hours(records) -> float:
        return sum(r["train_seconds"] for r in records) / 3600

    def swept_point(record: dict) -> bool:  # run again, it is its sweep's point at the rate chosen
        return "sweep" in record and record["seed"] < record.get("sweep_seeds", 1)

    rows = []
    for stem, results in files.items():
        runs, points = list(results["runs"].values()), list(results.get("sweep", {}).values())
        try:  # a record edited by hand or another tool's: which file, not a traceback
            groups = [(t, [r for r in runs if r["task"] == t], [p for p in points if p["task"] == t])
                      for t in sorted({r["task"] for r in runs + points}, key=_task_order)] if stem == OUT.stem else []
            groups.append(("all", runs, points))
            for task, rs, ps in groups:
                again = hours(ps) + hours(r for r in rs if not swept_point(r))
                rows.append((f"`{stem}.json`", task, len(rs), hours(rs), len(ps), hours(ps), again))
        except (KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"{RESULTS / stem}.json holds a record this bench did not write, without its task, seed "
                             f"or train_seconds ({type(error).__name__}: {error})") from None
    totals = [sum(row[i] for row in rows if row[1] == "all") for i in range(2, 7)]
    rows.append(("all files", "all", *totals))
    lines = ["| results | task | runs | their hours | sweep points | their hours | hours to run it all again |",
             "|---|---|---|---|---|---|---|"]
    for name, task, n_runs, run_h, n_points, point_h, again in rows:
        bold = "**" if task == "all" else ""
        lines.append(f"| {name} | {bold}{task}{bold} | {n_runs} | {run_h:.1f} | {n_points} | {point_h:.1f} | "
                     f"{bold}{again:.1f}{bold} |")
    return "\n".join(lines)


def compute_files() -> dict[str, dict]:
    """COMPUTE_FILES' results, the suite's first, each that exists in RESULTS."""
    return {stem: load(RESULTS / f"{stem}.json") for stem in COMPUTE_FILES if (RESULTS / f"{stem}.json").exists()}


def _measured_on(record: dict, length: int) -> int:
    """The seed of the first sequence of the test set a record was tested on at `length` (stale_test)."""
    return (record.get("test_seeds") or {}).get(str(length), _seed_before_test_seeds(length))


def repeats(again: dict, first: dict) -> bool:
    """Whether a seeded run trained again repeats the first to the digit: validation, and test accuracy and loss
    at the training length (a first run may have been tested on older sets beyond it)."""
    return again["validation"] == first["validation"] and all(
        again["metrics"][m] == first["metrics"][m] for m in ("test/accuracy", "test/loss"))


def _decimal(value: float, scale: float, digits: int) -> str:
    """value * scale to `digits` decimals, halves up: the JSON keeps exact decimals (validation accuracy 797/800 is
    0.99625), which binary floats would round up or down as their last bit falls (99.625 prints as 99.62). A
    diverged run's inf or NaN is shown as itself."""
    if not math.isfinite(value):
        return str(value)
    return str((Decimal(repr(value)) * Decimal(repr(scale))).quantize(Decimal(1).scaleb(-digits), ROUND_HALF_UP))


def _difference(again: dict, first: dict) -> str:
    """The first figure in which two runs of one seed part, as "this run / the first": validation accuracy in %,
    else its loss in nats (after the accuracy both share), else test accuracy and loss at the training length."""
    figures = [("%", 100.0, 2, "val/accuracy", "validation"), (" nats", 1.0, 5, "val/loss", "validation"),
               ("% on test", 100.0, 2, "test/accuracy", "metrics"), (" nats on test", 1.0, 5, "test/loss", "metrics")]
    shown = [(unit, *(_decimal(run[section][name], scale, digits) for run in (again, first)))
             for unit, scale, digits, name, section in figures]
    unit, a, b = next((figure for figure in shown if figure[1] != figure[2]), shown[-1])
    shared = "" if unit == "%" else f"{_decimal(again['validation']['val/accuracy'], 100, 2)}% both, "
    return f"{shared}{a} / {b}{unit}"


def repeat_table(results: dict, first: dict) -> str | None:
    """How each swept cell's seed-0 points repeat the sweep points of the same cell, rate and seed in `first`
    (the file whose sweeps ran seed 0 alone): per cell, the CPU kind against the first run's (a rerun repeats to
    the digit only on the same kernels: bench/cpu_kinds.py), the rates that repeat (repeats), marked with the
    longer lengths where their test accuracy still differs, and those that do not with the figure that parts
    first (_difference). None when no point has one in `first` to repeat."""
    cells: dict[tuple[str, str], list[tuple[dict, dict]]] = {}
    for key, point in results.get("sweep", {}).items():
        if key.split("@")[0].endswith("/0") and key in first.get("sweep", {}) and point["task"] in TASKS:
            cells.setdefault((point["task"], point["model"]), []).append((point, first["sweep"][key]))
    if not cells:
        return None
    lines = [f"| task | {MODEL_HEAD} | CPU | rates that repeat to the digit | rates that part: this run / the "
             "suite's |", "|---|---|---|---|---|"]
    for task, model in sorted(cells, key=lambda c: (_task_order(c[0]), _suite_order(c[1]))):
        pairs = sorted(cells[task, model], key=lambda pair: pair[0]["lr"])
        kinds = {again.get("cpu_flags") == before.get("cpu_flags") for again, before in pairs}
        cpu = "same kind" if kinds == {True} else "another kind" if kinds == {False} else "both kinds"
        repeated, parted = [], []
        for again, before in pairs:
            if not repeats(again, before):
                parted.append(f"{again['lr']:g} ({_difference(again, before)})")
                continue
            training = again["data"]["init_args"]["sequence_length"]
            longer = sorted(int(k.split("@")[1]) for k in again["metrics"]
                            if k.startswith("test/accuracy@") and k in before["metrics"])
            moved = [f"{_decimal(again['metrics'][f'test/accuracy@{n}'], 100, 2)} / "
                     f"{_decimal(before['metrics'][f'test/accuracy@{n}'], 100, 2)} at {n}" for n in longer
                     if n != training and _measured_on(again, n) == _measured_on(before, n)  # the same sequences
                     and again["metrics"][f"test/accuracy@{n}"] != before["metrics"][f"test/accuracy@{n}"]]
            repeated.append(f"{again['lr']:g}" + (f" (not beyond: {', '.join(moved)})" if moved else ""))
        lines.append(f"| {task} | {_named(model)} | {cpu} | {', '.join(repeated) or '-'} | "
                     f"{', '.join(parted) or '-'} |")
    return "\n".join(lines)


def fill_readme(text: str, tables: dict[str, str], source: str = OUT.stem) -> str:
    """`text` with each table put between its markers, <!-- SOURCE:NAME --> and <!-- /capabilities -->.

    SOURCE is the stem of the JSON the tables come from, so that the tables of another file (--out
    bench/results/capabilities_alibi_slopes.json, or --tiny's) go where the README put them, or nowhere, and
    never over the suite's own."""
    for name, table in tables.items():
        start = f"<!-- {source}:{name} -->"
        head, found, rest = text.partition(start)
        if not found:
            raise ValueError(f"has no {start} marker for the {name} table: add one, and the closing "
                             "<!-- /capabilities --> after it, where the table goes")
        _, closed, tail = rest.partition("<!-- /capabilities -->")
        if not closed:  # else everything after the marker would go with the old table
            raise ValueError(f"has {start} but no <!-- /capabilities --> after it, where the {name} table ends")
        text = f"{head}{start}\n{table}\n<!-- /capabilities -->{tail}"
    return text


def fill_pages(pages: dict[Path, str], tables: dict[str, str], source: str = OUT.stem) -> dict[Path, str]:
    """Each page's text with the tables whose markers it holds put in (fill_readme on each): the tables of one
    JSON live on several docs pages, one per task. A table whose marker no page holds is named, with the pages."""
    filled = dict(pages)
    for name, table in tables.items():
        start = f"<!-- {source}:{name} -->"
        holders = [page for page, text in filled.items() if start in text]
        if not holders:
            where = f"{next(iter(pages))} has no" if len(pages) == 1 else f"none of {', '.join(map(str, pages))} has a"
            raise ValueError(f"{where} {start} marker for the {name} table: add one, and the closing "
                             "<!-- /capabilities --> after it, where the table goes")
        for page in holders:
            try:
                filled[page] = fill_readme(filled[page], {name: table}, source)
            except ValueError as error:
                raise ValueError(f"{page} {error}") from None
    return filled


def _grid_name(model: str, width: int) -> str:
    return model + ("" if width == SIZE["embed_dim"] else f":w{width}")


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


def show_tables(parser, args, results: dict, first: dict | None, out: Path) -> None:
    """--markdown prints the README's tables from `results`; --readme puts them between its markers."""
    try:  # a record edited by hand or written by another tool: which file, not a traceback from the tables
        tables = markdown(results, first)
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        parser.error(f"{out} holds a record this bench did not write ({type(error).__name__}: {error}); "
                     "give --out a file it wrote")
    if out.resolve() == OUT.resolve():  # the suite's tables close with what every results file's training took
        try:
            tables["compute"] = compute_table(compute_files())
        except ValueError as error:
            parser.error(str(error))
    if not args.pages:
        print("\n\n".join(f"{name}:\n\n{table}" for name, table in tables.items()))
        return
    try:  # read, fill, write in turn with any other --pages: neither loses the other's tables
        with locked("readme"):
            pages = {page: page.read_text() for page in args.pages}
            for page, text in fill_pages(pages, tables, out.stem).items():
                if text != pages[page]:
                    write_text_atomic(page, text)
    except OSError as error:
        parser.error(str(error))
    except ValueError as error:  # which page, and which marker it lacks
        parser.error(str(error))


def selected_runs(parser, args, out: Path, equal_budget_out: Path) -> list[tuple[str, str, int]]:
    """The (task, model, seed) runs the arguments select, each argument checked first (a parser error names what
    is wrong before anything runs)."""
    if args.sweep_seeds != 1 and not args.sweep:
        parser.error(f"--sweep-seeds {args.sweep_seeds} says how many seeds --sweep scores each rate on: add --sweep")
    if args.sweep_seeds < 1:
        parser.error(f"--sweep-seeds takes a count of seeds from 1, not {args.sweep_seeds}")
    if args.sweep and args.seeds not in (None, [0]):
        parser.error(f"--sweep runs seed 0 only, got --seeds {' '.join(map(str, args.seeds))}: later seeds train "
                     "at the rate it chose, run them without --sweep (or sweep on more seeds: --sweep-seeds)")
    seeds = [0] if args.sweep else args.seeds if args.seeds is not None else ([0] if args.tiny else list(SEEDS))
    if args.grid and (args.models or args.tiny):
        parser.error("--grid runs its own models and sizes: narrow it with --only, e.g. --only 'mqar_p8/*'")
    if args.mini and (args.models or args.tiny or args.grid):
        parser.error("--mini runs its own models and sizes: narrow it with --only, e.g. --only 'mqar256_p64/*'")
    for m in args.models or ():  # a model zoo cannot build is refused before anything runs
        if why := unbuildable(m, args.tiny):
            parser.error(f"--models {m}: {why}")
        if m not in MODELS and out.resolve() == equal_budget_out.resolve():
            parser.error(f"--models {m} is not one of the suite's (MODELS): its runs need a file of their own, "
                         f"e.g. --out {RESULTS / 'capabilities_variants.json'}")
    if args.grid:
        models = [_grid_name(m, w) for m in GRID_MODELS for w in GRID_WIDTHS]
        tasks = GRID_TASKS
    elif args.mini:
        models, tasks = [f"{m}:calibrated" for m in MINI_MODELS], MINI_TASKS
    else:  # the grid's and the mini study's tasks only with --grid and --mini
        models = args.models or list(MODELS)
        tasks = [t for t in (TINY_TASKS if args.tiny else TASKS) if t not in (*GRID_TASKS[1:], *MINI_TASKS)]
    runs = [(t, m, s) for s in seeds for t in tasks for m in models if fnmatch.fnmatch(f"{t}/{m}/{s}", args.only)]
    if not runs and not args.table:
        parser.error(f"--only {args.only!r} matches no run of these tasks, models and seeds (keys are "
                     "task/model/seed, e.g. 'mqar/gpt-tiny/0'; --list shows them)")
    specs = TINY_TASKS if args.tiny else TASKS
    if args.sweep:
        unswept = sorted({t for t, _, _ in runs if specs[t][0] not in VALIDATED})
        runs = [(t, m, s) for t, m, s in runs if specs[t][0] in VALIDATED]
        if not runs:
            parser.error(f"--sweep chooses on a validation split, which {', '.join(unswept)} do not have (their "
                         "held-out text is their test text)")
        if unswept:
            print(f"not swept (no validation split): {', '.join(unswept)}")

    return runs


def status(args, results: dict, rates: dict | None, steps: int, default_lr: float, t: str, m: str, s: int) -> str:
    """Run t/m/s's state in `results`: done, to run, or to run again (a record at other steps, or at another rate
    than the cell's sweep chose); with --sweep, whether the cell's sweep is done. `rates`: the file whose sweeps
    chose the rates (the equal-budget file, for runs off it), None: `results` itself."""
    record, lr = results["runs"].get(f"{t}/{m}/{s}"), wanted_lr(rates or results, t, m, default_lr)
    if args.sweep:
        if stale_points(results, t, m):
            return "to sweep again (its points chose on validation sequences that were test sequences)"
        if chosen_lr(results, t, m, args.sweep_seeds) is None:
            return "to sweep"
        marks = sweep_marks(results, t, m, args.sweep_seeds)
        records = [results["runs"].get(f"{t}/{m}/{seed}", {}) for seed in range(args.sweep_seeds)]
        done = all(marks_in(r) == marks for r in records)
        return "done" if done else "to sweep"
    if record is None:
        return "to run"
    if stale_test(record):
        return "to run again on today's test sets (those at multiples of 256 moved off seed 0's training data)"
    if record["steps"] != steps:
        return f"to run again for {steps} steps (this one ran {record['steps']})"
    # a sweep's seeds stand until a sweep redoes them, while theirs is the sweep the cell's seed 0 was part of
    its_seeds = record.get("sweep_seeds", 1)
    in_sweep = "sweep" in record and s < its_seeds and its_seeds == sweep_seeds(results, t, m)
    if record["lr"] == lr or in_sweep:
        return "done"
    return f"to run again at lr {lr:g} (its sweep's; this one ran at {record['lr']:g})"



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="*", help="a pattern on run keys task/model/seed, e.g. 'mqar/*/0'")
    parser.add_argument("--models", nargs="+", default=None, help="default: every model of the suite")
    parser.add_argument("--seeds", nargs="+", type=int, default=None)
    parser.add_argument("--grid", action="store_true",
                        help=f"Zoology's grid instead: {', '.join(GRID_TASKS)} x {', '.join(GRID_MODELS)} at widths "
                             f"{' and '.join(map(str, GRID_WIDTHS))}")
    parser.add_argument("--mini", action="store_true",
                        help=f"the mini study's MQAR instead: {', '.join(MINI_TASKS)} x "
                             f"{', '.join(MINI_MODELS)} (width 256, 6 blocks; the suite's initialization)")
    parser.add_argument("--tiny", action="store_true", help="tiny models and data, few steps (a smoke run)")
    parser.add_argument("--out", type=Path, default=None, help=f"the JSON (default {OUT}; with --tiny {TINY_OUT})")
    parser.add_argument("--references", metavar="TASK", choices=[t for t, (name, _) in TASKS.items()
                                                                  if name == "LongContextText"],
                        help="print n-gram references for a text task's test windows (warpeace, stdlib), run nothing")
    parser.add_argument("--sweep", action="store_true",
                        help=f"choose each cell's learning rate: seed 0 at {', '.join(f'{lr:g}' for lr in SWEEP_LRS)} "
                             f"(and on to {', '.join(f'{lr:g}' for lr in SWEEP_CLIMB)} while the largest is best), "
                             "the best on validation kept as seed 0's run (later seeds: run without --sweep)")
    parser.add_argument("--sweep-seeds", type=int, default=1, metavar="K",
                        help="with --sweep: train seeds 0 to K-1 at each rate, choose the rate whose mean validation "
                             "accuracy over them is best, and keep each seed's run at it (default 1: seed 0 alone)")
    parser.add_argument("--estimate", action="store_true",
                        help="time a few training steps of each selected run and print minutes per run, against "
                             "gpt-tiny's on the same task (bench/results/capabilities_estimate.json); trains nothing")
    parser.add_argument("--steps", type=int, default=None,
                        help="train this many optimizer steps instead of the budget's: runs off the equal budget, "
                             "so they need an --out of their own; each cell trains at the rate the equal-budget "
                             "file's sweep chose for it")
    parser.add_argument("--accelerator", choices=("cpu", "gpu"), default="cpu",
                        help="train and test on the CPU (default; the suite's records) or on one CUDA GPU, in "
                             "float32 with TF32 matmuls; GPU runs need a file of their own (--out), since they do "
                             "not repeat the CPU's to the digit, and each record names its device")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads per run (default 1, so two runs share two cores; each record keeps its count)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--markdown", action="store_true", help="print the README's tables from the JSON")
    parser.add_argument("--pages", "--readme", type=Path, nargs="+", metavar="PAGE",
                        help="put the tables into these pages (docs/capabilities/*.md), each between its "
                        "<!-- STEM:TASK --> and <!-- /capabilities --> markers, wherever a page holds them, STEM "
                        "the JSON's (--out) file name without .json: capabilities for the suite's")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 1 <= args.threads <= cores():
        parser.error(f"--threads takes a count from 1 to this process's {cores()} cores, not {args.threads}")
    if args.references:
        try:
            references = text_references(args.references)
        except FileNotFoundError as error:  # War and Peace outside ZOO_DATA
            parser.error(str(error))
        print(f"{args.references}: n-gram models on its test windows (nats per character)", references)
        return
    equal_budget_out = TINY_OUT if args.tiny else OUT
    out = args.out or equal_budget_out
    equal_budget = TINY_BUDGET if args.tiny else BUDGET
    budget_steps, default_lr = equal_budget["steps"], equal_budget["lr"]
    steps = budget_steps if args.steps is None else args.steps
    if steps < 1:
        parser.error(f"--steps takes a count of optimizer steps from 1, not {steps}")
    off_budget = steps != budget_steps
    if off_budget and out.resolve() == equal_budget_out.resolve():
        parser.error(f"--steps {steps} is off the equal budget's {budget_steps}: its runs need a file of their own, "
                     f"e.g. --out {RESULTS / f'capabilities_{steps}_steps.json'}")
    if args.accelerator == "gpu":
        if not torch.cuda.is_available():
            parser.error("--accelerator gpu needs a CUDA device, and torch sees none here: leave it out to run on "
                         "the CPU")
        if out.resolve() == equal_budget_out.resolve():
            parser.error(f"--accelerator gpu: GPU runs do not repeat the CPU's records to the digit, so they need a "
                         f"file of their own, e.g. --out {RESULTS / 'capabilities_gpu.json'}")
        if args.estimate:
            parser.error("--estimate times one CPU thread, as the runs it compares: leave out --accelerator gpu")
    if off_budget and (args.sweep or args.estimate):
        parser.error(f"--{'sweep' if args.sweep else 'estimate'} works at the equal budget's {budget_steps} steps: "
                     f"leave out --steps {steps}")
    try:  # once, before anything runs: a file that is not this bench's is refused, not overwritten
        results = load(out)
        rates = load(equal_budget_out) if off_budget else None  # where each cell's swept rate is
        # the tables set another file's seed-0 sweep points beside the equal-budget file's (repeat_table)
        tabled = args.markdown or args.pages
        first = load(equal_budget_out) if tabled and out.resolve() != equal_budget_out.resolve() else None
    except (OSError, ValueError) as error:
        parser.error(str(error))
    if (args.table or args.markdown or args.pages) and not results["runs"]:
        parser.error(common.nothing_to_show(out))
    if args.markdown or args.pages:
        show_tables(parser, args, results, first, out)
        return
    runs = selected_runs(parser, args, out, equal_budget_out)

    if args.estimate:
        if args.tiny:
            parser.error("--estimate times the real runs' steps: leave out --tiny")
        if args.threads != 1:
            parser.error(f"--estimate times one thread, as the runs it compares: leave out --threads {args.threads}")
        torch.set_num_threads(1)
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        rows = estimate(list(dict.fromkeys((t, m) for t, m, _ in runs)))
        print_table(f"capabilities: minutes per run of {BUDGET['steps']} steps, estimated from "
                    "the median of 4 steps, one thread", rows, list(rows[0]))
        keep_estimates(rows)
        return
    if args.list:
        for t, m, s in runs:
            print(f"{t}/{m}/{s}: {status(args, results, rates, steps, default_lr, t, m, s)}")
        return
    if not args.table:
        torch.set_num_threads(args.threads)
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        for t, m, s in runs:
            key = f"{t}/{m}/{s}"
            results = load(out)
            if status(args, results, rates, steps, default_lr, t, m, s) == "done":
                continue
            try:
                if args.sweep:
                    sweep(out, t, m, args.tiny, args.sweep_seeds, args.accelerator)
                    continue
                print(f"{key} ...", flush=True)
                record = run_one(t, m, s, args.tiny, lr=wanted_lr(rates or results, t, m, default_lr), steps=steps,
                                 accelerator=args.accelerator)
                earlier = results["runs"].get(key)
                if earlier and "sweep" in earlier and earlier["lr"] == record["lr"]:  # run again on moved test
                    # sets only: the sweep's choice stands
                    record.update(marks_in(earlier))
            except FileNotFoundError as error:  # a task's data outside ZOO_DATA (MNIST, War and Peace)
                parser.error(f"{key}: {error}")
            add_record(out, key, record)
    table(load(out))


if __name__ == "__main__":
    main()
