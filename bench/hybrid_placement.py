"""Where should a hybrid's one softmax block go? MQAR recall of a 4-block model with the softmax block at each
position, among micro or elita blocks, beside the pure models, at one budget (issue 25).

    python bench/hybrid_placement.py --depth 2 --steps 2000 --no-pure   # micro: the softmax block first or last
    python bench/hybrid_placement.py --no-pure                          # micro: 4 placements among 4 blocks
    python bench/hybrid_placement.py --linear elita                     # among elita blocks, with the pure models
    python bench/hybrid_placement.py --table    # the table from bench/results/hybrid_placement.json

Every run trains width 64 (4 blocks, or --depth), 2 heads, with bench/capabilities.py's calibrated recipe (an untied
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
def mixes(linears: list[str], depth: int, pure: bool) -> dict[str, list[str]]:
    runs = {f"d{depth}/{name}": [name] * depth for name in ("softmax", *linears)} if pure else {}
    for linear in linears:
        for index in range(depth):
            runs[f"d{depth}/{linear}+softmax@{index}"] = [linear if i != index else "softmax" for i in range(depth)]
    return runs


def run_one(attention: list[str], steps: int, seed: int = 0) -> dict:
    import time

    import lightning as L

    from zoo.training.sequence import SequenceTask

    L.seed_everything(seed, verbose=False)
    _, spec = TASKS["mqar"]
    spec = {key: value for key, value in spec.items() if key != "test_lengths"}
    data = build_data("mqar", ("MQAR", spec), BUDGET["batch_size"], seed, tiny=False, full_lengths=False)
    # pos_embed none: micro and elita carry order; the pure softmax model gets learned positions, as gpt-tiny
    size = {**SIZE, "depth": len(attention), "attention": attention,
            "pos_embed": "learned" if set(attention) == {"softmax"} else "none"}
    module = SequenceTask("gpt-tiny", size, data.data_info, lr=BUDGET["lr"], warmup_steps=BUDGET["warmup_steps"],
                          weight_decay=BUDGET["weight_decay"])
    trainer = L.Trainer(max_steps=steps, max_epochs=-1, limit_val_batches=0, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    start = time.perf_counter()
    trainer.fit(module, data)
    data.setup("test")
    return {"attention": attention, "seed": seed, "steps": steps, "size": size, "data": data.describe(),
            "train_seconds": round(time.perf_counter() - start, 1), "metrics": module.evaluate(data.test_dataloader())}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--only", default=None, help="one run's name, e.g. micro+softmax@2")
    parser.add_argument("--linear", nargs="+", default=["micro"], help="the linear-time mechanisms to mix (micro)")
    parser.add_argument("--depth", type=int, default=4, help="blocks (default 4, the registered hybrids')")
    parser.add_argument("--steps", type=int, default=3000, help="optimizer steps per run (default 3000)")
    parser.add_argument("--no-pure", action="store_true", help="skip the pure models (the capability suite has them)")
    args = parser.parse_args(argv)
    if not args.table:
        torch.set_num_threads(1)
        for name, attention in mixes(args.linear, args.depth, not args.no_pure).items():
            if (args.only and name != args.only) or name in load(OUT)["runs"]:
                continue
            print(f"{name} ...", flush=True)
            add_record(OUT, name, run_one(attention, args.steps), "python bench/hybrid_placement.py")
    runs = load(OUT)["runs"]
    rows = [{"model": name, "blocks": " ".join(r["attention"]), "steps": r["steps"],
             "MQAR test acc": r["metrics"].get("test/accuracy"), "train s": r["train_seconds"]}
            for name, r in sorted(runs.items())]
    print_table("MQAR accuracy by the place of the softmax block (1 thread)", rows,
                ["model", "blocks", "steps", "MQAR test acc", "train s"])


if __name__ == "__main__":
    main()
