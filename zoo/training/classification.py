"""Classification of images, signals and volumes with any registered model."""

from __future__ import annotations

import logging

import lightning as L
import torch
import torch.nn.functional as F
import torchmetrics

from zoo.models.registry import create
from zoo.training import finetune, optim
from zoo.training.source import saved_config
from zoo.utils.modes import evaluating

log = logging.getLogger(__name__)

def fit_to_data(model_name: str, overrides: dict, data_info: dict | None) -> dict:
    """Model keyword arguments that make `model_name` (a registered model or a checkpoint) fit the data, with
    the user's overrides on top."""
    from zoo.training.source import source_family

    if not data_info:
        return dict(overrides)
    family = source_family(model_name)
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


def _differences(model, kwargs: dict) -> list[str]:
    """The constructor arguments in `kwargs` that `model` was not built with (JSON's lists for tuples)."""
    from zoo.training.source import _plain

    return [key for key, value in kwargs.items() if _plain(model.config.get(key)) != _plain(value)]


def build_model(model_name: str, kwargs: dict, model_config: dict | None):
    """The task's model: its saved config when a Lightning checkpoint is read again (the weights follow), else
    a checkpoint to start from, else a registered model with random weights."""
    from zoo.training.source import is_checkpoint, model_from_config, start_from

    if model_config is not None:
        return model_from_config(model_config)
    if is_checkpoint(model_name):
        return start_from(model_name, kwargs)
    return create(model_name, **kwargs)


class ClassificationTask(L.LightningModule):
    """Cross-entropy with optional label smoothing; accuracy (top-1, top-5 beyond five classes), AUROC for two.

    Args:
        model_name: a registered model (`zoo models`), or a checkpoint to start from (a shipped name.tag,
            a release folder, hf-hub:org/repo; zoo/training/source.py).
        model_overrides: keyword arguments of the model's class (num_classes or in_chans adapt a checkpoint's
            head or patch embedding, as timm does).
        data_info: what the data module says the model must fit (classes, channels, input size,
            normalization, label names), linked in by the command line from the data module.
        lr: AdamW's peak learning rate, reached after the warm-up, then decayed along a cosine.
        weight_decay: AdamW's decoupled weight decay, on matrices only (not norms, biases, embeddings).
        warmup_steps: optimizer steps of linear warm-up from 0.
        label_smoothing: cross-entropy's label smoothing, in [0, 1).
        layer_decay: layer-wise learning-rate decay (timm's: block i gets lr * layer_decay ** (depth - i));
            None for none.
        freeze_blocks: freeze the embedding and this many first blocks (0: train everything).
        model_config: the built model, saved in the hyperparameters so that a Lightning checkpoint is read
            back without its starting point (set by the task, not by hand).
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
        layer_decay: float | None = None,
        freeze_blocks: int = 0,
        model_config: dict | None = None,
    ):
        super().__init__()
        optim.check_hyperparameters(lr, weight_decay, warmup_steps, label_smoothing)
        finetune.check_finetune(layer_decay, freeze_blocks)
        self.save_hyperparameters()
        self._fitted_to_data = model_config is not None  # a checkpoint's model: fitted when it was built
        kwargs = fit_to_data(model_name, model_overrides or {}, data_info) if model_config is None else {}
        self._build(build_model(model_name, kwargs, model_config))

    def _build(self, model) -> None:
        self.model = model
        self.hparams.model_config = saved_config(self.model)
        finetune.freeze(self.model, self.hparams.freeze_blocks)
        self.num_classes = self.model.num_classes
        self.val_metrics = self._metrics("val/")
        self.test_metrics = self._metrics("test/")
        self.confusion = torchmetrics.ConfusionMatrix(**self._kind())

    def setup(self, stage: str) -> None:
        """Fit the model to the data module's `data_info` where the task was built without it (in Python, where
        no command line links the two): a model built for MNIST's classes, normalization and label names would
        otherwise be trained on a folder of photographs and released as knowing MNIST's. The model is rebuilt
        from `model_name` before any optimizer step, with the data's classes, channels, input size, mean, std and
        label names (a checkpoint's weights adapted as `zoo fit` adapts them), and the change is logged."""
        data = self.trainer.datamodule if self._trainer is not None else None
        info = getattr(data, "data_info", None) if data is not None else None
        if self.hparams.data_info is not None or self._fitted_to_data or not isinstance(info, dict):
            return
        kwargs = fit_to_data(self.hparams.model_name, self.hparams.model_overrides or {}, info)
        self.hparams.data_info, self._fitted_to_data = info, True
        if not _differences(self.model, kwargs):
            return
        device = next(self.model.parameters()).device
        self._build(build_model(self.hparams.model_name, kwargs, None).to(device))
        log.info("ClassificationTask: built %s for %s's data_info (%d classes, mean %s, std %s), as `zoo fit` "
                 "links it; pass data_info=datamodule.data_info to build it so at once", self.hparams.model_name,
                 type(data).__name__, self.num_classes, info.get("mean"), info.get("std"))

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

    def check_fits(self, datamodule) -> None:
        """Refuse, in one line, to release this model with metrics measured on data it was not built for (other
        classes, normalization or label names than the data module's `data_info`): its card and `classify`
        would disagree."""
        info = getattr(datamodule, "data_info", None)
        if not isinstance(info, dict):
            return
        kwargs = fit_to_data(self.hparams.model_name, self.hparams.model_overrides or {}, info)
        differing = _differences(self.model, kwargs)
        if differing:
            key = differing[0]
            raise ValueError(f"the model was built with {key}={self.model.config.get(key)!r}, but "
                             f"{type(datamodule).__name__}'s data_info gives {kwargs[key]!r} "
                             f"({', '.join(differing)} differ): build the task with "
                             "data_info=datamodule.data_info (as `zoo fit` links it), or train it with the Trainer "
                             "on this data module, which fits it, before exporting")

    @torch.no_grad()
    def evaluate(self, loader) -> dict:
        """Test-split metrics in one pass, outside a Trainer, on this process alone (used when exporting)."""
        metrics = self._metrics("test/", sync=False).to(self.device)
        with evaluating(self):
            for x, y in loader:
                metrics.update(self._scores(self(x.to(self.device))), y.to(self.device))
        return {k: round(float(v), 5) for k, v in metrics.compute().items()}

    def configure_optimizers(self):
        h = self.hparams
        return finetune.configure(self, h.lr, h.weight_decay, h.warmup_steps, h.layer_decay)
