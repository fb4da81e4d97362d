"""Per-token decoding time of the text models after long contexts: the KV cache that grows in place against
the one it replaced, in one run.

    python bench/decode.py            # contexts 256, 1k, 4k and 16k (about 5 minutes, 1 thread)
    python bench/decode.py --quick    # contexts 256 and 1k, for a smoke test

The replaced cache grew by `torch.cat` at every step, copying every cached key and value
once a token, and quiet attention prepended its zero key and value to that copy again; it is rebuilt below
(`old_step`, the previous `SoftmaxAttention.step` word for word) and swapped in for its timings. The new
cache writes each token into buffers with room to spare, doubling them when they fill: each token is
copied about twice in all, a cost spread over the steps that fill the doubled buffer. It is timed here in
its steady state, from a buffer with room (a doubling at 16k copies the 16k tokens once per 16k steps).
micro and elita keep a constant-size state that this change does not touch: they are timed once, for
comparison. Each model is its registered tiny size with room for the longest context (context_length
raised: gpt-tiny's learned positions end at 256). Old and new take turns, round after round, in one
process, so that drift hits both alike. Results go to bench/results/decode.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.common import cpu_flags, print_table, write_json  # noqa: E402

MODELS = ["gpt-tiny", "quiet-gpt-tiny", "micro-gpt-tiny", "elita-gpt-tiny"]
CONTEXTS = [256, 1024, 4096, 16384]
STEPS, ROUNDS = 16, 7


def old_step(self, x, state=None, key_padding_mask=None):
    """SoftmaxAttention.step before the change: the cache grows by torch.cat, and quiet attention's zero key
    and value are prepended to the whole cache again at every step (inside attend)."""
    from zoo.attention.dot_product import attend
    from zoo.attention.softmax import KVCache

    q, k, v = self._split_heads(x)
    start = 0
    if state is not None:
        start = state.length
        k = torch.cat([state.keys, k], dim=-2)
        v = torch.cat([state.values, v], dim=-2)
    out = attend(q, k, v, causal=True, bias=self._bias(start, start + x.shape[1]), quiet=self.quiet,
                 clip=self.clip(k.shape[-2], x.shape[1], x.device))
    return self._merge_heads(self._gated(out, x)), KVCache(k, v)


class using_old_cache:
    """Swap the previous KV cache step in for SoftmaxAttention (and its subclasses) within the block."""

    def __enter__(self):
        from zoo.attention.softmax import SoftmaxAttention

        self.saved = SoftmaxAttention.step
        SoftmaxAttention.step = old_step

    def __exit__(self, *exc):
        from zoo.attention.softmax import SoftmaxAttention

        SoftmaxAttention.step = self.saved


def with_room(states: list, steps: int) -> list:
    """A copy of each KVCache in buffers with room for `steps` more tokens, which this copy owns (as the
    states in a decoding loop are between doublings); other states as they are."""
    from zoo.attention.softmax import KVCache
    from zoo.models.short_conv import ConvState

    roomy = []
    for s in states:
        if isinstance(s, ConvState):  # a block with a short convolution: room in its attention's cache
            s = ConvState(s.tail, with_room([s.attention], steps)[0])
        elif isinstance(s, KVCache):
            n = s.length
            keys = s.keys.new_empty(*s.keys.shape[:2], n + steps, s.keys.shape[-1])
            values = keys.clone()
            keys[:, :, :n], values[:, :, :n] = s.keys[:, :, :n], s.values[:, :, :n]
            s = KVCache(keys, values, n, None, [n])
        roomy.append(s)
    return roomy


def decode(model, states: list, position: int, tokens: torch.Tensor) -> float:
    """Seconds per token of `len(tokens)` one-token steps from `states` at `position`."""
    start = time.perf_counter()
    for i in range(tokens.shape[1]):
        _, states = model.forward_step(tokens[:, i:i + 1], states, position + i)
    return (time.perf_counter() - start) / tokens.shape[1]


def time_context(model, n: int, cached: bool) -> dict:
    """Median ms per token after n tokens, new cache and (for KV-cached models) the old one, in turns."""
    ids = torch.randint(0, model.vocab_size, (1, n))
    tokens = torch.randint(0, model.vocab_size, (1, STEPS))
    _, new_states = model.forward_step(ids)
    variants = {"new": lambda: decode(model, with_room(new_states, STEPS), n, tokens)}
    if cached:
        with using_old_cache():
            _, old_states = model.forward_step(ids)

        def run_old():
            with using_old_cache():
                return decode(model, old_states, n, tokens)

        variants["old"] = run_old
    for fn in variants.values():
        fn()  # warm-up
    times = {key: [] for key in variants}
    for _ in range(ROUNDS):
        for key, fn in variants.items():
            times[key].append(fn())
    row = {"context": n, "new_ms": statistics.median(times["new"]) * 1e3}
    if cached:
        row["old_ms"] = statistics.median(times["old"]) * 1e3
        row["new/old"] = row["new_ms"] / row["old_ms"]
    return row


def measure(name: str, contexts: list[int]) -> list[dict]:
    import zoo

    torch.manual_seed(0)
    model = zoo.create(name, context_length=max(contexts) + STEPS + 1).eval()
    cached = model.config["attention"] in ("softmax", "quiet")
    rows = []
    with torch.no_grad():
        for n in contexts:
            rows.append({"model": name, **time_context(model, n, cached)})
            print(rows[-1], flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="contexts 256 and 1k only")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the machine is shared; one thread also makes the timings comparable
    contexts = CONTEXTS[:2] if args.quick else CONTEXTS
    rows = [row for name in MODELS for row in measure(name, contexts)]
    print_table("decode ms per token after a context (1 thread, float32, batch 1)", rows,
                ["model", "context", "old_ms", "new_ms", "new/old"])
    path = write_json("decode", {"command": "python bench/decode.py" + (" --quick" if args.quick else ""),
                                 "cpu_flags": cpu_flags(), "threads": 1, "steps": STEPS, "rounds": ROUNDS,
                                 "decode": rows})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
