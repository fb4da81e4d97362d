"""Sequence tasks for causal text models: loss and accuracy on the scored positions only.

The data (zoo.data.synthetic, zoo.data.sequences) gives (input ids, target ids) with targets -100
wherever nothing is scored: MQAR's answers, the copied tokens, an induction copy. Pixel MNIST and
ListOps classify a whole sequence: they score only its last position (or the expression's last
token), the first a causal model reaches having read everything.
"""

from __future__ import annotations

import math

import lightning as L
import torch
import torch.nn.functional as F

from zoo.data.sequences import IGNORE
from zoo.models.registry import create
from zoo.training import optim
from zoo.utils.modes import evaluating


def position_buckets(length: int) -> list[tuple[int, int]]:
    """Token positions grouped as [0, 1), [1, 2), [2, 4), [4, 8), ...: a position p has p tokens before it."""
    buckets, low = [(0, 1)], 1
    while low < length:
        buckets.append((low, min(2 * low, length)))
        low *= 2
    return buckets


class SequenceTask(L.LightningModule):
    """Builds `model_name` with the data's vocabulary and training length (`data_info`), trains on the scored
    positions, and measures loss, accuracy (per scored token) and exact match (per sequence: every scored
    token right) at each of the data's test lengths; with the data's `loss_by_position`, also the loss by
    token position (`position_buckets`).

    A model with learned positions cannot be tested beyond them: such a length is refused when the task is
    built, rather than truncated.

    Args:
        model_name: a registered text model (`zoo.list_models()`), e.g. gpt-tiny, micro-gpt-tiny.
        model_overrides: its arguments to change (embed_dim, depth, num_heads, pos_embed, ...).
        data_info: what the data gives (vocab_size, context_length, test_lengths, loss_by_position); the
            command line passes it from the data module.
        lr: AdamW's peak learning rate.
        weight_decay: AdamW's weight decay on matrices.
        warmup_steps: linear warm-up steps before the cosine decay.
    """

    def __init__(
        self,
        model_name: str = "gpt-tiny",
        model_overrides: dict | None = None,
        data_info: dict | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        warmup_steps: int = 100,
    ):
        super().__init__()
        optim.check_hyperparameters(lr, weight_decay, warmup_steps)
        self.save_hyperparameters()
        info = dict(data_info or {})
        lengths = info.pop("test_lengths", None)
        self.loss_by_position = bool(info.pop("loss_by_position", False))
        overrides = model_overrides or {}
        self.model = create(model_name, **{**info, **overrides})
        self.test_lengths = list(lengths or [self.model.context_length])
        check_reach(self.model, model_name, self.test_lengths, info.get("vocab_size"))
        self.sums = {}  # (stage, loader index) -> running sums of the measures
        self.position_loss = {}  # stage -> {"lo-hi": mean loss}, after each evaluation with loss_by_position

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def _scored_logits(self, x: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
        """Logits (scored positions, vocab) at the scored positions only, in the order of scored.nonzero():
        with a large vocabulary and few answers (MQAR: 8192 tokens, 8 of 64 positions) the output layer on
        every position would cost more than the blocks. The same numbers as model(x)[scored]."""
        m = self.model
        h = m._embed(x, 0)
        for block in m.blocks:
            h = block(h)
        return m.head(m.norm(h[scored]))

    def _measure(self, batch):
        """Loss and whether the argmax is right at each scored position, and the scored mask."""
        x, y = batch
        if x.shape != y.shape:
            raise ValueError(f"SequenceTask expects inputs and targets of one shape, got {tuple(x.shape)} and "
                             f"{tuple(y.shape)}")
        scored = y != IGNORE
        if not bool(scored.any()):
            raise ValueError("SequenceTask got a batch with no scored position (every target is -100)")
        logits = self._scored_logits(x, scored)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 up, float64 kept
        targets = y[scored]
        return F.cross_entropy(logits, targets, reduction="none"), logits.argmax(-1) == targets, scored

    def training_step(self, batch, batch_idx):
        loss = self._measure(batch)[0].mean()
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def _accumulate(self, stage: str, index: int, batch) -> None:
        if index >= len(self.test_lengths):
            raise ValueError(f"SequenceTask was built for {len(self.test_lengths)} test length(s) "
                             f"{self.test_lengths} (the data's data_info), but got a loader #{index + 1}")
        losses, correct, scored = self._measure(batch)
        rows, columns = scored.nonzero(as_tuple=True)
        count = scored.sum(1)
        right = torch.zeros_like(count).index_add_(0, rows, correct.long())
        sums = self.sums.setdefault((stage, index), {"loss": 0.0, "correct": 0, "scored": 0, "exact": 0,
                                                     "sequences": 0, "by_position": None, "at_position": None})
        sums["loss"] += float(losses.sum(dtype=torch.float64))
        sums["correct"] += int(correct.sum())
        sums["scored"] += len(losses)
        sums["exact"] += int((right == count).sum())
        sums["sequences"] += len(count)
        if self.loss_by_position:
            length = scored.shape[1]
            by_position = torch.zeros(length, dtype=torch.float64).index_add_(0, columns.cpu(), losses.double().cpu())
            at_position = scored.sum(0).cpu()
            if sums["by_position"] is None:
                sums["by_position"], sums["at_position"] = by_position, at_position
            else:
                sums["by_position"] += by_position
                sums["at_position"] += at_position

    def _summary(self, stage: str) -> dict:
        """The measures of `stage` (and clears them): at the training length without a suffix, and at every
        test length as "@length"."""
        metrics = {}
        for (kind, index), sums in sorted(self.sums.items()):
            if kind != stage:
                continue
            length = self.test_lengths[index]
            values = {"loss": sums["loss"] / sums["scored"], "accuracy": sums["correct"] / sums["scored"],
                      "exact": sums["exact"] / sums["sequences"]}
            for name, value in values.items():
                metrics[f"{stage}/{name}@{length}"] = value
                if index == 0:
                    metrics[f"{stage}/{name}"] = value
            if index == 0 and sums["by_position"] is not None:
                self.position_loss[stage] = {}
                for low, high in position_buckets(len(sums["by_position"])):
                    count = int(sums["at_position"][low:high].sum())
                    if count:
                        value = float(sums["by_position"][low:high].sum()) / count
                        self.position_loss[stage][f"{low}-{high}"] = value
                        metrics[f"{stage}/loss_by_position/{low}-{high}"] = value
        self.sums = {k: v for k, v in self.sums.items() if k[0] != stage}
        return metrics

    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0):
        self._accumulate("val", dataloader_idx, batch)

    def test_step(self, batch, batch_idx, dataloader_idx: int = 0):
        self._accumulate("test", dataloader_idx, batch)

    def on_validation_epoch_end(self):
        self._log_summary("val")

    def on_test_epoch_end(self):
        self._log_summary("test")

    def _log_summary(self, stage: str):
        metrics = self._summary(stage)
        if metrics:
            loss = metrics.pop(f"{stage}/loss")
            self.log(f"{stage}/loss", loss, prog_bar=True, sync_dist=True)
            self.log_dict(metrics, sync_dist=True)

    @torch.no_grad()
    def evaluate(self, loaders, stage: str = "test") -> dict:
        """The measures over a loader or a list of them (one per test length, as the data gives them), named
        `stage`/measure: "test", or "val" for the validation loader."""
        with evaluating(self):
            for index, loader in enumerate(loaders if isinstance(loaders, (list, tuple)) else [loaders]):
                for x, y in loader:
                    self._accumulate(stage, index, (x.to(self.device), y.to(self.device)))
        return {k: round(v, 5) for k, v in self._summary(stage).items()}

    def configure_optimizers(self):
        h = self.hparams
        return optim.configure(self, h.lr, h.weight_decay, h.warmup_steps)


def position_reach(model) -> float:
    """The longest sequence a model's positions can index: its context for learned positions, else unbounded."""
    return model.context_length if getattr(model, "pos_kind", None) == "learned" else math.inf


def check_reach(model, model_name: str, test_lengths: list[int], vocab_size: int | None) -> None:
    """Refuse, before any work, test lengths beyond a model's learned positions and a vocabulary too small."""
    if vocab_size is not None and model.vocab_size < vocab_size:
        raise ValueError(f"{model_name} has vocab_size={model.vocab_size}, but the data's tokens go up to "
                         f"{vocab_size - 1}: leave vocab_size out of model_overrides (the data sets it)")
    reach = position_reach(model)
    beyond = [n for n in test_lengths if n > reach]
    if beyond:
        raise ValueError(f"{model_name} has learned positions for {reach} tokens and cannot be tested at "
                         f"{', '.join(map(str, beyond))} tokens: give the data test_lengths of at most {reach}, or "
                         "use a model whose positions extend (micro-gpt-tiny, elita-gpt-tiny, or "
                         "model_overrides {pos_embed: sincos})")
