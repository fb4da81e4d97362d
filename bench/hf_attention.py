"""Speed of attn_implementation="zoo_quiet" against transformers' "sdpa" in a randomly initialised Llama.

    python bench/hf_attention.py                          # 4,096 tokens, forward and forward+backward
    python bench/hf_attention.py --tokens 1024 --layers 1 # a smoke test

One process, one thread (torch.set_num_threads(1)): the same model switches implementation between calls
(set_attn_implementation), and the two are timed in alternation round after round (timeit_pair), so the
ratio zoo_quiet / sdpa is taken within one run on one machine and drift hits both alike. zoo_softmax (zoo's
path with the plain softmax, which computes sdpa's numbers) is timed beside them, to separate the cost of
the path from the cost of the extra zero key. The CPU's flags (/proc/cpuinfo) are recorded with the results
in bench/results/hf_attention.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import cpu_flags, print_table, timeit_rotation, write_json  # noqa: E402

IMPLEMENTATIONS = ("sdpa", "zoo_softmax", "zoo_quiet")


def build(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    from zoo.attention import register_attention_functions

    register_attention_functions()
    config = LlamaConfig(hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=256,
                         max_position_embeddings=args.tokens)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def measure(model, ids, implementation: str, backward: bool):
    def call():
        model.set_attn_implementation(implementation)
        if backward:
            model.zero_grad(set_to_none=True)
            model(ids, labels=ids).loss.backward()
        else:
            with torch.no_grad():
                model(ids, use_cache=False)
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="alternations of the implementations per mode")
    parser.add_argument("--no-backward", action="store_true", help="time the forward pass only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = build(args)
    ids = torch.randint(0, 256, (1, args.tokens), generator=torch.Generator().manual_seed(1))
    rows = []
    for backward in ([False] if args.no_backward else [False, True]):
        model.train(backward)
        fns = [measure(model, ids, name, backward) for name in IMPLEMENTATIONS]
        seconds = dict(zip(IMPLEMENTATIONS, timeit_rotation(fns, rounds=args.rounds, min_time=0.0)))
        mode = "forward+backward" if backward else "forward"
        rows.append({"mode": mode, **{f"{name}_s": seconds[name] for name in IMPLEMENTATIONS},
                     "zoo_quiet/sdpa": seconds["zoo_quiet"] / seconds["sdpa"],
                     "zoo_softmax/sdpa": seconds["zoo_softmax"] / seconds["sdpa"]})
    print_table(f"Llama, {args.layers} layers of width {args.hidden}, {args.heads} heads ({args.kv_heads} kv), "
                f"{args.tokens} tokens, 1 thread", rows)
    path = write_json("hf_attention", {"config": vars(args), "cpu_flags": cpu_flags(), "rows": rows})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
