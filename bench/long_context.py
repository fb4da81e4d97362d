"""Do the War and Peace checkpoints use their context, and keep it beyond their training length?

    python bench/long_context.py                          # every War and Peace release in checkpoints/
    python bench/long_context.py --long 65536 131072      # also stretches this long (models without
                                                          # learned positions only; ELiTA's write-up claims "100K+")
    python bench/long_context.py --reach 128 1024 4096    # how far back each release reads (below)
    python bench/long_context.py --table                  # the table from bench/results/long_context.json
    python bench/long_context.py --text stdlib            # every standard-library release (*.stdlib), scored
                                                          # on its held-out end into long_context_stdlib.json

Each release is scored on the held-out end of War and Peace (its last 10%, the split its recipe trained
beside), cut into consecutive windows of its context C and, where its positions allow, of 4C and of the
--long lengths. The loss of every window is averaged by token position, and reported over ranges:
[0, 64), the first tokens, which see little context; [C/2, C), the second half of the training context;
[C, 2C) and [2C, 4C), beyond it; and powers of two further on. The two targets are printed beside,
and n-gram models counted on the training split as references (a 2-gram model reads one character back):

    uses its context:  loss[C/2, C) <= loss[0, 64) - 0.15       (in windows of C)
    keeps it at 4x:    loss[2C, 4C) <= loss[C/2, C) + 0.05      (in windows of 4C)

The second compares different passages of the text: with few windows of 4C (at C = 16,384 the held-out end
holds four) a harder passage at [2C, 4C) reads as a failure to keep the context. So the record also scores
the very characters [2C, 4C) of each 4C window the way [C/2, C) is scored, each in the second half of a
window of C, and gives the rise on the same text: loss[2C, 4C) minus that loss.

--reach asks how far back a release reads: the characters at [C/2, C) of each window of C, read again in
the second halves of windows of each length L (so with L/2 to L characters before them). Where the loss
stops falling as L grows, the characters further back no longer change a prediction.

A model with learned positions has none beyond C: it is scored at C only, and its record says so.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RESULTS, locked, machine, nothing_to_show, print_table, read_runs  # noqa: E402
from zoo.data.sequences import STDLIB, LongContextText  # noqa: E402
from zoo.utils.atomic import write_text_atomic  # noqa: E402

OUT = RESULTS / "long_context.json"
OUT_STDLIB = RESULTS / "long_context_stdlib.json"  # --text stdlib's, so that each file holds one text's rows
ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("ZOO_DATA", ROOT.parent / "shared" / "data"))
TEXT = DATA / "warpeace" / "warpeace_input.txt"
USES, KEEPS = 0.15, 0.05  # the margins: it uses its context, it keeps it
FIRST = 64  # "the first 64 positions"


def ngram_loss(train: torch.Tensor, test: torch.Tensor, order: int, vocab: int, alpha: float = 0.1) -> float:
    """The held-out loss (nats per token) of an n-gram model counted on `train` with add-alpha smoothing:
    p(t | the order-1 tokens before it) = (count(context, t) + alpha) / (count(context) + vocab * alpha).
    A reference row for the table: what a model that reads only the last order-1 characters can reach."""
    def joint(tokens):  # each position's context and next token as one integer, base vocab
        code = torch.zeros(len(tokens) - order + 1, dtype=torch.long)
        for k in range(order):
            code = code * vocab + tokens[k: len(tokens) - order + 1 + k]
        return code

    train_joint, test_joint = joint(train), joint(test)
    keys, counts = train_joint.unique(return_counts=True)
    context_keys, context_counts = (train_joint // vocab).unique(return_counts=True)

    def lookup(table, values, query):
        at = torch.searchsorted(table, query).clamp(max=len(table) - 1)
        return torch.where(table[at] == query, values[at], 0).double()

    p = (lookup(keys, counts, test_joint) + alpha) / (lookup(context_keys, context_counts, test_joint // vocab)
                                                      + vocab * alpha)
    return float(-p.log().mean())


def ranges(context: int, length: int) -> list[tuple[int, int]]:
    """[0, 64), [C/2, C), then doubling ranges [C, 2C), [2C, 4C), ... up to `length`."""
    spans, low = [(0, FIRST), (context // 2, context)], context
    while low < length:
        spans.append((low, min(2 * low, length)))
        low *= 2
    return spans


@torch.inference_mode()
def loss_by_position(model, tokens: torch.Tensor, length: int) -> tuple[torch.Tensor, int]:
    """The mean next-token loss at each position 0..length-1 over consecutive windows of `length` tokens
    (float64), and how many windows there were."""
    windows = (len(tokens) - 1) // length
    if windows == 0:
        raise ValueError(f"the held-out text has {len(tokens):,} tokens, fewer than one window of {length:,}")
    total = torch.zeros(length, dtype=torch.float64)
    for w in range(windows):
        chunk = tokens[w * length: w * length + length + 1]
        x, y = chunk[:-1][None], chunk[1:]
        logits = model(x)[0].float()
        total += F.cross_entropy(logits, y, reduction="none").double()
    return total / windows, windows


@torch.inference_mode()
def loss_in_second_halves(model, tokens: torch.Tensor, length: int, spans: list[tuple[int, int]]) -> float:
    """The mean next-token loss of the targets tokens[start + 1: stop + 1] for each (start, stop) span,
    each scored in the second half of a window of `length` tokens (windows overlapping by half), so that
    every target sees length/2 to length tokens back, as positions [length/2, length) of a window do."""
    half = length // 2
    total, count = 0.0, 0
    for start, stop in spans:
        if start < half:
            raise ValueError(f"a span from token {start:,} has fewer than the {half:,} tokens before it that a "
                             f"window of {length:,} reads")
        for begin in range(start - half, stop - half, half):
            chunk = tokens[begin: min(begin + length, stop) + 1]  # causal: what follows stop changes nothing
            logits = model(chunk[:-1][None])[0, half:].float()
            total += float(F.cross_entropy(logits, chunk[half + 1:], reduction="sum").double())
            count += len(chunk) - 1 - half
    return total / count


def score(folder: Path, data, long: list[int], reach: list[int] = ()) -> dict:
    """One release's record: its loss by position on the held-out tokens of `data` (a LongContextText)."""
    import zoo

    model = zoo.load(str(folder)).eval()
    if getattr(model, "tokenizer", None) is None:  # an image model, or a text model without characters
        raise ValueError(f"{folder} is not a character-level language model ({type(model).__name__} without "
                         "a tokenizer): give a release of a character-level text recipe "
                         "(recipes/*.warpeace.yaml, recipes/*.stdlib.yaml)")
    if model.tokenizer.to_dict() != data.tokenizer.to_dict():
        raise ValueError(f"{folder} was not trained on the characters of {data.source}: its tokenizer differs "
                         "from the text's (pass the text it was trained on with --text)")
    context = model.context_length
    tokens = data.val_tokens
    learned = getattr(model, "pos_kind", None) == "learned"
    lengths = [context] + ([] if learned else [4 * context] + [n for n in long if n > 4 * context])
    record = {"context": context, "positions": model.config.get("pos_embed"),
              "attention": model.config.get("attention"), "attention_options": model.config.get("attention_options"),
              "held_out_tokens": len(tokens), "by_length": {},
              "not_tested": "learned positions: none beyond the context" if learned else None}
    for length in lengths:
        start = time.perf_counter()
        losses, windows = loss_by_position(model, tokens, length)
        record["by_length"][str(length)] = {
            "windows": windows, "seconds": round(time.perf_counter() - start, 1),
            "loss": {f"{lo}-{hi}": round(float(losses[lo:hi].mean()), 4) for lo, hi in ranges(context, length)}}
    at = record["by_length"]
    c = at[str(context)]["loss"]
    first, second_half = c[f"0-{FIRST}"], c[f"{context // 2}-{context}"]
    record["uses_context"] = {"gain": round(first - second_half, 4), "met": first - second_half >= USES}
    if str(4 * context) in at:
        w = at[str(4 * context)]["loss"]
        late = w[f"{2 * context}-{4 * context}"]
        rise = late - w[f"{context // 2}-{context}"]
        # the same characters as [2C, 4C) of each 4C window, each read with C/2 to C tokens back
        spans = [(k * 4 * context + 2 * context, (k + 1) * 4 * context) for k in range(at[str(4 * context)]["windows"])]
        same_text = loss_in_second_halves(model, tokens, context, spans)
        record["keeps_context_at_4x"] = {"rise": round(rise, 4), "met": rise <= KEEPS,
                                         "same_text": {"loss": round(same_text, 4), "rise": round(late - same_text, 4)}}
    if reach:  # the characters [C/2, C) of each window of C, read with L/2 to L characters before them
        too_long = [n for n in reach if n > context and learned]
        if too_long:
            raise ValueError(f"--reach {too_long[0]}: {folder.name} has learned positions, none beyond its "
                             f"context of {context}")
        windows = at[str(context)]["windows"]  # those with max(reach) / 2 tokens before: one text for every L
        spans = [(k * context + context // 2, (k + 1) * context) for k in range(windows)
                 if k * context + context // 2 >= max(reach) // 2]
        if not spans:
            raise ValueError(f"--reach {max(reach)}: the held-out text has no window of {context} with "
                             f"{max(reach) // 2:,} tokens before its second half")
        record["reach"] = {"span": f"{context // 2}-{context}", "windows": len(spans), "loss": {
            str(n): round(loss_in_second_halves(model, tokens, n, spans), 4) for n in sorted(reach)}}
    return record


def table(results: dict) -> None:
    rows = []
    for name, r in results["runs"].items():
        for length, entry in r["by_length"].items():
            row = {"release": name, "windows of": int(length), "windows": entry["windows"]}
            row.update({f"loss {k}": v for k, v in entry["loss"].items()})
            rows.append(row)
        uses = r["uses_context"]
        rows[-1]["uses context (gain >= 0.15)"] = f"{uses['gain']:+.3f} {'met' if uses['met'] else 'NOT met'}"
        if "keeps_context_at_4x" in r:
            k = r["keeps_context_at_4x"]
            rows[-1]["keeps it at 4x (rise <= 0.05)"] = f"{k['rise']:+.3f} {'met' if k['met'] else 'NOT met'}"
            if "same_text" in k:  # records written before the control have none
                rows[-1]["rise on the same text"] = f"{k['same_text']['rise']:+.3f}"
        elif r.get("not_tested"):
            rows[-1]["keeps it at 4x (rise <= 0.05)"] = "not tested: learned positions"
    title = "the standard library" if results.get("baselines", {}).get("text") == STDLIB else "War and Peace"
    print_table(f"{title}, held-out end: mean loss (nats per character) by token position", rows)
    reach = [{"release": name, "characters": r["reach"]["span"], "windows": r["reach"]["windows"],
              **{f"read with {int(n) // 2}-{n} back": v for n, v in r["reach"]["loss"].items()}}
             for name, r in results["runs"].items() if r.get("reach")]
    if reach:
        print_table("How far back each release reads: the same characters with more before them", reach)
    if results.get("baselines"):
        print("n-gram references on the same held-out text (counted on the training split, add-0.1 smoothing): "
              + ", ".join(f"{k} {v}" for k, v in results["baselines"]["loss"].items()))


def window(text: str) -> int:
    """A --long length: a whole number of tokens, at least 1."""
    try:
        length = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of tokens, got {text!r}") from None
    if length < 1:
        raise argparse.ArgumentTypeError(f"expected a window of at least 1 token, got {length}")
    return length


def reach_window(text: str) -> int:
    """A --reach length: an even number of tokens, at least 2 (its second half is what is scored)."""
    length = window(text)
    if length % 2:
        raise argparse.ArgumentTypeError(f"expected an even number of tokens, got {length}")
    return length


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--releases", nargs="+", default=None,
                        help="release folders (default: every checkpoints/*.warpeace* release; *.stdlib* ones "
                             "with --text stdlib)")
    parser.add_argument("--long", nargs="*", type=window, default=[], help="longer windows to score, in tokens")
    parser.add_argument("--reach", nargs="*", type=reach_window, default=[],
                        help="window lengths (even) to read each release's [C/2, C) characters again with")
    parser.add_argument("--text", default=str(TEXT),
                        help=f"the text the releases trained on: War and Peace (default, under $ZOO_DATA), "
                             f"another file, or {STDLIB!r}, the Python standard library's source")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"default bench/results/{OUT.name} ({OUT_STDLIB.name} with --text {STDLIB})")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--table", action="store_true", help="print the table from --out, run nothing")
    args = parser.parse_args(argv)
    stdlib = args.text == STDLIB
    if args.out is None:
        args.out = OUT_STDLIB if stdlib else OUT
    try:  # before anything is scored: a file that is not this bench's is refused, not overwritten
        results = read_runs(args.out)
    except (OSError, ValueError) as e:
        raise SystemExit(f"bench/long_context.py: error: {e}") from None
    if args.table and not results["runs"]:
        raise SystemExit(f"bench/long_context.py: error: {nothing_to_show(args.out)}")
    if not args.table:
        if args.threads:
            torch.set_num_threads(args.threads)
        kind = "stdlib" if stdlib else "warpeace"
        folders = [Path(f) for f in args.releases] if args.releases else sorted(
            f.parent for f in (ROOT / "checkpoints").glob(f"*.{kind}*/config.json"))
        if not folders:
            raise SystemExit(f"bench/long_context.py: error: no {'standard-library' if stdlib else 'War and Peace'} "
                             f"release found in checkpoints/: train one (recipes/*.{kind}.yaml) or pass --releases")
        if not stdlib and not Path(args.text).is_file():
            raise SystemExit(f"bench/long_context.py: error: War and Peace not found at {args.text}: set ZOO_DATA "
                             f"or --text (a file, or {STDLIB})")
        try:  # the split the recipes trained beside, read as they read it
            data = LongContextText(args.text, context_length=FIRST)
            vocab = data.tokenizer.vocab_size
            baselines = {f"{n}-gram": round(ngram_loss(data.train_tokens, data.val_tokens, n, vocab), 4)
                         for n in (1, 2, 3)}
            command = "python bench/long_context.py " + " ".join(argv or sys.argv[1:])
            for folder in folders:
                print(f"{folder.name} ...", flush=True)
                record = score(folder, data, args.long, args.reach)
                record["command"] = command
                with locked(args.out.stem):
                    results = read_runs(args.out)
                    results["runs"][folder.name] = record
                    text = STDLIB if stdlib else Path(args.text).name
                    results["baselines"] = {"text": text, "add_alpha": 0.1, "loss": baselines}
                    results.update({"command": command, "machine": machine()})
                    write_text_atomic(args.out, json.dumps(results, indent=2))
        except (OSError, ValueError, TypeError) as e:  # a folder or text that is not what it should be: one line
            raise SystemExit(f"bench/long_context.py: error: {e}") from None
    table(results)


if __name__ == "__main__":
    main()
