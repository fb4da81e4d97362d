"""The `zoo` command: Lightning's CLI for fit/validate/test/predict, plus models, export, push, check, generate.

    zoo fit --config quickstart            (a packaged recipe by name, or any recipe file)
    zoo recipes
    zoo models 'micro-*'
    zoo export runs/.../checkpoints/best.ckpt out/my-model [--config recipe.yaml]
    zoo export micro-vit-tiny.mnist out/micro-vit-onnx --format onnx
    zoo push checkpoints/micro-vit-tiny.mnist --repo my-org/micro-vit-tiny-mnist
    zoo check micro-vit-tiny.mnist --data-root ../shared/data
    zoo generate micro-gpt-tiny.shakespeare --prompt "ROMEO:"
    zoo viz micro-vit-tiny.mnist --out pictures/micro-vit --data-root ../shared/data
    zoo report --out report --data-root ../shared/data
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path


def resolve_configs(args: list[str]) -> list[str]:
    """`args` with each `--config NAME` that names a packaged recipe replaced by its path, every recipe
    read once here (UTF-8, plain YAML, a mapping) so that a bad one is refused in one line; and a run
    whose recipes and arguments give no data at all is refused before anything is built."""
    from zoo.training.recipes import read_recipe, resolve_recipe

    out, recipes = [], []
    i = 0
    while i < len(args):
        flag, value = args[i], None
        if flag in ("-c", "--config") and i + 1 < len(args):
            value, i = args[i + 1], i + 2
        elif flag.startswith("--config="):
            flag, value, i = "--config", flag.partition("=")[2], i + 1
        else:
            out.append(flag)
            i += 1
            continue
        path, note = resolve_recipe(value)
        if note:
            print(f"zoo: note: {note}", file=sys.stderr)
        recipes.append(read_recipe(path))
        out += [flag, str(path)]
    if recipes and out and out[0] in ("fit", "validate", "test", "predict") and not any("data" in r for r in recipes) \
            and not any(a == "--data" or a.startswith("--data.") or a.startswith("--data=") for a in out):
        raise ValueError("the recipe has no data: section and no --data was given; name a data module, e.g. "
                         "--data zoo.data.MNIST --data.init_args.root DATA")
    return out


def run_lightning(args: list[str], run: bool = True):
    import warnings

    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.cli import LightningCLI

    from zoo.training.export import ExportRelease
    from zoo.training.precision import Trainer

    class ZooCLI(LightningCLI):
        def add_arguments_to_parser(self, parser):
            parser.link_arguments("data.data_info", "model.init_args.data_info", apply_on="instantiate")
            parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
            parser.set_defaults({"checkpoint.monitor": "val/loss", "checkpoint.mode": "min",
                                 "checkpoint.save_last": True, "checkpoint.filename": "best"})
            parser.add_lightning_class_args(ExportRelease, "export")
            parser.set_defaults({"export.command": command})

        def before_fit(self):
            # the run's checkpoint folder and logger version, claimed before the loggers make their folders:
            # two runs started at once on one root never share them
            from zoo.training.export import claim_run

            claim_run(self.trainer)

        def _set_seed(self):
            seed = self._get(self.config, "seed_everything")
            if not isinstance(seed, bool) and seed is not None and not 0 <= seed < 2**32:
                raise ValueError(f"seed_everything must be between 0 and {2**32 - 1} (or true for a random seed), "
                                 f"got {seed}")
            super()._set_seed()

        def _parse_ckpt_path(self):
            # LightningCLI reads a local ckpt_path's hyperparameters itself: first say in one line what is not
            # a checkpoint zoo reads (zoo's Trainer reads the file again the same way, and refuses URLs)
            from zoo.training.checkpoint_io import read_checkpoint

            subcommand = self.config.get("subcommand")
            ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
            if ckpt_path and Path(ckpt_path).is_file():
                read_checkpoint(ckpt_path)
            super()._parse_ckpt_path()

        def before_instantiate_classes(self):
            # A fixed checkpoint folder per run (not one per logger version), so that
            # `--ckpt_path last` finds the last checkpoint of the run it resumes.
            config = self.config[self.subcommand] if self.subcommand else self.config
            name = (config.model.get("init_args") or {}).get("model_name") if config.get("model") else None
            if name is not None:
                from zoo.training.source import check_model_source

                try:  # here, one line: inside instantiation jsonargparse would print an 80-line dump
                    check_model_source(name)
                except (TypeError, ValueError, OSError) as error:
                    raise SystemExit(f"zoo {self.subcommand}: error: model.init_args.model_name: {error}") from None
            if "checkpoint" in config and config.checkpoint.dirpath is None:
                model = config.model.init_args
                # a model named by a checkpoint (hf-hub:org/repo, a folder) gives a plain folder name
                source = model.get("model_name") or "run"
                run = Path(config.export.dirpath).name if config.export.dirpath else \
                    re.sub(r"[^\w.-]+", "-", source.removeprefix("hf-hub:")).strip("-.") or "run"
                root = config.trainer.default_root_dir or "runs"
                config.checkpoint.dirpath = str(Path(root) / "checkpoints" / run)

    command = "zoo " + " ".join(args)  # as the user typed it, recipe names and all
    # exit_on_error=False: jsonargparse raises instead of printing its usage (80 lines); main() says it in one
    no_exit = {"exit_on_error": False}
    # `args` is always given (it is sys.argv's own tail, or a test's list): Lightning's warning about
    # giving both is noise here
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
    return ZooCLI(
        L.LightningModule, L.LightningDataModule, trainer_class=Trainer,
        subclass_mode_model=True, subclass_mode_data=True,
        args=resolve_configs(args),
        parser_kwargs={**no_exit, **{name: dict(no_exit) for name in ("fit", "validate", "test", "predict")}},
        trainer_defaults={"default_root_dir": "runs"},
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,
        run=run,
    )


def models_command(argv: list[str]) -> None:
    from zoo.registry import _entries, list_models
    from zoo.release import pretrained_tags

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
    from zoo.training.recipes import list_recipes

    parser = argparse.ArgumentParser(prog="zoo recipes", description="List the packaged recipes: `zoo fit --config "
                                                                     "NAME` trains one.")
    parser.add_argument("pattern", nargs="?", default="*", help="shell-style wildcard, e.g. '*.mnist'")
    args = parser.parse_args(argv)
    import fnmatch

    for name, path in list_recipes().items():
        if fnmatch.fnmatch(name, args.pattern):
            print(f"{name:36s} {path}")


def build_kernels_command(argv: list[str]) -> None:
    argparse.ArgumentParser(
        prog="zoo build-kernels", description="Build zoo's compiled CPU kernels (softmax_one, MicroAttention's and "
        "ELiTA's scans) now, once per installed copy and torch version, rather than on first use. They are cached "
        "under TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions).").parse_args(argv)
    import time

    from zoo.attention import native

    if os.environ.get("ZOO_NATIVE", "1") == "0":
        raise ValueError("ZOO_NATIVE=0 turns the kernels off; unset it to build them")
    started = time.time()
    if native.load() is None:
        raise OSError("the kernels could not be built (the warning above says why); zoo runs the same numbers on "
                      "its eager routes")
    print(f"zoo's CPU kernels are ready in {native.build_folder()} ({time.time() - started:.0f} s)")


def export_command(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="zoo export", description="A Lightning checkpoint, or any model zoo.load reads, to a release "
                                       "folder (safetensors, config.json, card) or to ONNX graphs checked in ONNX "
                                       "Runtime.")
    parser.add_argument("source", help="a Lightning checkpoint (.ckpt), or a name[.tag], a release folder or "
                                       "hf-hub:org/repo")
    parser.add_argument("outdir")
    parser.add_argument("--format", choices=("release", "onnx"), default="release",
                        help="release: a release folder (default); onnx: model.onnx (and prefill.onnx and "
                             "step.onnx for text models), checked against PyTorch in ONNX Runtime")
    parser.add_argument("--config", help="the recipe a checkpoint was trained with: measure test metrics for the "
                                         "card")
    parser.add_argument("--overwrite", action="store_true", help="replace OUTDIR if it already holds a folder of "
                                                                 "the same format (anything else is never replaced)")
    args = parser.parse_args(argv)

    looks_like_a_path = "/" in args.source or args.source.endswith(".ckpt")
    if looks_like_a_path and not args.source.startswith("hf-hub:") and not Path(args.source).exists():
        raise FileNotFoundError(f"no checkpoint file at {args.source} (nor a release folder)")
    if args.format == "release" and Path(args.source).is_file():
        from zoo.training.export import export_checkpoint

        path, metrics = export_checkpoint(args.source, args.outdir, args.config, overwrite=args.overwrite)
        print(f"exported {path}" + (f" with {metrics}" if metrics else ""))
        return
    if args.config:
        raise ValueError("--config measures a checkpoint's metrics for a release folder's card; it has no use here")
    from zoo.onnx_export import export_onnx, is_onnx_folder
    from zoo.release import checkpoint_folder, is_release_folder
    from zoo.training.export import check_export_path, read_task, refuse_nonfinite

    ours, what = (is_onnx_folder, "ONNX export folder") if args.format == "onnx" else (is_release_folder,
                                                                                        "release folder")
    source = None  # the file or folder the model is read from (none for the Hub: its cache is not the user's)
    if not args.source.startswith("hf-hub:"):
        source = Path(args.source) if Path(args.source).exists() else checkpoint_folder(args.source)
    check_export_path(args.outdir, {"the model it exports": source}, args.overwrite, ours, what)
    if source is not None and source.is_dir() and Path(os.path.realpath(source)) in Path(
            os.path.realpath(args.outdir)).parents:
        raise ValueError(f"the export folder {args.outdir} lies inside the release folder it exports ({source}); "
                         "choose a folder outside it")
    if Path(args.source).is_file():
        model = read_task(args.source).model
        refuse_nonfinite(model, args.source)
    else:
        import zoo

        model = zoo.load(args.source)
    if args.format == "release":
        print(f"exported {model.save_pretrained(args.outdir, overwrite=args.overwrite)}")
        return
    path, diffs = export_onnx(model, args.outdir, overwrite=args.overwrite, source=args.source)
    checks = ", ".join(f"{name} {diff:.2e}" for name, diff in diffs.items())
    print(f"exported {path}: largest absolute difference from PyTorch in ONNX Runtime: {checks}")


def push_command(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="zoo push", description="Upload a release folder to the Hugging Face Hub (token from huggingface_hub's "
                                     "usual places: HF_TOKEN or `hf auth login`).")
    parser.add_argument("source", help="a release folder, a registered name with weights (name.tag) or a .ckpt")
    parser.add_argument("--repo", required=True, help="the Hub repository, org/name")
    parser.add_argument("--private", action="store_true", help="create the repository private")
    parser.add_argument("--revision", help="the branch to commit to (created when missing); default main")
    parser.add_argument("--config", help="for a .ckpt: the recipe it was trained with, to measure metrics")
    args = parser.parse_args(argv)

    from zoo.hub import push

    url = push(args.source, args.repo, private=args.private, revision=args.revision, config=args.config)
    print(f"pushed {args.source} to {url}")


def check_command(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="zoo check", description="Measure shipped (or any) release folders again and compare with their cards.")
    parser.add_argument("sources", nargs="*", help="names with tags (micro-vit-tiny.mnist) or folders; default: all "
                                                   "shipped checkpoints")
    parser.add_argument("--data-root", default=os.environ.get("ZOO_DATA", "data"),
                        help="the folder that holds the data sets (default: $ZOO_DATA, else ./data)")
    parser.add_argument("--json", help="also write the table here")
    args = parser.parse_args(argv)

    from zoo.release import checkpoint_folder
    from zoo.training.check import check, check_table_path, prepared_data, shipped_folders

    folders = [Path(s) if Path(s).is_dir() else checkpoint_folder(s) for s in args.sources] or shipped_folders()
    if args.json:
        check_table_path(args.json, folders)
    prepared = [prepared_data(folder, args.data_root) for folder in folders]  # every data set there, before work
    rows = []
    for folder, data in zip(folders, prepared):
        for row in check(folder, args.data_root, data):
            rows.append({"release": folder.name, **row})
            print(f"{folder.name:34s} {row['metric']:14s} card {row['card']:<9} measured {row['measured']:<9} "
                  f"diff {row['diff_points']:.3f} points  {'ok' if row['ok'] else 'MISMATCH'}", flush=True)
    if args.json:
        from zoo.release import write_json_atomic

        write_json_atomic(args.json, rows)
    bad = [r for r in rows if not r["ok"]]
    if bad:
        raise SystemExit(f"{len(bad)} metric(s) differ from their card by more than the tolerance")


def generate_command(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="zoo generate", description="Sample text from a language model.")
    parser.add_argument("source", help="a registered name with weights (name.tag), a release folder or hf-hub:...")
    parser.add_argument("--prompt", default="\n")
    parser.add_argument("--max-new-tokens", type=int, default=300)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)

    import zoo

    model = zoo.load(args.source)
    if not callable(getattr(model, "generate", None)):
        raise ValueError(f"{args.source} ({type(model).__name__}) does not generate text; zoo generate "
                         "takes a language model (`zoo models '*gpt*' --pretrained` lists them)")
    print(model.generate(args.prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                         top_p=args.top_p, seed=args.seed))


LIGHTNING = {"fit": "train a model from a recipe (Lightning's CLI; --help lists every option)",
             "validate": "measure a checkpoint on a recipe's validation split",
             "test": "measure a checkpoint on a recipe's test split",
             "predict": "run a checkpoint over a recipe's predict data"}
HELP = {**LIGHTNING,
        "models": "list the registered models (a wildcard selects some)",
        "recipes": "list the packaged recipes that --config accepts by name",
        "export": "write a checkpoint or model as a release folder or ONNX graphs",
        "push": "upload a release folder to the Hugging Face Hub",
        "check": "measure release folders again and compare them with their cards",
        "generate": "sample text from a language model",
        "evaluate": "loss, perplexity and bits per byte of a language model on any text file",
        "viz": "draw a model's attention and activations for an input",
        "report": "build the HTML report page of checkpoints and benchmarks",
        "leaderboard": "train several models with one recipe, several seeds each, and print the table",
        "build-kernels": "build the compiled CPU kernels now, rather than on first use"}


def usage() -> str:
    width = max(map(len, HELP))
    rows = "\n".join(f"  {name.ljust(width)}  {text}" for name, text in HELP.items())
    return (f"usage: zoo COMMAND [options]   (zoo COMMAND --help for a command's options)\n\n"
            f"A PyTorch Lightning model zoo of lightweight attention mechanisms.\n\ncommands:\n{rows}\n\n"
            "options:\n  --version  print the version and exit\n"
            "  --debug    show the traceback of an error (or set ZOO_DEBUG=1)\n")


def version() -> str:
    import zoo

    return f"attention-zoo {zoo.__version__} (import name zoo)"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    ours = argv[: argv.index("--")] if "--" in argv else argv  # what follows `--` is passed on untouched
    debug = "--debug" in ours or os.environ.get("ZOO_DEBUG", "") not in ("", "0")
    argv = [a for a in ours if a != "--debug"] + argv[len(ours):]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage(), end="")
        return
    if argv[0] in ("-V", "--version"):
        print(version())
        return
    command = argv[0]
    if command not in HELP:
        import difflib

        close = difflib.get_close_matches(command, list(HELP), n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else ""
        raise SystemExit(f"zoo: error: unknown command {command!r}{hint} (zoo --help lists them)")
    from zoo.cli_errors import expected_errors, one_line

    try:
        if command in LIGHTNING:
            run_lightning(argv)
        else:
            from zoo.cli_evaluate import evaluate_command
            from zoo.cli_leaderboard import leaderboard_command
            from zoo.report import report_command
            from zoo.viz_command import viz_command

            commands = {"models": models_command, "recipes": recipes_command, "export": export_command,
                        "push": push_command, "check": check_command, "generate": generate_command,
                        "viz": viz_command, "report": report_command, "leaderboard": leaderboard_command,
                        "evaluate": evaluate_command,
                        "build-kernels": build_kernels_command}
            commands[command](argv[1:])
    except KeyboardInterrupt:
        raise SystemExit(f"zoo {command}: interrupted") from None
    except Exception as error:
        if debug or not isinstance(error, expected_errors()):
            raise
        raise SystemExit(f"zoo {command}: error: {one_line(error)}") from None


if __name__ == "__main__":
    main()
