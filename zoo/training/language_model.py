"""Next-token language modeling with any registered text model."""

from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn.functional as F
import torchmetrics

import zoo
from zoo.tokenizer import BPETokenizer
from zoo.training import optim


class LanguageModelTask(L.LightningModule):
    """Cross-entropy per token; bits per character and perplexity; a short sample at each validation."""

    def __init__(
        self,
        model_name: str = "gpt-tiny",
        model_overrides: dict | None = None,
        data_info: dict | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        warmup_steps: int = 100,
        sample_prompt: str = "\n",
        sample_tokens: int = 200,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.model = zoo.create(model_name, **{**(data_info or {}), **(model_overrides or {})})
        # bits per character only where a token is a character; per token otherwise (BPE)
        self.bits = "bits_per_token" if isinstance(self.model.tokenizer, BPETokenizer) else "bpc"
        self.val_loss = torchmetrics.MeanMetric()
        self.test_loss = torchmetrics.MeanMetric()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def _loss(self, batch) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.val_loss.update(self._loss(batch))

    def on_validation_epoch_end(self):
        self._log_summary("val", self.val_loss)
        tokenizer = self.model.tokenizer
        if tokenizer is not None and self.hparams.sample_tokens and not self.trainer.sanity_checking:
            text = self.model.generate(self.hparams.sample_prompt, self.hparams.sample_tokens, temperature=0.8,
                                       top_k=20, seed=0)
            self.sample = text
            if self.trainer.is_global_zero:
                self.print(f"\n--- sample at step {self.global_step} ---\n{text}\n---")

    def test_step(self, batch, batch_idx):
        self.test_loss.update(self._loss(batch))

    def on_test_epoch_end(self):
        self._log_summary("test", self.test_loss)

    def _log_summary(self, stage: str, metric: torchmetrics.MeanMetric):
        loss = metric.compute()
        metric.reset()
        self.log(f"{stage}/loss", loss, prog_bar=True, sync_dist=True)
        self.log(f"{stage}/{self.bits}", loss / math.log(2), sync_dist=True)
        self.log(f"{stage}/perplexity", loss.exp(), sync_dist=True)

    @torch.no_grad()
    def evaluate(self, loader) -> dict:
        """Mean loss over a loader (validation, for tiny-shakespeare), bits per character and perplexity."""
        was_training = self.training
        self.eval()
        total, count = 0.0, 0
        for x, y in loader:
            loss = self._loss((x.to(self.device), y.to(self.device)))
            total, count = total + float(loss) * y.numel(), count + y.numel()
        self.train(was_training)
        loss = total / count
        return {"val/loss": round(loss, 5), f"val/{self.bits}": round(loss / math.log(2), 5),
                "val/perplexity": round(math.exp(loss), 4)}

    def configure_optimizers(self):
        h = self.hparams
        return optim.configure(self, h.lr, h.weight_decay, h.warmup_steps)
