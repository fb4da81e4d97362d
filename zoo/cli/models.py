"""`zoo models` and `zoo recipes`: what is registered and packaged."""

from __future__ import annotations

import argparse


def models_command(argv: list[str]) -> None:
    from zoo.models.registry import _entries, list_models, pretrained_tags

    parser = argparse.ArgumentParser(prog="zoo models", description="List the registered models.")
    parser.add_argument("pattern", nargs="?", default="*", help="shell-style wildcard, e.g. 'micro-*'")
    parser.add_argument("--pretrained", action="store_true", help="only models with shipped weights")
    args = parser.parse_args(argv)
    rows = []
    for name in list_models(args.pattern, pretrained=args.pretrained):
        e = _entries()[name]
        model = e.cls(**e.kwargs)
        params = sum(p.numel() for p in model.parameters())
        rows.append((name, e.family, e.attention, f"{params / 1e6:.2f}M", ", ".join(pretrained_tags(name)) or "-"))
    header = ("name", "family", "attention", "params", "pretrained")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())


def recipes_command(argv: list[str]) -> None:
    from zoo.cli.recipes import list_recipes

    parser = argparse.ArgumentParser(prog="zoo recipes", description="List the packaged recipes: `zoo fit --config "
                                                                     "NAME` trains one.")
    parser.add_argument("pattern", nargs="?", default="*", help="shell-style wildcard, e.g. '*.mnist'")
    args = parser.parse_args(argv)
    import fnmatch

    for name, path in list_recipes().items():
        if fnmatch.fnmatch(name, args.pattern):
            print(f"{name:36s} {path}")
