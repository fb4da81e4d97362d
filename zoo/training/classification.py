"""Classification of images, signals and volumes with any registered model."""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
import torchmetrics

import zoo
from zoo.training import optim


def fit_to_data(model_name: str, overrides: dict, data_info: dict | None) -> dict:
    """Model keyword arguments that make `model_name` fit the data, with the user's overrides on top."""
    from zoo.registry import entry

    if not data_info:
        return dict(overrides)
    family = entry(model_name).family
    if family == "text":
        raise ValueError(f"{model_name!r} is a text model; classification needs an image, signal or volume model")
    kwargs = {k: data_info[k] for k in ("num_classes", "in_chans", "mean", "std", "label_names")}
    size = list(data_info["input_size"])
    if family == "image":
        if len(size) != 2 or size[0] != size[1]:
            raise ValueError(f"{model_name!r} takes square images; the data has input size {size}: "
                             "use a fused-* model for other shapes")
        kwargs["img_size"] = size[0]
    else:
        kwargs["input_size"] = size
    if "num_classes" in overrides and overrides["num_classes"] != kwargs["num_classes"]:
        raise ValueError(f"model_overrides sets num_classes={overrides['num_classes']}, but the data has "
                         f"{kwargs['num_classes']} classes: remove the override")
    return {**kwargs, **overrides}


class ClassificationTask(L.LightningModule):
    """Cross-entropy with optional label smoothing; accuracy (top-1, top-5 beyond five classes), AUROC for two.

    model_name: a registered model (`zoo models`); model_overrides: its keyword arguments;
    data_info: what the data module says the model must fit (classes, channels, input size,
    normalization), linked in by the command line from the data module.
    """

    def __init__(
        self,
        model_name: str = "micro-vit-tiny",
        model_overrides: dict | None = None,
        data_info: dict | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        warmup_steps: int = 100,
        label_smoothing: float = 0.0,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.model = zoo.create(model_name, **fit_to_data(model_name, model_overrides or {}, data_info))
        self.num_classes = self.model.num_classes
        self.val_metrics = self._metrics("val/")
        self.test_metrics = self._metrics("test/")
        self.confusion = torchmetrics.ConfusionMatrix(**self._kind())

    def _kind(self) -> dict:
        n = self.num_classes
        return {"task": "binary"} if n == 2 else {"task": "multiclass", "num_classes": n}

    def _metrics(self, prefix: str, sync: bool = True) -> torchmetrics.MetricCollection:
        kw = {**self._kind(), "sync_on_compute": sync}
        metrics = {"acc": torchmetrics.Accuracy(**kw)}
        if self.num_classes > 5:
            metrics["acc_top5"] = torchmetrics.Accuracy(**kw, top_k=5)
        if self.num_classes == 2:
            metrics["auroc"] = torchmetrics.AUROC(task="binary", sync_on_compute=sync)
        return torchmetrics.MetricCollection(metrics, prefix=prefix)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def _scores(self, logits: torch.Tensor) -> torch.Tensor:
        # binary metrics take the probability of class 1; multiclass ones take logits
        return logits.float().softmax(-1)[:, 1] if self.num_classes == 2 else logits.float()

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x).float(), y, label_smoothing=self.hparams.label_smoothing)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val/loss", F.cross_entropy(logits.float(), y), prog_bar=True, sync_dist=True)
        self.val_metrics.update(self._scores(logits), y)
        self.log_dict(self.val_metrics, prog_bar=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("test/loss", F.cross_entropy(logits.float(), y), sync_dist=True)
        self.test_metrics.update(self._scores(logits), y)
        self.confusion.update(self._scores(logits), y)
        self.log_dict(self.test_metrics)

    def on_test_epoch_end(self):
        matrix = self.confusion.compute().cpu()
        self.confusion.reset()
        self.test_confusion_matrix = matrix.tolist()
        if self.trainer.is_global_zero and self.trainer.log_dir:
            from pathlib import Path

            path = Path(self.trainer.log_dir) / "confusion_matrix.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(",".join(map(str, row)) for row in matrix.tolist()) + "\n")

    def predict_step(self, batch, batch_idx):
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self(x).softmax(-1)

    @torch.no_grad()
    def evaluate(self, loader) -> dict:
        """Test-split metrics in one pass, outside a Trainer, on this process alone (used when exporting)."""
        metrics = self._metrics("test/", sync=False).to(self.device)
        was_training = self.training
        self.eval()
        for x, y in loader:
            metrics.update(self._scores(self(x.to(self.device))), y.to(self.device))
        self.train(was_training)
        return {k: round(float(v), 5) for k, v in metrics.compute().items()}

    def configure_optimizers(self):
        h = self.hparams
        return optim.configure(self, h.lr, h.weight_decay, h.warmup_steps)
