"""Decoding time and state memory of the hybrids against softmax attention and the pure linear models, per token
after a long context, in one run.

    python bench/hybrid_decode.py            # contexts 256, 1k, 4k and 16k (1 thread)
    python bench/hybrid_decode.py --quick    # contexts 256 and 1k, for a smoke test

Each model is its registered tiny size with room for the longest context (context_length raised). A context
of random tokens is prefilled in one call; then 16 one-token steps are timed, from a copy of the state with
room for them (bench/decode.py's `with_room`: a KV cache between doublings), in rounds that take the models
in turns, so that drift hits all alike, under torch.inference_mode (as `generate` runs). The state's size
is the bytes of every tensor it holds. The ratio is gpt-tiny's time (the baseline, measured in the same run)
over the model's: above 1 is faster.
Results go to bench/results/hybrid_decode.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import fields, is_dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.common import cpu_flags, print_table, write_json  # noqa: E402
from bench.decode import STEPS, decode, with_room  # noqa: E402

BASELINE = "gpt-tiny"
# incontext-gpt-tiny is left out: it keeps a KV cache as softmax does, and its prefill builds an L x L bias
# (4 GiB a block at 16k tokens)
MODELS = [BASELINE, "micro-gpt-tiny", "elita-gpt-tiny", "hybrid-micro-gpt-tiny", "hybrid-elita-gpt-tiny",
          "hybrid-micro-conv-gpt-tiny", "hybrid-elita-conv-gpt-tiny", "hybrid-elita-conv1-gpt-tiny"]
# the field's yardsticks (a sliding window, a cache of its last 63 tokens; GLA, DeltaNet, Mamba-2's SSD):
#   python bench/hybrid_decode.py --models window-gpt-tiny gla-gpt-tiny deltanet-gpt-tiny ssd-gpt-tiny \
#       --out yardstick_decode
YARDSTICKS = ["window-gpt-tiny", "gla-gpt-tiny", "deltanet-gpt-tiny", "ssd-gpt-tiny"]
CONTEXTS = [256, 1024, 4096, 16384]
ROUNDS = 5


def state_bytes(states: list) -> int:
    """The bytes of every tensor the block states hold (a KV cache: only its filled part)."""
    from zoo.attention.softmax import KVCache
    from zoo.models.short_conv import ConvState

    total = 0
    for state in states:
        if isinstance(state, ConvState):  # a block with a short convolution: its tail, then its attention's state
            total += state.tail.nbytes
            state = state.attention
        if isinstance(state, KVCache):
            total += 2 * state.keys[:, :, :state.length].nbytes
            continue
        for f in fields(state) if is_dataclass(state) else ():
            value = getattr(state, f.name)
            total += value.nbytes if isinstance(value, torch.Tensor) else 0
    return total


def main():
    import zoo

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="contexts 256 and 1k only")
    parser.add_argument("--models", nargs="+", default=MODELS[1:], help=f"beside {BASELINE} (default: the hybrids "
                        "and the linear models)")
    parser.add_argument("--out", default="hybrid_decode", help="bench/results/OUT.json")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the machine is shared; one thread also makes the timings comparable
    contexts = CONTEXTS[:2] if args.quick else CONTEXTS
    torch.manual_seed(0)
    names = [BASELINE, *(m for m in args.models if m != BASELINE)]
    models = {name: zoo.create(name, context_length=max(contexts) + STEPS + 1).eval() for name in names}
    rows = []
    with torch.inference_mode():  # as generate runs
        for n in contexts:
            ids = torch.randint(0, 65, (1, n))
            tokens = torch.randint(0, 65, (1, STEPS))
            prefilled = {name: model.forward_step(ids)[1] for name, model in models.items()}
            times = {name: [] for name in models}
            for name, model in models.items():  # warm-up
                decode(model, with_room(prefilled[name], STEPS), n, tokens)
            for _ in range(ROUNDS):
                for name, model in models.items():
                    times[name].append(decode(model, with_room(prefilled[name], STEPS), n, tokens))
            base = statistics.median(times[BASELINE])
            for name in models:
                ms = statistics.median(times[name])
                rows.append({"model": name, "context": n, "ms_per_token": ms * 1e3,
                             "speedup_vs_gpt": base / ms, "state_MiB": state_bytes(prefilled[name]) / 2**20})
                print(rows[-1], flush=True)
    print_table("decode ms per token after a context, and the state it keeps (1 thread, float32, batch 1)", rows,
                ["model", "context", "ms_per_token", "speedup_vs_gpt", "state_MiB"])
    command = " ".join(["python bench/hybrid_decode.py", *(["--quick"] if args.quick else []),
                        *(["--models", *args.models] if args.models != MODELS[1:] else []),
                        *(["--out", args.out] if args.out != "hybrid_decode" else [])])
    path = write_json(args.out, {"command": command, "cpu_flags": cpu_flags(), "threads": 1, "steps": STEPS,
                                 "rounds": ROUNDS, "baseline": BASELINE, "decode": rows})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
