"""`zoo generate`: text from a language model."""

from __future__ import annotations

import argparse

SEPARATOR = "-" * 40  # between two prompts' continuations


def generate_command(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="zoo generate", description="Sample text from a language model.")
    parser.add_argument("source", help="a registered name with weights (name.tag), a release folder or hf-hub:...")
    parser.add_argument("--prompt", action="append",
                        help="the text to continue (default: a newline); repeat it to continue several prompts in "
                             "one batch, printed in the order given with a line of dashes between two")
    parser.add_argument("--max-new-tokens", type=int, default=300)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)

    from zoo.models.pretrained import load

    model = load(args.source)
    if not callable(getattr(model, "generate", None)):
        raise ValueError(f"{args.source} ({type(model).__name__}) does not generate text; zoo generate "
                         "takes a language model (`zoo models '*gpt*' --pretrained` lists them)")
    prompts = args.prompt or ["\n"]  # not the argument's default: "append" would add to it
    texts = model.generate(prompts if len(prompts) > 1 else prompts[0], args.max_new_tokens,
                           temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    # continuations hold blank lines of their own: only a line of dashes tells where the next begins
    print(f"\n{SEPARATOR}\n".join(texts) if len(prompts) > 1 else texts)
