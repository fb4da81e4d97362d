"""What the compiled in-context bias (csrc/incontext_bias.cpp) buys a training step, in one run.

    python bench/incontext_bias.py            # the capability suite's long tasks: ListOps, pixel MNIST
    python bench/incontext_bias.py --quick    # short sequences only, for a smoke test
    python bench/incontext_bias.py --profile  # where a step's time goes at pixel MNIST's 784 tokens

One training step (forward and backward of a next-token loss on random tokens) of incontext-gpt-tiny at the
capability suite's size (bench/capabilities.py's SIZE) and each task's batch and longest sequence, on the
kernel and on the eager route (`native.eager_routes()`), with gpt-tiny's step as the baseline: the three are
timed in turn, round after round, so that drift hits all alike, at one thread (as the suite trains). The
ratios are what the suite's `--estimate` calls "x gpt-tiny". Results go to bench/results/incontext_bias.json.
With --profile: the operators that take the most of one step of each model (torch.profiler's self CPU time),
bench/results/incontext_bias_profile.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.capabilities import SIZE  # noqa: E402
from bench.common import cpu_flags, print_table, timeit_rotation, write_json  # noqa: E402

# (task, batch, sequence length): the suite's batches, and the longest sequence each task trains on
SHAPES = [("mqar", 64, 64), ("selective_copying", 64, 128), ("listops", 64, 500), ("pixel_mnist", 50, 784)]
QUICK = SHAPES[:2]
VOCAB = 64
# torch.profiler files a custom operator's forward under its autograd wrapper's name
OPERATORS = {"GeneratedBackwardFor_zoo_incontext_bias_default": "zoo::incontext_bias (the forward)"}


def step(model: torch.nn.Module, tokens: torch.Tensor):
    def run():
        model.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()

    return run


def measure(task: str, batch: int, length: int) -> dict:
    import zoo
    from zoo.attention import native

    torch.manual_seed(0)
    make = dict(vocab_size=VOCAB, context_length=length, **SIZE)
    tokens = torch.randint(VOCAB, (batch, length + 1))
    baseline, incontext = zoo.create("gpt-tiny", **make), zoo.create("incontext-gpt-tiny", **make)
    kernel = step(incontext, tokens)

    def eager():
        with native.eager_routes():
            step(incontext, tokens)()

    base_s, kernel_s, eager_s = timeit_rotation([step(baseline, tokens), kernel, eager], rounds=5, min_time=0)
    return {"task": task, "batch": batch, "length": length, "gpt-tiny s": round(base_s, 4),
            "eager s": round(eager_s, 4), "kernel s": round(kernel_s, 4),
            "eager x gpt-tiny": round(eager_s / base_s, 2), "kernel x gpt-tiny": round(kernel_s / base_s, 2),
            "speed-up": round(eager_s / kernel_s, 2)}


def profile(task: str, batch: int, length: int, top: int = 10) -> list[dict]:
    """The `top` operators by self CPU time in one training step of gpt-tiny and of incontext-gpt-tiny (after
    one warm-up step), each with its share of the step's total."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    import zoo

    torch.manual_seed(0)
    make = dict(vocab_size=VOCAB, context_length=length, **SIZE)
    tokens = torch.randint(VOCAB, (batch, length + 1))
    rows = []
    for name in ("gpt-tiny", "incontext-gpt-tiny"):
        run = step(zoo.create(name, **make), tokens)
        run()
        with profiler(activities=[ProfilerActivity.CPU]) as prof:
            run()
        ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in ops)
        rows += [{"model": name, "step s": round(total / 1e6, 3), "operator": OPERATORS.get(e.key, e.key),
                  "self s": round(e.self_cpu_time_total / 1e6, 3), "share": round(e.self_cpu_time_total / total, 3)}
                 for e in ops[:top]]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short sequences only, for a smoke test")
    parser.add_argument("--profile", action="store_true",
                        help="the operators that take the most of one step at pixel MNIST's shape, nothing timed")
    args = parser.parse_args()
    from zoo.attention import native

    if native.load() is None:
        sys.exit("bench/incontext_bias.py compares the compiled kernel with the eager route, and the kernel "
                 "could not be built here (see the warning above)")
    torch.set_num_threads(1)
    if args.profile:
        task, batch, length = SHAPES[-1]
        rows = profile(task, batch, length)
        print_table(f"where a training step's time goes ({task}: batch {batch}, {length} tokens, one thread)",
                    rows, list(rows[0]))
        path = write_json("incontext_bias_profile", {"cpu_flags": cpu_flags(), "size": SIZE, "task": task,
                                                     "batch": batch, "length": length, "rows": rows})
        print(f"\nwrote {path}")
        return
    rows = [measure(*shape) for shape in (QUICK if args.quick else SHAPES)]
    columns = ["task", "batch", "length", "gpt-tiny s", "eager s", "kernel s", "eager x gpt-tiny",
               "kernel x gpt-tiny", "speed-up"]
    print_table("incontext-gpt-tiny training step: the compiled bias against the eager route", rows, columns)
    if not args.quick:
        path = write_json("incontext_bias", {"cpu_flags": cpu_flags(), "size": SIZE, "rows": rows})
        print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
