"""Turn a trained task into a release folder whose model card carries its measured metrics."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import lightning as L
import torch

from zoo.models.pretrained import save_pretrained
from zoo.models.release_files import is_release_folder
from zoo.utils.atomic import check_parents, check_replaceable


def export(task: L.LightningModule, datamodule, outdir, command: str | None = None,
           seconds: float | None = None, run: dict | None = None, overwrite: bool = True) -> tuple[Path, dict]:
    """Evaluate `task` on the data's test split and write its model as a release folder.

    run: what the card should say about training (epochs, steps, precision); it is kept in
    config.json beside the metrics, so that the card can be written again from the folder.
    """
    refuse_nonfinite(task.model, "the model")
    if callable(getattr(task, "check_fits", None)):  # a model released with another data's classes or statistics
        task.check_fits(datamodule)
    datamodule.setup("test")
    metrics = task.evaluate(datamodule.test_dataloader())
    data = datamodule.describe() if hasattr(datamodule, "describe") else {"name": type(datamodule).__name__}
    training = {"command": command, "seconds": seconds, "threads": torch.get_num_threads(),
                "machine": platform.machine(), "data": data, **(run or {})}
    path = save_pretrained(task.model, outdir, extra={"metrics": metrics, "training": training}, overwrite=overwrite)
    return path, metrics


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
