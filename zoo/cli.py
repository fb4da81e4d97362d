"""The `zoo` command: Lightning's CLI for fit/validate/test/predict, plus models, export, push, check, generate.

    zoo fit --config recipes/quickstart.yaml
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
import sys
from pathlib import Path

TOOLS = ("models", "export", "push", "check", "generate", "viz", "report")


def run_lightning(args: list[str], run: bool = True):
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
            parser.set_defaults({"export.command": "zoo " + " ".join(args)})

        def before_instantiate_classes(self):
            # A fixed checkpoint folder per run (not one per logger version), so that
            # `--ckpt_path last` finds the last checkpoint of the run it resumes.
            config = self.config[self.subcommand] if self.subcommand else self.config
            name = (config.model.get("init_args") or {}).get("model_name") if config.get("model") else None
            if name is not None:
                from zoo.registry import entry

                try:  # here, one line: inside instantiation jsonargparse would print an 80-line dump
                    entry(name)
                except (TypeError, ValueError) as error:
                    raise SystemExit(f"zoo {self.subcommand}: error: model.init_args.model_name: {error}") from None
            if "checkpoint" in config and config.checkpoint.dirpath is None:
                model = config.model.init_args
                run = Path(config.export.dirpath).name if config.export.dirpath else model.get("model_name", "run")
                root = config.trainer.default_root_dir or "runs"
                config.checkpoint.dirpath = str(Path(root) / "checkpoints" / run)

    return ZooCLI(
        L.LightningModule, L.LightningDataModule, trainer_class=Trainer,
        subclass_mode_model=True, subclass_mode_data=True,
        args=args,
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
    from zoo.release import is_release_folder
    from zoo.training.export import check_export_path, read_task

    ours, what = (is_onnx_folder, "ONNX export folder") if args.format == "onnx" else (is_release_folder,
                                                                                        "release folder")
    check_export_path(args.outdir, {"the model it exports": args.source}, args.overwrite, ours, what)
    if Path(args.source).is_file():
        model = read_task(args.source).model
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
    from zoo.training.check import check, shipped_folders

    folders = [Path(s) if Path(s).is_dir() else checkpoint_folder(s) for s in args.sources] or shipped_folders()
    rows = []
    for folder in folders:
        for row in check(folder, args.data_root):
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
    print(model.generate(args.prompt, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                         top_p=args.top_p, seed=args.seed))


# What a user can fix: said in one line, without a traceback.
USER_ERRORS = (ValueError, TypeError, FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError,
               PermissionError, ConnectionError, ImportError)  # ImportError: an optional extra not installed


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in TOOLS:
        from zoo.report import report_command
        from zoo.viz_command import viz_command

        commands = {"models": models_command, "export": export_command, "push": push_command,
                    "check": check_command, "generate": generate_command, "viz": viz_command,
                    "report": report_command}
        try:
            commands[argv[0]](argv[1:])
        except USER_ERRORS as error:
            raise SystemExit(f"zoo {argv[0]}: error: {error}") from None
    else:
        run_lightning(argv)


if __name__ == "__main__":
    main()
