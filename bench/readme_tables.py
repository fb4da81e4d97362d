"""The README's tables, "Choosing an attention", the shipped models and the speed against nanoGPT, written from
what was measured.

    python bench/readme_tables.py            # put the tables into README.md, between their markers
    python bench/readme_tables.py --check    # exit 1, naming the table, if README.md's differ from the files

Every cell comes from a file: the capability suite (bench/results/capabilities.json, the suite's 2-block forms at
width 64), the attention layers' training step (bench/results/attention.json, attention_yardsticks.json), decoding
whole models (bench/results/hybrid_decode.json, yardstick_decode.json), zoo against nanoGPT (nanogpt.json) and
the shipped checkpoints themselves (checkpoints/NAME/config.json and the tensor shapes in their model.safetensors).
Each cell links to the docs page where its figure is explained.
tests/test_readme_tables.py holds README.md to this script's output.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import sys
from math import prod
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CHECKPOINTS = ROOT / "checkpoints"
README = ROOT / "README.md"

# One row per mechanism and per recommended hybrid: (row, what it is good at, suite model in the capability
# tables or None, mechanism in attention.json's layer timings or None, model in hybrid_decode.json or None,
# its best shipped checkpoint). Softmax's suite row has learned positions, which end at the training length:
# its recall at 16x is read from the same attention with sinusoidal positions (LENGTH_FORM), and says so.
ROWS = (
    ("softmax", "the reference: recall, induction, copying", "gpt-tiny", "softmax", "gpt-tiny",
     "gpt-tiny.warpeace-rope"),
    ("quiet (softmax_one)", "softmax's quality; a head may attend to nothing", "quiet-gpt-tiny", "quiet", None,
     "quiet-vit-tiny.mnist"),
    ("micro", "cheapest training and decoding; images", "micro-gpt-tiny", "micro", "micro-gpt-tiny",
     "micro-vit-tiny.mnist"),
    ("elita", "linear time; long text with a fading history", "elita-gpt-tiny", "elita", "elita-gpt-tiny",
     "elita-gpt-tiny.warpeace-alibi"),
    ("incontext", "long text; recall far past the training length", "incontext-gpt-tiny", "incontext", None,
     "incontext-gpt-tiny.shakespeare"),
    ("hybrid-elita-conv1 (3 ELiTA + 1 softmax block)", "recall and induction, fast decoding; not long text",
     "hybrid-elita-gpt-tiny:conv1", None, "hybrid-elita-conv1-gpt-tiny", "hybrid-elita-conv1-gpt-tiny.shakespeare"),
    ("hybrid-micro-conv (3 micro + 1 softmax block)", "induction and copying at every length",
     "hybrid-micro-gpt-tiny:conv", None, "hybrid-micro-conv-gpt-tiny", "hybrid-micro-conv-gpt-tiny.warpeace"),
    ("fused", "pooling tokens of any rank into one vector", None, "fused", None, "fused-2d-tiny.mnist"),
    # the field's yardsticks, their War and Peace checkpoints; their decoding from bench/results/yardstick_decode.json,
    # their training step (and the in-context bias's) from bench/results/attention_yardsticks.json
    ("window (64 tokens)", "softmax's recall and induction inside its window; decoding at a fixed cost",
     "window-gpt-tiny", "window", "window-gpt-tiny", "window-gpt-tiny.warpeace"),
    ("gla", "linear time; text and copying, but no recall at this size", "gla-gpt-tiny", "gla", "gla-gpt-tiny",
     "gla-gpt-tiny.warpeace"),
    ("deltanet (gated delta rule)", "recall and copying in linear time (two seeds of three)",
     "deltanet-gpt-tiny", "deltanet", "deltanet-gpt-tiny", "deltanet-gpt-tiny.warpeace"),
    ("ssd (Mamba-2)", "long text in linear time; recall, not induction", "ssd-gpt-tiny", "ssd",
     "ssd-gpt-tiny", "ssd-gpt-tiny.warpeace"),
)
# (task, length) of the "loses" columns, with the docs page each links to
LOSES = (("mqar", 64, "recall", "mqar"), ("induction_heads", 64, "induction", "induction"),
         ("selective_copying", 128, "copying", "selective-copying"), ("mqar", 1024, "recall at 16x", "mqar"))
LENGTHS = (4096, 16384)
LENGTH_FORM = {"gpt-tiny": ("gpt-tiny:sincos", " (sin-cos positions)")}


def _mean_accuracy(runs: dict, model: str, task: str, length: int) -> float | None:
    key = f"test/accuracy@{length}"
    values = [r["metrics"][key] for r in runs.values() if r["task"] == task and r["model"] == model
              and key in r["metrics"]]
    return statistics.fmean(values) if values else None


def _train_ratio(attention: dict, mechanism: str, length: int) -> float | None:
    """The layer's forward and backward step at `length` tokens (fp32, batch 1) over causal SDPA's."""
    for row in attention["train"]:
        if row["mechanism"] == mechanism and row["length"] == length and row["dtype"] == "fp32":
            return row["vs_causal_sdpa"]
    return None


def _decode_ratio(decode: dict, model: str, length: int) -> float | None:
    """ms per token of gpt-tiny over the model's, after a context of `length` (so above 1 is faster)."""
    for row in decode["decode"]:
        if row["model"] == model and row["context"] == length:
            return row["speedup_vs_gpt"]
    return None


def parameters(folder: Path) -> int:
    """The number of weights in a release's model.safetensors, from its header's shapes (nothing else is read)."""
    with open(folder / "model.safetensors", "rb") as file:
        (size,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(size))
    return sum(prod(entry["shape"]) for name, entry in header.items() if name != "__metadata__")


def _metric(config: dict) -> str:
    metrics = config.get("metrics", {})
    if "test/acc" in metrics:
        return f"test accuracy {100 * metrics['test/acc']:.2f}%"
    return f"validation loss {metrics['val/loss']:.3f} nats/char" if "val/loss" in metrics else "-"


def _cell(value: float | None, page: str, form: str) -> str:
    return f"[{form.format(value)}](docs/{page})" if value is not None else "not measured"


def choosing_table() -> str:
    runs = json.loads((RESULTS / "capabilities.json").read_text())["runs"]
    attention = json.loads((RESULTS / "attention.json").read_text())
    if (RESULTS / "attention_yardsticks.json").is_file():  # their run, each ratio to causal SDPA in that run
        more = json.loads((RESULTS / "attention_yardsticks.json").read_text())["train"]
        attention["train"] += [r for r in more if r["mechanism"] != "softmax"]
    decode = json.loads((RESULTS / "hybrid_decode.json").read_text())
    if (RESULTS / "yardstick_decode.json").is_file():  # the yardsticks' run, each ratio within its own run
        decode["decode"] += json.loads((RESULTS / "yardstick_decode.json").read_text())["decode"]
    heads = ["attention", "good at", *(f"{h} %" for _, _, h, _ in LOSES),
             *(f"training step at {n // 1024}k" for n in LENGTHS), *(f"decoding at {n // 1024}k" for n in LENGTHS),
             "best shipped checkpoint"]
    lines = ["| " + " | ".join(heads) + " |", "|---" * len(heads) + "|"]
    for row, good, suite, layer, whole, checkpoint in ROWS:
        cells = [row, good]
        for task, length, _, page in LOSES:
            model, note = LENGTH_FORM.get(suite, (suite, "")) if page == "length" else (suite, "")
            value = _mean_accuracy(runs, model, task, length) if suite else None
            ran = suite and any(r["task"] == task and r["model"] == model for r in runs.values())
            if not suite:
                cells.append("-")
            elif value is None and ran:  # run, but not testable at this length
                cells.append("- (learned positions)")
            else:
                cells.append(_cell(None if value is None else 100 * value, f"capabilities/{page}.md", "{:.1f}" + note))
        for n in LENGTHS:
            ratio = _train_ratio(attention, layer, n) if layer else None
            cells.append(_cell(ratio, "benchmarks.md", "{:.2f}x"))
        for n in LENGTHS:
            ratio = _decode_ratio(decode, whole, n) if whole else None
            cells.append(_cell(None if ratio is None else 1 / ratio, "models.md", "{:.2f}x"))
        if checkpoint is None:
            cells.append("none shipped")
        else:
            config = json.loads((CHECKPOINTS / checkpoint / "config.json").read_text())
            cells.append(f"`{checkpoint}`: {_metric(config)}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def models_table() -> str:
    lines = ["| checkpoint | parameters | data | metric | load |", "|---|---|---|---|---|"]
    for folder in sorted(p for p in CHECKPOINTS.iterdir() if (p / "config.json").is_file()):
        config = json.loads((folder / "config.json").read_text())
        data = config.get("training", {}).get("data", {}).get("name", "-")
        lines.append(f"| `{folder.name}` | {parameters(folder):,} | {data} | {_metric(config)} | "
                     f"`zoo.load(\"{folder.name}\")` |")
    return "\n".join(lines)


def speed_table() -> str:
    """zoo's training against nanoGPT's on one machine (bench/nanogpt.py), at each thread count it was run at."""
    lines = ["| threads | run | tokens/s | x nanoGPT | wall s | validation loss |", "|---|---|---|---|---|---|"]
    for row in json.loads((RESULTS / "nanogpt.json").read_text())["rows"]:
        if row["trainer"] == "nanoGPT":
            run, ratio = "nanoGPT's `train.py`, float32", "1"
        else:
            run = "zoo, float32" if row["precision"] == "32-true" else f"zoo, `precision: auto` ({row['precision']})"
            run += ", `compile: true`" if row.get("compile") else ""
            ratio = f"[{row['x nanoGPT tokens/s']:.2f}x](docs/benchmarks.md#training-text-against-nanogpt)"
        lines.append(f"| {row['threads']} | {run} | {row['tokens/s']:,} | {ratio} | {row['wall s']:.0f} | "
                     f"{row['val loss']:.3f} |")
    return "\n".join(lines)


def tables() -> dict[str, str]:
    return {"choosing": choosing_table(), "models": models_table(), "speed": speed_table()}


def fill(text: str, filled: dict[str, str]) -> str:
    """`text` with each table between `<!-- table:NAME -->` and `<!-- /table:NAME -->`; a missing marker is named."""
    for name, table in filled.items():
        start, end = f"<!-- table:{name} -->", f"<!-- /table:{name} -->"
        head, found, rest = text.partition(start)
        _, closed, tail = rest.partition(end)
        if not (found and closed):
            raise ValueError(f"README.md has no {start} ... {end} markers for the {name} table")
        text = f"{head}{start}\n{table}\n{end}{tail}"
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md's tables differ from the files")
    args = parser.parse_args(argv)
    text = README.read_text()
    try:
        filled = fill(text, tables())
    except ValueError as error:
        parser.error(str(error))
    if args.check:
        if filled != text:
            print("README.md's tables differ from bench/results and checkpoints/: run python bench/readme_tables.py",
                  file=sys.stderr)
            return 1
        return 0
    if filled != text:
        from zoo.utils.atomic import write_text_atomic

        write_text_atomic(README, filled)
    return 0


if __name__ == "__main__":
    sys.exit(main())
