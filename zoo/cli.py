"""The `zoo` command: Lightning's CLI for fit/validate/test/predict, plus models, export and generate.

    zoo fit --config recipes/quickstart.yaml
    zoo models 'micro-*'
    zoo export runs/.../checkpoints/best.ckpt out/my-model [--config recipe.yaml]
    zoo generate micro-gpt-tiny.shakespeare --prompt "ROMEO:"
"""

from __future__ import annotations

import argparse
import sys

TOOLS = ("models", "export", "generate")


def run_lightning(args: list[str], run: bool = True):
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.cli import LightningCLI

    from zoo.training.export import ExportRelease

    class ZooCLI(LightningCLI):
        def add_arguments_to_parser(self, parser):
            parser.link_arguments("data.data_info", "model.init_args.data_info", apply_on="instantiate")
            parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
            parser.set_defaults({"checkpoint.monitor": "val/loss", "checkpoint.mode": "min",
                                 "checkpoint.save_last": True, "checkpoint.filename": "best"})
            parser.add_lightning_class_args(ExportRelease, "export")
            parser.set_defaults({"export.command": "zoo " + " ".join(args)})

    return ZooCLI(
        L.LightningModule, L.LightningDataModule,
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
    parser = argparse.ArgumentParser(prog="zoo export", description="A Lightning checkpoint to a release folder.")
    parser.add_argument("checkpoint")
    parser.add_argument("outdir")
    parser.add_argument("--config", help="the recipe it was trained with: measure test metrics for the card")
    args = parser.parse_args(argv)

    import torch
    from tqdm import tqdm

    from zoo.registry import entry
    from zoo.release import save_pretrained
    from zoo.training import ClassificationTask, LanguageModelTask
    from zoo.training.export import export, model_card

    steps = tqdm(total=3, desc="export", unit="step")
    hparams = torch.load(args.checkpoint, map_location="cpu", weights_only=True).get("hyper_parameters", {})
    if "model_name" not in hparams:
        raise SystemExit(f"{args.checkpoint} is not a zoo training checkpoint (no model_name in its hyperparameters)")
    task_cls = LanguageModelTask if entry(hparams["model_name"]).family == "text" else ClassificationTask
    task = task_cls.load_from_checkpoint(args.checkpoint, map_location="cpu")
    steps.update()
    if args.config:
        import yaml
        from jsonargparse import ArgumentParser
        from lightning import LightningDataModule

        data_cfg = yaml.safe_load(open(args.config))["data"]
        parser = ArgumentParser()
        parser.add_subclass_arguments(LightningDataModule, "data")
        datamodule = parser.instantiate_classes(parser.parse_object({"data": data_cfg})).data
        steps.update()
        path, metrics = export(task, datamodule, args.outdir, command=f"zoo fit --config {args.config}")
    else:
        steps.update()
        card = model_card(task.model, args.outdir.rstrip("/").split("/")[-1], {}, None, None, "unrecorded data")
        path, metrics = save_pretrained(task.model, args.outdir, card=card), {}
    steps.update()
    steps.close()
    print(f"exported {path}" + (f" with {metrics}" if metrics else ""))


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


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in TOOLS:
        {"models": models_command, "export": export_command, "generate": generate_command}[argv[0]](argv[1:])
    else:
        run_lightning(argv)


if __name__ == "__main__":
    main()
