"""Track activation outliers while a model trains: kurtosis and max |x| every N steps.

Outliers of the kind the quiet-attention write-up and Bondarenko et al. 2023 describe grow during
training, so a value at the end says less than its curve. Switched on from a recipe:

    trainer:
      callbacks:
        - class_path: zoo.training.outliers.TrackOutliers
          init_args: {every_n_steps: 100}

Every `every_n_steps` optimizer steps, the model (in eval mode, without gradients) reads the
same held-out batch, the first of the validation data, and the logger gets
`outliers/kurtosis` (mean over the watched layers of the per-input Pearson kurtosis) and
`outliers/max_abs` (the largest magnitude in any of them); see zoo.quantization.outliers.
With `path`, rank zero also appends them as JSON lines (step, kurtosis, max_abs) to that file.
The model measured is the zoo model inside the LightningModule: its `.model`, or the first
submodule that is one (any LightningModule that holds a zoo model works); a module that holds
none is refused when fit starts.
"""

from __future__ import annotations

import json

import lightning as L
import torch

from zoo.quantization.outliers import ActivationStats
from zoo.training.pictures import first_validation_inputs, zoo_model
from zoo.utils.atomic import appendable_jsonl
from zoo.utils.modes import evaluating


class TrackOutliers(L.Callback):
    def __init__(self, every_n_steps: int = 100, max_inputs: int = 64, path: str | None = None):
        for name, value in (("every_n_steps", every_n_steps), ("max_inputs", max_inputs)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TrackOutliers {name} must be an integer >= 1, got {value!r}")
        self.every_n_steps, self.max_inputs = every_n_steps, max_inputs
        self.path = appendable_jsonl(path, "TrackOutliers path") if path is not None else None
        self.batch = None

    def _held_out(self, trainer) -> torch.Tensor:
        if self.batch is None:
            self.batch = first_validation_inputs(trainer, self.max_inputs)
            if self.batch is None:
                raise RuntimeError("TrackOutliers measures on the first validation batch; this run has no "
                                   "validation data")
        return self.batch

    def on_fit_start(self, trainer, pl_module) -> None:
        zoo_model(pl_module, "TrackOutliers")  # refused before the first step, not at the first measurement

    def measure(self, trainer, pl_module) -> dict[str, float]:
        x = self._held_out(trainer).to(pl_module.device)
        model = zoo_model(pl_module, "TrackOutliers")
        with evaluating(model), torch.no_grad(), ActivationStats(model) as stats:
            model(x)
        summary = stats.summary()
        return {"outliers/kurtosis": summary["kurtosis"], "outliers/max_abs": summary["max_abs"]}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every_n_steps or not trainer.is_global_zero:
            return
        metrics = self.measure(trainer, pl_module)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:  # appended a line at a time, as Timeline does
                f.write(json.dumps({"step": trainer.global_step, "kurtosis": metrics["outliers/kurtosis"],
                                    "max_abs": metrics["outliers/max_abs"]}) + "\n")
