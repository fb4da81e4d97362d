"""`zoo evaluate SOURCE FILE`: loss, perplexity and bits per byte of a text file under a language model."""

from __future__ import annotations

import argparse
from pathlib import Path


def evaluate_command(argv: list[str]) -> None:
    from zoo.training.evaluate import SPLITS

    parser = argparse.ArgumentParser(
        prog="zoo evaluate", description="Score a UTF-8 text file under a language model, encoded with the model's "
                                         "own tokenizer, in non-overlapping windows of its context: loss (nats per "
                                         "token), perplexity and bits per byte.")
    parser.add_argument("source", help="a language model: name.tag, a release folder or hf-hub:org/repo")
    parser.add_argument("file", help="a UTF-8 text file (a regular file of at most 1 GiB)")
    parser.add_argument("--split", choices=SPLITS, default="all",
                        help="all: the whole file (default); train / validation: its first 90%% / last 10%% of "
                             "characters, as CharText splits it")
    parser.add_argument("--context-length", type=int, default=None, help="the window (default: the model's context)")
    parser.add_argument("--batch-size", type=int, default=16, help="windows per forward pass")
    parser.add_argument("--json", help="also write the result here (a JSON object)")
    args = parser.parse_args(argv)

    if args.json:  # before the work, not after it
        from zoo.release.check import json_output_path

        json_output_path(args.json, _is_evaluation, "zoo evaluate", "a zoo evaluate result")
    from zoo.training.evaluate import evaluate_text

    result = evaluate_text(args.source, args.file, context_length=args.context_length, batch_size=args.batch_size,
                           split=args.split)
    print(f"{result['source']} on {result['file']} ({result['split']}, {result['tokens']:,} tokens predicted in "
          f"{result['windows']} windows of {result['context_length']}; tokenizer: {result['tokenizer']}): "
          f"loss {result['loss']:.4f}, perplexity {result['perplexity']:.2f}, "
          f"bits per byte {result['bits_per_byte']:.4f}")
    if args.json:
        from zoo.utils.atomic import write_json_atomic

        write_json_atomic(args.json, result)


def _is_evaluation(path) -> bool:
    """Whether the file holds what `zoo evaluate --json` writes."""
    import json

    try:
        result = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(result, dict) and {"loss", "perplexity", "bits_per_byte"} <= result.keys()
