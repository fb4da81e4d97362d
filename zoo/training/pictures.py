"""Draw zoo.viz's pictures during training and log them where the run logs.

Switched on from a recipe:

    trainer:
      callbacks:
        - class_path: zoo.training.pictures.DrawPictures
          init_args: {every_n_epochs: 5}

Every `every_n_epochs` validation epochs, on the first validation input, on rank zero only:
TensorBoard gets `add_figure`, Weights & Biases `log_image`, and any other logger (CSV) PNG
files under its log folder, pictures/epoch-N/NAME.png (written to a temporary file, then renamed).
A `pictures` (or `epoch-N`) that is a link or a file, or a log folder that cannot be written, is refused
at setup, before training: the pictures never land in a folder the link leads to.
The model drawn is the zoo model inside the LightningModule, wherever it is held (`zoo_model`).
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
import numpy as np
import torch

from zoo.utils.atomic import check_writable_folder


def figure_to_array(figure) -> np.ndarray:
    """A drawn figure as an RGB array (H, W, 3), for loggers that take images."""
    figure.canvas.draw()
    return np.asarray(figure.canvas.buffer_rgba())[..., :3].copy()


def first_validation_inputs(trainer, count: int) -> torch.Tensor | None:
    """The first `count` inputs of the run's validation data (from the data module before the first
    validation has set up the loaders), or None where the run has none."""
    loaders = trainer.val_dataloaders
    if loaders is None and trainer.datamodule is not None:
        loaders = trainer.datamodule.val_dataloader()
    loader = loaders[0] if isinstance(loaders, (list, tuple)) else loaders
    if loader is None:
        return None
    batch = next(iter(loader))
    return (batch[0] if isinstance(batch, (list, tuple)) else batch)[:count]


def zoo_model(pl_module, who: str) -> torch.nn.Module:
    """The zoo model inside any LightningModule: its `.model` where that is one, else its first submodule that is
    an ImageTransformer, FusedAttentionNetwork or TextTransformer; refused in one line where it holds none."""
    from zoo.models import FusedAttentionNetwork, ImageTransformer, TextTransformer

    families = (ImageTransformer, FusedAttentionNetwork, TextTransformer)
    model = getattr(pl_module, "model", None)
    if isinstance(model, families):
        return model
    found = next((m for m in pl_module.modules() if isinstance(m, families)), None)
    if found is None:
        raise TypeError(f"{who} looks for a zoo model (an ImageTransformer, FusedAttentionNetwork or TextTransformer, "
                        f"e.g. from zoo.create) as the LightningModule's .model or any of its submodules; "
                        f"{type(pl_module).__name__} holds none")
    return found


class DrawPictures(L.Callback):
    def __init__(self, every_n_epochs: int = 1, include_model: bool = True):
        if isinstance(every_n_epochs, bool) or not isinstance(every_n_epochs, int) or every_n_epochs < 1:
            raise ValueError(f"DrawPictures every_n_epochs must be an integer >= 1, got {every_n_epochs!r}")
        import zoo.viz  # noqa: F401  (fails here, at configuration, where matplotlib is missing)

        self.every_n_epochs, self.include_model = every_n_epochs, include_model

    def setup(self, trainer, pl_module, stage) -> None:
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                if _file_logger(logger):
                    _picture_folder(logger, None)

    def on_fit_start(self, trainer, pl_module) -> None:
        zoo_model(pl_module, "DrawPictures")  # refused before the first step, not at the first picture

    def on_validation_start(self, trainer, pl_module) -> None:
        zoo_model(pl_module, "DrawPictures")

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        if (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        from zoo.viz import pictures

        x = first_validation_inputs(trainer, 1)
        drawn = pictures(zoo_model(pl_module, "DrawPictures"), None if x is None else x.to(pl_module.device),
                         include_model=self.include_model)
        for logger in trainer.loggers:
            self._log(logger, drawn, trainer.current_epoch, trainer.global_step)

    @staticmethod
    def _log(logger, drawn: dict, epoch: int, step: int) -> None:
        from lightning.pytorch.loggers import TensorBoardLogger

        if isinstance(logger, TensorBoardLogger):
            for name, (figure, _) in drawn.items():
                logger.experiment.add_figure(f"pictures/{name}", figure, global_step=step, close=False)
        elif hasattr(logger, "log_image"):  # Weights & Biases
            for name, (figure, _) in drawn.items():
                logger.log_image(key=f"pictures/{name}", images=[figure_to_array(figure)], step=step)
        elif _file_logger(logger):
            folder = _picture_folder(logger, epoch)
            for name, (figure, _) in drawn.items():
                partial = folder / f".{name}.png.partial"
                figure.savefig(partial, format="png", dpi=100, bbox_inches="tight")
                os.replace(partial, folder / f"{name}.png")


def _file_logger(logger) -> bool:
    """Whether DrawPictures writes PNG files for this logger (not TensorBoard, not Weights & Biases)."""
    from lightning.pytorch.loggers import TensorBoardLogger

    return not isinstance(logger, TensorBoardLogger) and not hasattr(logger, "log_image") and logger.log_dir is not None


def _picture_folder(logger, epoch: int | None) -> Path:
    """LOG_DIR/pictures/epoch-N, made, or (epoch None) only checked: refused where a part is a link or a file, or
    the log folder cannot be written."""
    folder = Path(logger.log_dir) / "pictures"
    parts = [folder] if epoch is None else [folder, folder / f"epoch-{epoch}"]
    check_writable_folder(logger.log_dir, "DrawPictures: the log folder")
    if epoch is not None:
        Path(logger.log_dir).mkdir(parents=True, exist_ok=True)
    for part in parts:
        if part.is_symlink() or (part.exists() and not part.is_dir()):
            kind = "a link" if part.is_symlink() else "a file"
            raise FileExistsError(f"DrawPictures writes into {part}, which is {kind}; zoo writes pictures only into "
                                  "a folder of its own: move it away, or log to another folder")
        if epoch is not None:
            part.mkdir(exist_ok=True)
    return parts[-1]
