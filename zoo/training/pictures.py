"""Draw zoo.viz's pictures during training and log them where the run logs.

Switched on from a recipe:

    trainer:
      callbacks:
        - class_path: zoo.training.pictures.DrawPictures
          init_args: {every_n_epochs: 5}

Every `every_n_epochs` validation epochs, on the first validation input, on rank zero only:
TensorBoard gets `add_figure`, Weights & Biases `log_image`, and any other logger (CSV) PNG
files under its log folder, pictures/epoch-N/NAME.png (written to a temporary file, then renamed).
"""

from __future__ import annotations

import os
from pathlib import Path

import lightning as L
import numpy as np
import torch


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


class DrawPictures(L.Callback):
    def __init__(self, every_n_epochs: int = 1, include_model: bool = True):
        if isinstance(every_n_epochs, bool) or not isinstance(every_n_epochs, int) or every_n_epochs < 1:
            raise ValueError(f"DrawPictures every_n_epochs must be an integer >= 1, got {every_n_epochs!r}")
        import zoo.viz  # noqa: F401  (fails here, at configuration, where matplotlib is missing)

        self.every_n_epochs, self.include_model = every_n_epochs, include_model

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        if (trainer.current_epoch + 1) % self.every_n_epochs:
            return
        import matplotlib.pyplot as plt

        from zoo.viz import pictures

        x = first_validation_inputs(trainer, 1)
        drawn = pictures(pl_module.model, None if x is None else x.to(pl_module.device),
                         include_model=self.include_model)
        for logger in trainer.loggers:
            self._log(logger, drawn, trainer.current_epoch, trainer.global_step)
        for figure, _ in drawn.values():
            plt.close(figure)

    @staticmethod
    def _log(logger, drawn: dict, epoch: int, step: int) -> None:
        from lightning.pytorch.loggers import TensorBoardLogger

        if isinstance(logger, TensorBoardLogger):
            for name, (figure, _) in drawn.items():
                logger.experiment.add_figure(f"pictures/{name}", figure, global_step=step, close=False)
        elif hasattr(logger, "log_image"):  # Weights & Biases
            for name, (figure, _) in drawn.items():
                logger.log_image(key=f"pictures/{name}", images=[figure_to_array(figure)], step=step)
        elif logger.log_dir is not None:
            folder = Path(logger.log_dir) / "pictures" / f"epoch-{epoch}"
            folder.mkdir(parents=True, exist_ok=True)
            for name, (figure, _) in drawn.items():
                partial = folder / f".{name}.png.partial"
                figure.savefig(partial, format="png", dpi=100, bbox_inches="tight")
                os.replace(partial, folder / f"{name}.png")
