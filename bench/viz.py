"""What zoo.viz.capture costs when nobody captures: nothing, as it registers no hook outside its context.

    python bench/viz.py

Times a model's forward pass before any capture and after a capture context has closed, in
alternation (the ratio should be 1), and the forward pass inside the context, where every
attention layer's weights are recomputed. Writes bench/results/viz.json.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import zoo  # noqa: E402
from bench.common import cpu_flags, print_table, timeit_rotation, write_json  # noqa: E402
from zoo.viz import capture  # noqa: E402

MODELS = ["vit-tiny", "quiet-vit-tiny", "micro-vit-tiny", "gpt-tiny", "elita-gpt-tiny"]


def inside(model, x):
    with capture(model):
        model(x)


def main() -> None:
    rows = []
    for name in MODELS:
        untouched, captured = zoo.create(name).eval(), zoo.create(name).eval()
        x = torch.randint(0, 65, (8, 256)) if hasattr(untouched, "vocab_size") else torch.rand(64, 1, 28, 28)
        with capture(captured):
            captured(x[:1])  # hooks were registered, used and removed
        with torch.inference_mode():
            never, after, during = timeit_rotation([partial(untouched, x), partial(captured, x),
                                                    partial(inside, captured, x)], 100, 3.0)
        rows.append({"model": name, "never_ms": never * 1e3, "after_ms": after * 1e3, "inside_ms": during * 1e3,
                     "after_over_never": after / never, "inside_over_never": during / never})
        print(rows[-1], flush=True)
    print_table("Forward pass: never captured, after a capture, inside a capture", rows,
                ["model", "never_ms", "after_ms", "inside_ms", "after_over_never", "inside_over_never"])
    print(f"\nwrote {write_json('viz', {'command': 'python bench/viz.py', 'cpu_flags': cpu_flags(), 'rows': rows})}")


if __name__ == "__main__":
    main()
