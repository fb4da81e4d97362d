"""Where should a hybrid's one softmax block go? Accuracy of a model with the softmax block at each position,
among micro or elita blocks, beside the pure models, at one budget.

    python bench/hybrid_placement.py --depth 2 --steps 2000 --no-pure   # micro: the softmax block first or last
    python bench/hybrid_placement.py --no-pure                          # micro: 4 placements among 4 blocks
    python bench/hybrid_placement.py --linear elita                     # among elita blocks, with the pure models
    python bench/hybrid_placement.py --task induction_heads --conv 4 --depth 2 --steps 2000 \
        --linear micro elita elita:nosines elita:fading                 # why the ELiTA hybrid fails induction
    python bench/hybrid_placement.py --table    # the table from bench/results/hybrid_placement.json

Every run trains width 64 (4 blocks, or --depth), 2 heads, with bench/capabilities.py's calibrated recipe (an
untied output layer, unit-variance token embeddings, AdamW at 1e-3, 100 warm-up steps, cosine decay) on one of
its tasks (--task: MQAR with 4 pairs at length 64 by default), then reports accuracy on the task's fixed test
set at the training length. --conv W gives every block a short causal convolution of width W (TextTransformer's
short_conv); the models then have no position embedding, the pure softmax one included (the convolutions carry
order). A linear name may carry ELiTA's options: "elita:nosines" (pos_dim 0) or "elita:fading" (ALiBi's fading
history instead of the sines). A run's name says what it trained: the task (none for MQAR), the depth, the blocks,
the convolution and the steps, e.g. induction_heads/d2/elita+softmax@1+conv4/2000steps. Each finished run is
written to bench/results/hybrid_placement.json at once; finished runs are skipped when the script starts again.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.capabilities import BUDGET, FADING, SIZE, TASKS, add_record, build_data, load  # noqa: E402
from bench.common import RESULTS, print_table  # noqa: E402
from zoo.models.short_conv import MAX_WIDTH  # noqa: E402

OUT = RESULTS / "hybrid_placement.json"
STEPS = 3000  # optimizer steps per run unless --steps says otherwise
# ELiTA's variants by name: its options for the linear blocks (attention_options)
VARIANTS = {"elita:nosines": {"pos_dim": 0}, "elita:fading": FADING["elita"]}


def mixes(linears: list[str], depth: int, pure: bool, task: str = "mqar", conv: int = 0,
          steps: int = STEPS) -> dict[str, list[str]]:
    """Run name -> the blocks' attentions (names as given, variants included): d4/micro+softmax@3/3000steps on
    MQAR without convolutions; other tasks add themselves before, a convolution after the blocks. The steps are
    in the name so that a longer run is a run of its own, never skipped as the shorter one already recorded."""
    prefix = "" if task == "mqar" else f"{task}/"
    suffix = (f"+conv{conv}" if conv else "") + f"/{steps}steps"
    runs = {f"{prefix}d{depth}/{name}{suffix}": [name] * depth for name in ("softmax", *linears)} if pure else {}
    for linear in linears:
        for index in range(depth if depth > 1 else 0):  # one block has no place to choose: it is the pure softmax
            runs[f"{prefix}d{depth}/{linear}+softmax@{index}{suffix}"] = [
                linear if i != index else "softmax" for i in range(depth)]
    return runs


def model_size(blocks: list[str], conv: int = 0) -> dict:
    """The TextTransformer arguments for these blocks: the suite's size, each block's attention and options."""
    attention = [name.partition(":")[0] for name in blocks]
    size = {**SIZE, "depth": len(blocks), "attention": attention}
    if any(name in VARIANTS for name in blocks):
        size["attention_options"] = [dict(VARIANTS.get(name, {})) for name in blocks]
    # pos_embed none: micro, elita and the convolutions carry order; the pure softmax model without
    # convolutions gets learned positions, as gpt-tiny
    size["pos_embed"] = "learned" if set(attention) == {"softmax"} and not conv else "none"
    if conv:
        size["short_conv"] = conv
    return size


def run_one(blocks: list[str], steps: int, seed: int = 0, task: str = "mqar", conv: int = 0) -> dict:
    import time

    import lightning as L

    from zoo.training.sequence import SequenceTask

    L.seed_everything(seed, verbose=False)
    data = build_data(task, TASKS[task], BUDGET["batch_size"], seed, tiny=False, full_lengths=False)
    size = model_size(blocks, conv)
    module = SequenceTask("gpt-tiny", size, data.data_info, lr=BUDGET["lr"], warmup_steps=BUDGET["warmup_steps"],
                          weight_decay=BUDGET["weight_decay"])
    trainer = L.Trainer(max_steps=steps, max_epochs=-1, limit_val_batches=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    start = time.perf_counter()
    trainer.fit(module, data)
    data.setup("test")
    return {"attention": blocks, "task": task, "seed": seed, "steps": steps, "size": size, "data": data.describe(),
            "train_seconds": round(time.perf_counter() - start, 1), "metrics": module.evaluate(data.test_dataloader())}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--only", default=None, help="one run's name, e.g. d4/micro+softmax@2/3000steps")
    parser.add_argument("--linear", nargs="+", default=["micro"],
                        help=f"the linear-time mechanisms to mix: micro, elita or {', '.join(VARIANTS)} (micro)")
    parser.add_argument("--depth", type=int, default=4, help="blocks (default 4, the registered hybrids')")
    parser.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps per run (default {STEPS})")
    parser.add_argument("--task", default="mqar", choices=["mqar", "induction_heads", "selective_copying"],
                        help="the capability task to train and test on (default mqar)")
    parser.add_argument("--conv", type=int, default=0, help="a short convolution this wide in every block (0: none)")
    parser.add_argument("--no-pure", action="store_true", help="skip the pure models (the capability suite has them)")
    args = parser.parse_args(argv)
    unknown = [name for name in args.linear if name not in ("micro", "elita", *VARIANTS)]
    if unknown:
        parser.error(f"--linear takes micro, elita or {', '.join(VARIANTS)}, got {unknown[0]!r}")
    if args.conv != 0 and not 2 <= args.conv <= MAX_WIDTH:
        parser.error(f"--conv takes 0 (none) or a width from 2 to {MAX_WIDTH}, got {args.conv}")
    for flag, value in (("--depth", args.depth), ("--steps", args.steps)):
        if value < 1:
            parser.error(f"{flag} takes an int >= 1, got {value}")
    runs = mixes(args.linear, args.depth, not args.no_pure, args.task, args.conv, args.steps)
    if not runs:
        parser.error("--depth 1 --no-pure leaves nothing to run: one block has no place for the softmax block, "
                     "and the pure models are skipped; drop --no-pure")
    if args.only and args.only not in runs:
        parser.error(f"--only {args.only!r} names no run of these arguments; they are: {', '.join(runs)}")
    if not args.table:
        torch.set_num_threads(1)
        for name, blocks in runs.items():
            if (args.only and name != args.only) or name in load(OUT)["runs"]:
                continue
            print(f"{name} ...", flush=True)
            add_record(OUT, name, run_one(blocks, args.steps, task=args.task, conv=args.conv),
                       "python bench/hybrid_placement.py")
    runs = load(OUT)["runs"]
    rows = [{"model": name, "task": r.get("task", "mqar"), "blocks": " ".join(r["attention"]),
             "conv": r["size"].get("short_conv", 0), "steps": r["steps"],
             "test acc": r["metrics"].get("test/accuracy"), "train s": r["train_seconds"]}
            for name, r in sorted(runs.items())]
    print_table("accuracy by the place of the softmax block (1 thread)", rows,
                ["model", "task", "blocks", "conv", "steps", "test acc", "train s"])


if __name__ == "__main__":
    main()
