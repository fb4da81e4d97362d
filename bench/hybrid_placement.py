"""Where should a hybrid's one softmax block go? MQAR recall of a 4-block model with the softmax block at each
position, among micro or elita blocks, beside the pure models, at one budget (issue 25).

    python bench/hybrid_placement.py                   # micro: 4 placements + the 2 pure models, one seed
    python bench/hybrid_placement.py --linear elita    # the same among elita blocks
    python bench/hybrid_placement.py --table    # the table from bench/results/hybrid_placement.json

Every run trains width 64, 4 blocks, 2 heads, with bench/capabilities.py's calibrated recipe (an untied
output layer, unit-variance token embeddings, AdamW at 1e-3, 100 warm-up steps, cosine decay) on MQAR
with 4 pairs at length 64, then reports accuracy on the fixed test set. Each finished run is written to
bench/results/hybrid_placement.json at once; finished runs are skipped when the script starts again.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.capabilities import BUDGET, SIZE, TASKS, add_record, build_data, load  # noqa: E402
from bench.common import RESULTS, print_table  # noqa: E402

OUT = RESULTS / "hybrid_placement.json"
DEPTH = 4
STEPS = 1500


def mixes(linears: list[str]) -> dict[str, list[str]]:
    runs = {name: [name] * DEPTH for name in ("softmax", *linears)}
    for linear in linears:
        for index in range(DEPTH):
            runs[f"{linear}+softmax@{index}"] = [linear if i != index else "softmax" for i in range(DEPTH)]
    return runs


def run_one(attention: list[str], seed: int = 0) -> dict:
    import time

    import lightning as L

    from zoo.training.sequence import SequenceTask

    L.seed_everything(seed, verbose=False)
    _, spec = TASKS["mqar"]
    spec = {key: value for key, value in spec.items() if key != "test_lengths"}
    data = build_data("mqar", ("MQAR", spec), BUDGET["batch_size"], seed, tiny=False, full_lengths=False)
    # pos_embed none: micro and elita carry order; the pure softmax model gets learned positions, as gpt-tiny
    size = {**SIZE, "depth": DEPTH, "attention": attention,
            "pos_embed": "learned" if set(attention) == {"softmax"} else "none"}
    module = SequenceTask("gpt-tiny", size, data.data_info, lr=BUDGET["lr"], warmup_steps=BUDGET["warmup_steps"],
                          weight_decay=BUDGET["weight_decay"])
    trainer = L.Trainer(max_steps=STEPS, max_epochs=-1, limit_val_batches=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    start = time.perf_counter()
    trainer.fit(module, data)
    data.setup("test")
    return {"attention": attention, "seed": seed, "steps": STEPS, "size": size, "data": data.describe(),
            "train_seconds": round(time.perf_counter() - start, 1), "metrics": module.evaluate(data.test_dataloader())}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--only", default=None, help="one run's name, e.g. micro+softmax@2")
    parser.add_argument("--linear", nargs="+", default=["micro"], help="the linear-time mechanisms to mix (micro)")
    args = parser.parse_args(argv)
    if not args.table:
        torch.set_num_threads(1)
        for name, attention in mixes(args.linear).items():
            if (args.only and name != args.only) or name in load(OUT)["runs"]:
                continue
            print(f"{name} ...", flush=True)
            add_record(OUT, name, run_one(attention), "python bench/hybrid_placement.py")
    runs = load(OUT)["runs"]
    rows = [{"model": name, "blocks": " ".join(r["attention"]), "MQAR test acc": r["metrics"].get("test/accuracy"),
             "train s": r["train_seconds"]} for name, r in runs.items()]
    print_table(f"MQAR accuracy by the place of the softmax block ({DEPTH} blocks, {STEPS} steps, 1 thread)", rows,
                ["model", "blocks", "MQAR test acc", "train s"])


if __name__ == "__main__":
    main()
