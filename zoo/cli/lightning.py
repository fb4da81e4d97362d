"""`zoo fit | validate | test | predict`: Lightning's CLI with zoo's Trainer, recipes by name, one-line errors, and
output kept to what the user needs (zoo/utils/quiet.py; `--verbose` or ZOO_VERBOSE=1 for all of it)."""

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


VERBOSE_FLAG = "--verbose"
VERBOSE_HELP = ("zoo's own option: --verbose (or ZOO_VERBOSE=1) also prints what zoo leaves out by default: "
                "Lightning's tips and start-up lines that repeat or say nothing, and the deprecation warnings "
                "libraries raise about each other (zoo/utils/quiet.py lists them)")


def split_verbose(args: list[str]) -> tuple[list[str], bool]:
    """`args` without zoo's `--verbose` (Lightning's parser does not know it, and it must not reach the saved
    config.yaml), and whether it was there."""
    kept = [a for a in args if a != VERBOSE_FLAG]
    return kept, len(kept) != len(args)


def shown(path: str) -> str:
    """`path` as the user would type it: relative to the working folder when it lies under it."""
    absolute = Path(path).absolute()
    return str(absolute.relative_to(Path.cwd())) if absolute.is_relative_to(Path.cwd()) else str(path)


def run_lightning(args: list[str], run: bool = True):
    """`zoo fit | validate | test | predict ARGS` (`args` starts with the subcommand, as LightningCLI takes it):
    the LightningCLI object, after the run unless `run` is false."""
    from zoo.utils.quiet import quiet_output, verbose_requested

    args, verbose = split_verbose(args)
    # the whole command, Lightning's import included: importing it already warns (torch on torchao's enums)
    with quiet_output(not verbose_requested(verbose)):
        return _lightning_cli(args, run)


def _lightning_cli(args: list[str], run: bool):
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

        def _instantiate_trainer(self, config, callbacks):
            # zoo's checkpoint (`callbacks` holds it and the export) goes ahead of any ModelCheckpoint a recipe
            # adds under trainer.callbacks: Lightning's trainer.checkpoint_callback is the first one, and the
            # export, the run's folder lock and the closing line read it. Theirs without a folder write into the
            # run's, where `--ckpt_path last` looks (it takes the newest last.ckpt of them all).
            # Only the checkpoint moves: the export and every other callback keep Lightning's order, after theirs.
            theirs = config.get("callbacks") or []
            theirs = list(theirs) if isinstance(theirs, list) else [theirs]
            ours = [c for c in callbacks if isinstance(c, ModelCheckpoint)]
            for callback in theirs:
                if isinstance(callback, ModelCheckpoint) and callback.dirpath is None and ours:
                    callback.dirpath = ours[0].dirpath
            rest = [c for c in callbacks if not isinstance(c, ModelCheckpoint)]
            return super()._instantiate_trainer({**config, "callbacks": [*ours, *theirs, *rest]}, [])

        def after_fit(self):
            # where the run went: Lightning's own output never says, and `--ckpt_path`, `zoo export` and
            # TensorBoard need it
            trainer = self.trainer
            # log_dir broadcasts rank 0's folder: a collective every rank must join, or DDP hangs at the end
            log_dir = trainer.log_dir if trainer.loggers else None
            callback = trainer.checkpoint_callback
            if not trainer.is_global_zero or callback is None or not callback.dirpath:
                return
            best = callback.best_model_path
            score = callback.best_model_score
            said = f" ({callback.monitor} {float(score):.4g})" if best and score is not None else ""
            where = f"best {shown(best)}{said}" if best else f"in {shown(callback.dirpath)}"
            if callback.last_model_path:
                where += f", last {shown(callback.last_model_path)}"
            logs = f"; logs in {log_dir}" if log_dir else ""
            print(f"checkpoints: {where}{logs}")

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

    # jsonargparse knows the subclasses Python has loaded (for --help's lists and short names such as
    # `--data MNIST`); zoo.data and zoo.training load theirs lazily, so load them all here
    import zoo.data
    import zoo.training

    for package in (zoo.data, zoo.training):
        for name in package.__all__:
            getattr(package, name)

    command = "zoo " + " ".join(args)  # as the user typed it, recipe names and all
    # exit_on_error=False: jsonargparse raises instead of printing its usage (80 lines); main() says it in one
    no_exit = {"exit_on_error": False}
    # `args` is always given (it is sys.argv's own tail, or a test's list): Lightning's warning about
    # giving both is noise here
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
    subcommand_kwargs = {**no_exit, "epilog": VERBOSE_HELP}
    return ZooCLI(
        L.LightningModule, L.LightningDataModule, trainer_class=Trainer,
        subclass_mode_model=True, subclass_mode_data=True,
        args=resolve_configs(args),
        parser_kwargs={**no_exit, **{name: dict(subcommand_kwargs) for name in ("fit", "validate", "test", "predict")}},
        trainer_defaults={"default_root_dir": "runs"},
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,
        run=run,
    )
