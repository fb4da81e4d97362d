"""Speed and memory of the attention library against PyTorch's own kernels, in one run.

    python bench/attention.py            # full run (about 15-20 minutes on 2 cores)
    python bench/attention.py --quick    # lengths up to 4k, for a smoke test

Every forward+backward measurement runs in a fresh process so that its peak resident
memory (above the process's memory before the measurement) is its own. Ratios are
taken against the baseline measured in the same run: causal SDPA for the token
mixers, torch.softmax for softmax_one. Results go to bench/results/attention.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.common import (  # noqa: E402
    current_rss_mb,
    in_subprocess,
    peak_rss_mb,
    print_table,
    timeit,
    timeit_pair,
    write_json,
)

HEADS, HEAD_DIM = 4, 64
DIM = HEADS * HEAD_DIM
MECHANISMS = ["softmax", "quiet", "micro", "elita", "fused"]
MEMORY_LIMIT_GB = 8


def estimated_gb(job: dict) -> float:
    """A rough upper bound of what a job holds at once, to skip the ones over the limit."""
    n = job["length"]
    if job.get("alpha"):
        return 3 * HEADS * n * n * 4 / 1e9  # scores, weights and a temporary, float32
    return 60 * n * DIM * 4 / 1e9 + (n * 64 * HEADS * 4 * 3 / 1e9 if job["mechanism"] == "elita" else 0)


def worker(job: dict) -> dict:
    import zoo.attention as A

    torch.manual_seed(0)
    name, n, dtype = job["mechanism"], job["length"], job["dtype"]
    kind = job.get("kind", "train")
    layer = A.build(name, DIM, heads=HEADS, causal=name != "fused", **({"max_len": n} if name == "elita" else {}))
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16")

    if kind == "decode":
        context = torch.randn(1, n, DIM)
        token = torch.randn(1, 1, DIM)
        steps = 32  # per timing: one step is ~0.1 ms, where a single call's timing is mostly noise

        def run():
            s = state
            for _ in range(steps):
                _, s = layer.step(token, s)

        with torch.no_grad(), autocast:
            _, state = layer.step(context)
            seconds = timeit(run, min_time=1.0, max_reps=50) / steps
        return {**job, "ms_per_token": seconds * 1e3}

    x = torch.randn(1, n, DIM, requires_grad=kind == "train")
    base = current_rss_mb()
    if kind == "train":
        def run():
            with autocast:
                y = layer(x)
            y.float().sum().backward()
    else:  # inference of fused attention, with or without building alpha
        def run():
            with torch.no_grad(), autocast:
                layer(x, return_alpha=job.get("alpha", False))
    seconds = timeit(run)
    return {**job, "ms": seconds * 1e3, "peak_mb": peak_rss_mb() - base}


def softmax_one_rows(sizes) -> list[dict]:
    from zoo.attention import softmax_one

    rows = []
    for n in sizes:
        x = torch.randn(n, n)
        base, ours = timeit_pair(lambda x=x: torch.softmax(x, -1), lambda x=x: softmax_one(x, -1), min_time=2.0)
        rows.append({"size": f"{n}x{n}", "softmax_ms": base * 1e3, "softmax_one_ms": ours * 1e3,
                     "ratio": ours / base})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="lengths up to 4k only")
    parser.add_argument("--max-quadratic", type=int, default=65536,
                        help="skip softmax, quiet and fused beyond this length (each 64k step takes minutes)")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return

    script = str(Path(__file__).resolve())
    lengths = [256, 1024, 4096] if args.quick else [256, 1024, 4096, 8192, 16384, 65536]
    train = []
    for dtype in ("fp32", "bf16"):
        for n in lengths:
            for name in MECHANISMS:
                job = {"mechanism": name, "length": n, "dtype": dtype, "kind": "train"}
                if estimated_gb(job) > MEMORY_LIMIT_GB:
                    row = {**job, "skipped": f"needs over {MEMORY_LIMIT_GB} GB"}
                elif name in ("softmax", "quiet", "fused") and n > args.max_quadratic:
                    row = {**job, "skipped": f"over --max-quadratic {args.max_quadratic}"}
                else:
                    row = in_subprocess(script, job)
                train.append(row)
                print(json.dumps(row), flush=True)
    by_key = {(r["mechanism"], r["length"], r["dtype"]): r for r in train}
    for r in train:
        baseline = by_key.get(("softmax", r["length"], r["dtype"]), {})
        if "ms" in r and "ms" in baseline:
            r["vs_causal_sdpa"] = r["ms"] / baseline["ms"]

    fused_memory = []
    for n in ([1024, 4096] if args.quick else [1024, 4096, 16384]):
        for alpha in (False, True):
            job = {"mechanism": "fused", "length": n, "dtype": "fp32", "kind": "infer", "alpha": alpha}
            fused_memory.append(in_subprocess(script, job))
            print(json.dumps(fused_memory[-1]), flush=True)

    decode = []
    for name in ("softmax", "quiet", "micro", "elita"):
        for n in ([256, 1024, 4096] if args.quick else [256, 1024, 4096, 16384]):
            decode.append(in_subprocess(script, {"mechanism": name, "length": n, "dtype": "fp32", "kind": "decode"}))
            print(json.dumps(decode[-1]), flush=True)

    softmax_one = softmax_one_rows([10, 100, 1000] if args.quick else [10, 100, 1000, 10000])

    cols = ["mechanism", "length", "dtype", "ms", "peak_mb", "vs_causal_sdpa", "skipped", "error"]
    print_table("forward+backward, batch 1, 4 heads of 64", train, cols)
    print_table("fused attention inference: SDPA path vs materialized alpha", fused_memory,
                ["length", "alpha", "ms", "peak_mb", "error"])
    print_table("recurrent decode, one token after a context", decode, ["mechanism", "length", "ms_per_token", "error"])
    print_table("softmax_one vs torch.softmax (forward)", softmax_one,
                ["size", "softmax_ms", "softmax_one_ms", "ratio"])

    targets = evaluate_targets(by_key, fused_memory, decode, softmax_one, lengths)
    print_table("targets", targets, ["target", "measured", "pass"])
    path = write_json("attention", {
        "train": train, "fused_memory": fused_memory, "decode": decode, "softmax_one": softmax_one, "targets": targets,
    })
    print(f"\nwrote {path}")


def evaluate_targets(by_key, fused_memory, decode, softmax_one, lengths) -> list[dict]:
    targets = []

    def add(name, value, ok):
        targets.append({"target": name, "measured": value, "pass": ok})

    big = [r for r in softmax_one if int(r["size"].split("x")[0]) >= 1000]
    worst = max(r["ratio"] for r in big)
    add("softmax_one <= 1.2x torch.softmax from 1000x1000", f"worst {worst:.2f}x", worst <= 1.2)
    for dtype in ("fp32", "bf16"):
        ratios = [by_key[("quiet", n, dtype)].get("vs_causal_sdpa") for n in lengths if 1024 <= n <= 8192]
        ratios = [r for r in ratios if r is not None]
        if ratios:
            add(f"quiet fwd+bwd <= 1.25x causal SDPA, L=1k..8k, {dtype}", f"worst {max(ratios):.2f}x",
                max(ratios) <= 1.25)
        for name in ("micro", "elita"):
            t4, t64 = by_key.get((name, 4096, dtype), {}), by_key.get((name, 65536, dtype), {})
            if "ms" in t4 and "ms" in t64:
                growth = t64["ms"] / t4["ms"]
                add(f"{name} t(64k)/t(4k) <= 20, {dtype}", f"{growth:.1f}", growth <= 20)
            r16 = by_key.get((name, 16384, dtype), {}).get("vs_causal_sdpa")
            if r16 is not None:
                add(f"{name} >= 10x faster than causal SDPA at 16k, {dtype}", f"{1 / r16:.1f}x faster", 1 / r16 >= 10)
    mem = {(r["length"], r["alpha"]): r.get("peak_mb") for r in fused_memory}
    n = max(r["length"] for r in fused_memory)
    if mem.get((n, False)) and mem.get((n, True)):
        share = mem[(n, False)] / mem[(n, True)]
        add(f"fused peak memory <= 1/10 of materialized alpha at {n}", f"{share:.3f}", share <= 0.1)
    for name in ("micro", "elita"):
        rows = {r["length"]: r.get("ms_per_token") for r in decode if r["mechanism"] == name}
        if rows and all(rows.values()):
            spread = max(rows.values()) / min(rows.values())
            add(f"{name} decode per token flat (max/min <= 1.5) over {min(rows)}..{max(rows)}", f"{spread:.2f}",
                spread <= 1.5)
    return targets


if __name__ == "__main__":
    main()
