"""Turn a trained task into a release folder whose model card carries its measured metrics."""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
from pathlib import Path

import lightning as L
import torch

from zoo.atomic import check_parents, check_replaceable, check_writable_folder, lock_name, locked, open_lock
from zoo.card import parse_target
from zoo.release import is_release_folder, save_pretrained


def export(task: L.LightningModule, datamodule, outdir, command: str | None = None,
           seconds: float | None = None, run: dict | None = None, overwrite: bool = True) -> tuple[Path, dict]:
    """Evaluate `task` on the data's test split and write its model as a release folder.

    run: what the card should say about training (epochs, steps, precision); it is kept in
    config.json beside the metrics, so that the card can be written again from the folder.
    """
    refuse_nonfinite(task.model, "the model")
    datamodule.setup("test")
    metrics = task.evaluate(datamodule.test_dataloader())
    data = datamodule.describe() if hasattr(datamodule, "describe") else {"name": type(datamodule).__name__}
    training = {"command": command, "seconds": seconds, "threads": torch.get_num_threads(),
                "machine": platform.machine(), "data": data, **(run or {})}
    path = save_pretrained(task.model, outdir, extra={"metrics": metrics, "training": training}, overwrite=overwrite)
    return path, metrics


class ExportRelease(L.Callback):
    """At the end of fit, load the best checkpoint and export it (with test metrics) to `dirpath`."""

    def __init__(self, dirpath: str | None = None, command: str | None = None, push_to: str | None = None,
                 private: bool = False, target: str | None = None):
        """push_to: a Hub repository (org/name) to upload the exported folder to with `zoo.hub.push`.
        target: what the run set out to reach, "METRIC >= VALUE (where it comes from)"; the card says
        whether the measured metric met it.
        """
        if target is not None:
            parse_target(target)  # fail before training, not after
        self.dirpath, self.command, self.push_to, self.private, self.target = dirpath, command, push_to, private, target
        self.started = None

    def setup(self, trainer, pl_module, stage):
        if self.dirpath and stage == "fit":
            check_export_path(self.dirpath, {
                "trainer.default_root_dir": trainer.default_root_dir,
                "the checkpoint folder": getattr(trainer.checkpoint_callback, "dirpath", None),
                "the log folder": trainer.log_dir,
            })
        if self.push_to and not self.dirpath:
            raise ValueError("export.push_to needs export.dirpath: the folder to write and then upload")
        if self.push_to:
            from zoo.hub import check_hub, validate_repo_id

            validate_repo_id(self.push_to)  # fail before training, not after
            if stage == "fit":  # the Hub answers and takes the token now, not only after training
                check_hub(what=f"export.push_to {self.push_to}")
        if stage == "fit":
            claim_run(trainer)

    def on_fit_start(self, trainer, pl_module):
        self.started = time.time()

    def teardown(self, trainer, pl_module, stage):
        if stage == "fit":
            release_run(trainer)

    def on_fit_end(self, trainer, pl_module):
        if not self.dirpath or not trainer.is_global_zero:
            return
        seconds = time.time() - self.started if self.started else None
        callback = trainer.checkpoint_callback
        best = callback.best_model_path if callback else ""
        if best:
            state = torch.load(best, map_location=pl_module.device, weights_only=True)["state_dict"]
            pl_module.load_state_dict(state)
        run = {"epochs": trainer.current_epoch, "steps": trainer.global_step, "precision": str(trainer.precision),
               "precision_reason": getattr(trainer, "precision_reason", None), "target": self.target}
        if best:
            run["selected_by"] = f"{callback.monitor} ({callback.mode})"
            run["best_score"] = float(callback.best_model_score) if callback.best_model_score is not None else None
        path, metrics = export(pl_module, trainer.datamodule, self.dirpath, self.command, seconds, run)
        print(f"exported {path} with {metrics}")
        if self.push_to:
            from zoo.hub import push

            print(f"pushed to {push(path, self.push_to, private=self.private)}")


def check_export_path(outdir, keep: dict[str, str | None], overwrite: bool = True, ours=is_release_folder,
                      what: str = "release folder") -> None:
    """Refuse, before any work, an export folder that is, or holds, what the run or the export reads or
    writes (`keep`: what -> path), anything else that is not a folder of that kind (`ours`), and a path
    that cannot be written (a link, a file on the way, a folder this user cannot write)."""
    if Path(outdir).is_symlink():  # a loop too, which realpath below would not report
        check_replaceable(outdir, ours, what, overwrite)
    out = Path(os.path.realpath(outdir))
    for kept, other in keep.items():
        if other is None:
            continue
        other = Path(os.path.realpath(other))
        if out == other or out in other.parents:  # replacing `out` would take `other` with it
            raise ValueError(f"the export folder {outdir} overlaps {kept} ({other}): writing the export there "
                             "would replace what the run keeps; choose a separate export folder")
    check_replaceable(outdir, ours, what, overwrite)
    check_parents(outdir, "the export folder")


def refuse_nonfinite(model: torch.nn.Module, source) -> None:
    """Refuse, naming the tensor, a model with a NaN or infinite weight: its release would never load."""
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise ValueError(f"{source}: tensor {name!r} holds NaN or inf (a diverged or damaged checkpoint); "
                             "nothing was exported")


def claim_run(trainer) -> None:
    """Before a fit writes anything: hold its checkpoint folder for as long as it runs (a second run on the
    same folder is refused at once, naming the first), and give each logger that has no version yet the
    next free one, chosen under a lock and made at once, so that two runs started together never share one.
    Undone by release_run; calling it again is a no-op."""
    import fcntl

    from lightning.pytorch.utilities import rank_zero_only

    if getattr(trainer, "_zoo_run_lock", None) is not None:
        return
    if rank_zero_only.rank != 0:  # the other processes of one distributed run: rank 0 holds it for them all
        trainer._zoo_run_lock = -1
        return
    check_writable_folder(trainer.default_root_dir, "trainer.default_root_dir")
    for logger in getattr(trainer, "loggers", ()):
        if getattr(logger, "_version", 0) is None and hasattr(logger, "_get_next_version"):
            root = os.path.realpath(logger.root_dir)
            os.makedirs(root, exist_ok=True)
            with locked(root):
                logger._version = logger._get_next_version()
                os.makedirs(logger.log_dir, exist_ok=True)  # taken: the next run's count starts above it
    folder = getattr(trainer.checkpoint_callback, "dirpath", None)
    if folder is None:
        trainer._zoo_run_lock = -1  # checkpoints go to the logger's own version folder
        return
    fd = open_lock("run-" + lock_name(folder))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.pread(fd, 1000, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise FileExistsError(f"another run ({other}) is writing checkpoints to {folder}; wait for it to end, or "
                              "give this one its own --trainer.default_root_dir or --checkpoint.dirpath") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}: {' '.join(['zoo', *sys.argv[1:]])[:300]}".encode(), 0)
    trainer._zoo_run_lock = fd


def release_run(trainer) -> None:
    fd = getattr(trainer, "_zoo_run_lock", None)
    trainer._zoo_run_lock = None
    if fd is not None and fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


def read_task(checkpoint) -> L.LightningModule:
    """The task in a zoo Lightning checkpoint (our own file, read with weights_only)."""
    from zoo.training import task_class
    from zoo.training.checkpoint_io import read_checkpoint

    hparams = read_checkpoint(checkpoint).get("hyper_parameters", {})  # one-line errors for what is not one
    if "model_name" not in hparams:
        raise ValueError(f"{checkpoint} is not a zoo training checkpoint (no model_name in its hyperparameters)")
    task = task_class(hparams["model_name"], hparams.get("model_config"))  # a saved model_config needs no source
    return task.load_from_checkpoint(checkpoint, map_location="cpu", weights_only=True)


def export_checkpoint(checkpoint, outdir, config: str | None = None, overwrite: bool = True) -> tuple[Path, dict]:
    """A zoo Lightning checkpoint (our own file, read with weights_only) to a release folder.

    With the recipe it was trained with (`config`), the card gets test metrics measured now.
    The checkpoint is never inside what is replaced, and only a release folder is replaced.
    """
    from tqdm import tqdm

    if not Path(checkpoint).is_file():
        raise FileNotFoundError(f"no checkpoint file at {checkpoint}")
    check_export_path(outdir, {"the checkpoint it exports": checkpoint}, overwrite)
    steps = tqdm(total=3, desc="export", unit="step")
    task = read_task(checkpoint)
    refuse_nonfinite(task.model, checkpoint)
    steps.update()
    if config:
        import yaml
        from jsonargparse import ArgumentParser

        parser = ArgumentParser()
        parser.add_subclass_arguments(L.LightningDataModule, "data")
        with open(config) as f:
            data = yaml.safe_load(f)["data"]
        datamodule = parser.instantiate_classes(parser.parse_object({"data": data})).data
        steps.update()
        path, metrics = export(task, datamodule, outdir, command=f"zoo fit --config {config}", overwrite=overwrite)
    else:
        steps.update()
        path, metrics = save_pretrained(task.model, outdir, overwrite=overwrite), {}
    steps.update()
    steps.close()
    return path, metrics
