"""Turn a trained task into a release folder whose model card carries its measured metrics."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import lightning as L
import torch

from zoo.release import save_pretrained


def model_card(model, name: str, metrics: dict, command: str | None, seconds: float | None, data: str) -> str:
    params = sum(p.numel() for p in model.parameters())
    tags = ["zoo", "pytorch", type(model).__name__, f"attention-{model.config.get('attention', 'softmax')}"]
    metric_names = sorted({k.split("/")[-1] for k in metrics})
    lines = [
        "---", "library_name: zoo", "license: mit", "tags:", *[f"- {t}" for t in tags],
        "metrics:", *[f"- {m}" for m in metric_names], "---", "",
        f"# {name}", "",
        f"{type(model).__name__} with {params:,} parameters, trained with zoo on {data}.", "",
        "## Results", "",
    ]
    if metrics:
        lines += ["| metric | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in sorted(metrics.items())], ""]
        lines += ["Measured on the held-out split named in each metric, at export time, on the run's best "
                  "checkpoint (lowest validation loss).", ""]
    else:
        lines += ["No metrics were measured at export: run `zoo test` with the recipe to measure them.", ""]
    if command:
        lines += ["## Training", "", f"```\n{command}\n```", ""]
        if seconds is not None:
            lines += [f"Training took {seconds / 60:.1f} minutes on {platform.machine()} "
                      f"({torch.get_num_threads()} threads).", ""]
    lines += ["## Use", "", f"```python\nimport zoo\nmodel = zoo.load(\"path/to/{name}\")\n```", "",
              "## Configuration", "", f"```json\n{json.dumps(model.config, indent=2)}\n```", ""]
    return "\n".join(lines)


def export(task: L.LightningModule, datamodule, outdir, command: str | None = None,
           seconds: float | None = None) -> tuple[Path, dict]:
    """Evaluate `task` on the data's test split and write its model as a release folder."""
    datamodule.setup("test")
    metrics = task.evaluate(datamodule.test_dataloader())
    model = task.model
    name = Path(outdir).name
    card = model_card(model, name, metrics, command, seconds, type(datamodule).__name__)
    path = save_pretrained(model, outdir, card=card, extra={"metrics": metrics})
    return path, metrics


class ExportRelease(L.Callback):
    """At the end of fit, load the best checkpoint and export it (with test metrics) to `dirpath`."""

    def __init__(self, dirpath: str | None = None, command: str | None = None):
        self.dirpath, self.command = dirpath, command
        self.started = None

    def on_fit_start(self, trainer, pl_module):
        self.started = time.time()

    def on_fit_end(self, trainer, pl_module):
        if not self.dirpath or not trainer.is_global_zero:
            return
        seconds = time.time() - self.started if self.started else None
        best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        if best:
            state = torch.load(best, map_location=pl_module.device, weights_only=True)["state_dict"]
            pl_module.load_state_dict(state)
        path, metrics = export(pl_module, trainer.datamodule, self.dirpath, self.command, seconds)
        print(f"exported {path} with {metrics}")
