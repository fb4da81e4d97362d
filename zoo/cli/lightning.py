"""`zoo fit | validate | test | predict`: Lightning's CLI with zoo's Trainer, recipes by name, one-line errors."""

from __future__ import annotations

import re
import sys
from pathlib import Path


def resolve_configs(args: list[str]) -> list[str]:
    """`args` with each `--config NAME` that names a packaged recipe replaced by its path, every recipe
    read once here (UTF-8, plain YAML, a mapping) so that a bad one is refused in one line; and a run
    whose recipes and arguments give no data at all is refused before anything is built."""
    from zoo.cli.recipes import read_recipe, resolve_recipe

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

    from zoo.release.callback import ExportRelease
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
            from zoo.training.runs import claim_run

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
