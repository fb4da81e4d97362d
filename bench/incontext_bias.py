"""What the in-context bias costs a training step against gpt-tiny, on each of its routes, in one run.

    python bench/incontext_bias.py            # the suite's shapes, 512 and 4,096 tokens; memory, build, threads
    python bench/incontext_bias.py --quick    # short sequences only, for a smoke test (nothing written)
    python bench/incontext_bias.py --profile  # where a step's time goes at pixel MNIST's 784 tokens
    python bench/incontext_bias.py --mini     # the mini recipes' step: incontext-gpt-mini in bf16 against gpt-mini

One training step (forward and backward of a next-token loss on random tokens) of incontext-gpt-tiny at the
capability suite's size (bench/capabilities.py's SIZE) and each task's batch and longest sequence, plus 512 and
4,096 tokens (the tracker's targets), with gpt-tiny's step as the baseline, on three routes of the layer:

    fused      csrc/incontext_attention.cpp (zoo/attention/incontext_kernel.py): the bias computed inside a
               flash-attention kernel, forward and backward, never an L x L tensor; what the layer runs
    bias mask  csrc/incontext_bias.cpp writes the (B, H, L, L) bias, SDPA takes it as a float mask (its math
               kernel, since the mask needs a gradient): the route before the fused kernel
    eager      the bias mask built by PyTorch operators (`native.eager_routes()`), up to 512 tokens only

timed in turn, round after round, so that drift hits all alike, at one thread (as the suite trains). The ratios are
what the suite's `--estimate` calls "x gpt-tiny". Beside the times:

    memory     the peak resident memory a training step adds to the process (after a warm-up step), each model
               and route in a fresh process, in MiB: O(L) for gpt-tiny and the fused route, O(L^2) for the bias mask
    build      the seconds the fused kernel's C++ extension takes to build on an empty cache (once per machine and
               torch version; later processes load it from the cache)
    threads    a 2-thread step's time over a 1-thread step's, gpt-tiny and the fused route, at the suite's shapes
               (item 3 of the tracker: a ratio above 1 is a second thread that slows the step). Meaningful on an
               idle machine only: with another process busy on a 2-core machine, a second OpenMP thread waits on a
               core that is not free, and both models slow alike (1.5x-15x in the run of 5 December 2026, whose
               "shared with" lists the other processes)

Results go to bench/results/incontext_bias.json. With --profile: the operators that take the most of one step of
each model and route (torch.profiler's self CPU time), bench/results/incontext_bias_profile.json. With --mini:
one training step of the mini study's recipes (recipes/*-mini.*.yaml: a batch of 4 x 2,048 characters under the
bf16 autocast that `precision: auto` chooses on a CPU with AMX; random tokens of a 64-token vocabulary, where the
recipes' characters number 82 and 222), incontext-gpt-mini on the fused route (its bf16
q, k and v widened to float32) and on the bias mask against gpt-mini, bench/results/incontext_bias_mini.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.capabilities import SIZE  # noqa: E402
from bench.common import (  # noqa: E402
    cpu_flags,
    current_rss_mb,
    in_subprocess,
    peak_rss_mb,
    print_table,
    timeit_rotation,
    write_json,
)

# (task, batch, sequence length): the suite's batches and the longest sequence each task trains on, then the
# tracker's two target lengths (512 at the suite's largest batch, 4,096 at a batch of 4)
SUITE = [("mqar", 64, 64), ("selective_copying", 64, 128), ("listops", 64, 500), ("pixel_mnist", 50, 784)]
SHAPES = SUITE[:3] + [("target 512", 64, 512), SUITE[3], ("target 4096", 4, 4096)]
QUICK = SHAPES[:2]
MINI = ("mini recipes", 4, 2048)  # recipes/*-mini.*.yaml: batch 4, context 2,048
QUICK_MINI = ("quick", 2, 64)
EAGER_UP_TO = 512  # the eager route takes 17 s a step at 784 tokens (22x gpt-tiny): it is left out beyond
VOCAB = 64
ROUTES = ("gpt-tiny", "fused", "bias mask", "eager")
# torch.profiler files a custom operator's forward under its autograd wrapper's name
OPERATORS = {"GeneratedBackwardFor_zoo_incontext_bias_default": "zoo::incontext_bias (the forward)",
             "GeneratedBackwardFor_zoo_incontext_attention_default": "zoo::incontext_attention (the forward)"}


def step(model: torch.nn.Module, tokens: torch.Tensor, bf16: bool = False):
    """One training step; bf16: the forward under a bf16 autocast, the loss and backward outside it (as
    Lightning's bf16-mixed precision runs a step)."""
    def run():
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(tokens[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten()).backward()

    return run


def on_route(route: str, run):
    """`run` on one route of the in-context layer: "fused" as the layer chooses, "bias mask" with the fused kernel
    off, "eager" with every kernel off."""
    from zoo.attention import incontext_kernel, native

    def routed():
        if route == "bias mask":
            with incontext_kernel.disabled():
                return run()
        if route == "eager":
            with native.eager_routes():
                return run()
        return run()

    return routed


def models(length: int, batch: int):
    import zoo

    torch.manual_seed(0)
    make = dict(vocab_size=VOCAB, context_length=length, **SIZE)
    tokens = torch.randint(VOCAB, (batch, length + 1))
    return zoo.create("gpt-tiny", **make), zoo.create("incontext-gpt-tiny", **make), tokens


def measure(task: str, batch: int, length: int) -> dict:
    baseline, incontext, tokens = models(length, batch)
    routes = [r for r in ROUTES[1:] if r != "eager" or length <= EAGER_UP_TO]
    fns = [step(baseline, tokens)] + [on_route(r, step(incontext, tokens)) for r in routes]
    times = dict(zip(["gpt-tiny", *routes], timeit_rotation(fns, rounds=5 if length <= 1024 else 3, min_time=0)))
    row = {"task": task, "batch": batch, "length": length}
    row.update({f"{r} s": round(t, 4) for r, t in times.items()})
    row.update({f"{r} x gpt-tiny": round(t / times["gpt-tiny"], 2) for r, t in times.items() if r != "gpt-tiny"})
    return row


def measure_mini(task: str, batch: int, length: int) -> dict:
    """The mini recipes' training step in bf16: incontext-gpt-mini on the fused route and on the bias mask, and
    gpt-mini (softmax with rotary positions, SDPA's flash kernel) as the baseline."""
    import zoo

    torch.manual_seed(0)
    make = dict(vocab_size=VOCAB, context_length=length)
    baseline, incontext = zoo.create("gpt-mini", **make), zoo.create("incontext-gpt-mini", **make)
    tokens = torch.randint(VOCAB, (batch, length + 1))
    routes = ("fused", "bias mask")
    fns = [step(baseline, tokens, bf16=True)] + [on_route(r, step(incontext, tokens, bf16=True)) for r in routes]
    times = dict(zip(["gpt-mini", *routes], timeit_rotation(fns, rounds=5, min_time=0)))
    row = {"task": task, "batch": batch, "length": length, "precision": "bf16 autocast"}
    row.update({f"{r} s": round(t, 3) for r, t in times.items()})
    row.update({f"{r} x gpt-mini": round(times[r] / times["gpt-mini"], 2) for r in routes})
    row["bias mask x fused"] = round(times["bias mask"] / times["fused"], 2)
    return row


def memory_worker(job: dict) -> dict:
    """In a fresh process: the peak resident memory one training step adds, after a warm-up step."""
    from zoo.attention import incontext_kernel, native

    torch.set_num_threads(1)
    native.load(), incontext_kernel.load()
    baseline, incontext, tokens = models(job["length"], job["batch"])
    model = baseline if job["route"] == "gpt-tiny" else incontext
    run = on_route(job["route"], step(model, tokens))
    run()
    model.zero_grad(set_to_none=True)
    before = current_rss_mb()
    if Path("/proc/self/clear_refs").exists():  # resets the peak (VmHWM) to the present resident set
        Path("/proc/self/clear_refs").write_text("5")
    run()
    with open("/proc/self/status") as f:
        peak = next((int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM")), peak_rss_mb())
    return {**job, "step MiB": round(peak - before, 1)}


def build_worker(job: dict) -> dict:
    """In a fresh process with an empty extension cache: the seconds the fused kernel takes to build and load."""
    from zoo.attention import incontext_kernel

    start = time.perf_counter()
    built = incontext_kernel.load() is not None
    return {**job, "build s": round(time.perf_counter() - start, 1), "built": built}


def memory(shapes) -> list[dict]:
    script = str(Path(__file__).resolve())
    rows = []
    for task, batch, length in shapes:
        row = {"task": task, "batch": batch, "length": length}
        for route in ROUTES[:3]:
            got = in_subprocess(script, {"kind": "memory", "route": route, "batch": batch, "length": length})
            row[f"{route} MiB"] = got.get("step MiB", got.get("error"))
        rows.append(row)
    return rows


def build_time() -> dict:
    with tempfile.TemporaryDirectory() as cache:
        return in_subprocess(str(Path(__file__).resolve()), {"kind": "build"},
                             env={"TORCH_EXTENSIONS_DIR": cache})


def threads(shapes) -> list[dict]:
    """A 2-thread step's time over a 1-thread step's, timed in turn, for gpt-tiny and the fused route."""
    rows = []
    for task, batch, length in shapes:
        baseline, incontext, tokens = models(length, batch)

        def at(n, run):
            def timed():
                torch.set_num_threads(n)
                try:
                    run()
                finally:
                    torch.set_num_threads(1)

            return timed

        fns = [at(n, step(m, tokens)) for m in (baseline, incontext) for n in (1, 2)]
        base1, base2, fused1, fused2 = timeit_rotation(fns, rounds=5, min_time=0)
        rows.append({"task": task, "batch": batch, "length": length,
                     "gpt-tiny 1-thread s": round(base1, 4), "gpt-tiny 2/1": round(base2 / base1, 2),
                     "fused 1-thread s": round(fused1, 4), "fused 2/1": round(fused2 / fused1, 2)})
    return rows


def profile(task: str, batch: int, length: int, top: int = 10) -> list[dict]:
    """The `top` operators by self CPU time in one training step of gpt-tiny and of incontext-gpt-tiny on its fused
    route and on the bias-mask route (after one warm-up step), each with its share of the step's total."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    baseline, incontext, tokens = models(length, batch)
    rows = []
    for name, model, route in (("gpt-tiny", baseline, "fused"), ("incontext-gpt-tiny", incontext, "fused"),
                               ("incontext-gpt-tiny (bias mask)", incontext, "bias mask")):
        run = on_route(route, step(model, tokens))
        run()
        with profiler(activities=[ProfilerActivity.CPU]) as prof:
            run()
        ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in ops)
        rows += [{"model": name, "step s": round(total / 1e6, 3), "operator": OPERATORS.get(e.key, e.key),
                  "self s": round(e.self_cpu_time_total / 1e6, 3), "share": round(e.self_cpu_time_total / total, 3)}
                 for e in ops[:top]]
    return rows


def shared_machine() -> list[str]:
    """Other processes using the CPU as the run starts (ps), so that a shared machine is said in the results."""
    import subprocess

    try:
        out = subprocess.run(["ps", "-eo", "pid,pcpu,args", "--sort=-pcpu"], capture_output=True, text=True).stdout
    except OSError:
        return []
    busy = [line.strip() for line in out.splitlines()[1:] if line.split() and float(line.split()[1]) > 20.0]
    return [line[:160] for line in busy if str(os.getpid()) != line.split()[0]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short sequences only, for a smoke test")
    parser.add_argument("--profile", action="store_true",
                        help="the operators that take the most of one step at pixel MNIST's shape, nothing timed")
    parser.add_argument("--mini", action="store_true",
                        help="the mini recipes' step in bf16 (batch 4 x 2,048): incontext-gpt-mini against gpt-mini")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        job = json.loads(args.worker)
        print(json.dumps((memory_worker if job["kind"] == "memory" else build_worker)(job)))
        return
    from zoo.attention import incontext_kernel, native

    if native.load() is None or incontext_kernel.load() is None:
        sys.exit("bench/incontext_bias.py compares the compiled kernels with each other and the eager route, and "
                 "they could not be built here (see the warning above)")
    torch.set_num_threads(1)
    if args.profile:
        task, batch, length = SUITE[-1]
        rows = profile(task, batch, length)
        print_table(f"where a training step's time goes ({task}: batch {batch}, {length} tokens, one thread)",
                    rows, list(rows[0]))
        path = write_json("incontext_bias_profile", {"cpu_flags": cpu_flags(), "size": SIZE, "task": task,
                                                     "batch": batch, "length": length, "rows": rows})
        print(f"\nwrote {path}")
        return
    busy = shared_machine()
    if args.mini:
        row = measure_mini(*(QUICK_MINI if args.quick else MINI))
        print_table("a training step of the mini recipes in bf16, one thread", [row], list(row))
        if not args.quick:
            path = write_json("incontext_bias_mini", {"cpu_flags": cpu_flags(), "shared with": busy, "rows": [row]})
            print(f"\nwrote {path}")
        return
    shapes = QUICK if args.quick else SHAPES
    rows = [measure(*shape) for shape in shapes]
    columns = ["task", "batch", "length", *(f"{r} s" for r in ROUTES), *(f"{r} x gpt-tiny" for r in ROUTES[1:])]
    print_table("incontext-gpt-tiny training step on each route, one thread", rows, columns)
    if args.quick:
        return
    mem = memory(SHAPES)
    print_table("peak memory a training step adds (MiB, fresh process each)", mem)
    thread_rows = threads(SUITE)
    print_table("a 2-thread step's time over a 1-thread step's", thread_rows)
    build = build_time()
    print(f"\nthe fused kernel builds in {build.get('build s')} s on an empty cache (once per machine and torch "
          "version)")
    path = write_json("incontext_bias", {"cpu_flags": cpu_flags(), "size": SIZE, "shared with": busy, "rows": rows,
                                         "memory": mem, "threads": thread_rows, "build": build})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
