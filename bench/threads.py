"""Is a 2-thread training step faster than a 1-thread one? Every mechanism at the capability suite's size.

    python bench/threads.py            # MQAR's shape (64 tokens) and pixel MNIST's (784), 2 threads against 1
    python bench/threads.py --quick    # MQAR's shape only, fewer rounds: a smoke test

Each model is the suite's (bench/capabilities.py's SIZE: width 64, 2 blocks, 2 heads) in the precision the suite
trains in (float32), and one step is forward, backward and an AdamW update on random tokens of the task's shape
(batch 64 x 64 tokens; batch 50 x 784). Thread counts take turns, round after round, in one process
(torch.set_num_threads), so that drift hits both alike; the figure is the median step time of each, and the
ratio 1-thread time / 2-thread time (above 1: the second thread helps). It means something only on an idle
machine with at least two cores: the JSON records the load average before and after. Results go to
bench/results/threads.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import zoo  # noqa: E402
from bench.capabilities import SIZE, model_spec  # noqa: E402
from bench.common import cpu_flags, print_table, write_json  # noqa: E402

MODELS = ["gpt-tiny:rope", "quiet-gpt-tiny", "micro-gpt-tiny", "elita-gpt-tiny", "incontext-gpt-tiny",
          "hybrid-micro-gpt-tiny:conv", "hybrid-elita-gpt-tiny:conv", "window-gpt-tiny", "gla-gpt-tiny",
          "deltanet-gpt-tiny", "ssd-gpt-tiny"]
SHAPES = {"mqar": (64, 64, 256), "pixel_mnist": (50, 784, 256)}  # batch, tokens, vocabulary


def step_time(model, optimizer, ids: torch.Tensor, threads: int, steps: int) -> float:
    torch.set_num_threads(threads)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        logits = model(ids)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str, shape: str, rounds: int, steps: int) -> dict:
    batch, length, vocab = SHAPES[shape]
    registered, size = model_spec(name)
    torch.manual_seed(0)
    model = zoo.create(registered, vocab_size=vocab, context_length=length, **size).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))
    step_time(model, optimizer, ids, 2, 2)  # warm-up: kernels built, buffers allocated
    times = {1: [], 2: []}
    for _ in range(rounds):
        for threads in (1, 2):
            times[threads].append(step_time(model, optimizer, ids, threads, steps))
    one, two = statistics.median(times[1]), statistics.median(times[2])
    return {"model": name, "shape": shape, "batch": batch, "tokens": length, "ms 1 thread": round(one * 1e3, 2),
            "ms 2 threads": round(two * 1e3, 2), "1 thread / 2 threads": round(one / two, 3)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="MQAR's shape, 2 rounds of 2 steps; nothing written")
    parser.add_argument("--models", nargs="+", default=MODELS)
    args = parser.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("bench/threads.py compares 1 and 2 threads: this machine has one core")
    shapes, rounds, steps = (["mqar"], 2, 2) if args.quick else (list(SHAPES), 5, 3)
    load_before = os.getloadavg()[0]
    rows = [measure(name, shape, rounds, steps) for shape in shapes for name in args.models]
    print_table("Training step, 1 thread against 2", rows)
    if not args.quick:
        write_json("threads", {"command": "python bench/threads.py", "cpu_flags": cpu_flags(),
                               "cpu_count": os.cpu_count(), "size": SIZE, "precision": "float32",
                               "load before": round(load_before, 2), "load after": round(os.getloadavg()[0], 2),
                               "rows": rows})


if __name__ == "__main__":
    main()
