"""Next-token language modeling with any registered text model."""

from __future__ import annotations

import logging
import math

import lightning as L
import torch
import torch.nn.functional as F
import torchmetrics

from zoo.models.registry import create
from zoo.models.tokenizer import BPETokenizer, describe
from zoo.training import finetune, optim
from zoo.training.source import is_checkpoint, model_from_config, saved_config, source_family, start_from
from zoo.utils.modes import evaluating

log = logging.getLogger(__name__)


def _model_arguments(data_info: dict | None) -> dict:
    """The data's model arguments; a sequence task's keys (test_lengths, loss_by_position) are not the model's."""
    return {k: v for k, v in (data_info or {}).items() if k in ("vocab_size", "tokenizer", "context_length")}


class LanguageModelTask(L.LightningModule):
    """Cross-entropy per token; bits per character and perplexity; a short sample at each validation.

    Args:
        model_name: a registered model (random weights; it takes the data's tokenizer), or a checkpoint to
            start from (a shipped name.tag, a release folder, hf-hub:org/repo), which keeps its own tokenizer:
            the data is encoded with it (`setup`), or refused if it cannot be.
        model_overrides: keyword arguments of the model's class.
        data_info: the data's vocabulary size and tokenizer (and context length, where it gives one), linked in by the
            command line from the data module; keys that are not model arguments (a sequence task's) are dropped.
        lr: AdamW's peak learning rate, reached after the warm-up, then decayed along a cosine.
        weight_decay: AdamW's decoupled weight decay, on matrices only.
        warmup_steps: optimizer steps of linear warm-up from 0.
        sample_prompt: the prompt of the short sample logged at each validation.
        sample_tokens: how many tokens that sample generates.
        new_tokenizer: fine-tune a checkpoint with the data's tokenizer instead of its own, the token embedding
            started afresh.
        layer_decay: layer-wise learning-rate decay, as in ClassificationTask; None for none.
        freeze_blocks: freeze the embedding and this many first blocks.
        compile: run the training steps' forward and backward through torch.compile (the model is compiled at the
            first step, which takes seconds to a minute; validation, sampling and the checkpoints use the model
            itself, unchanged). Off by default: it pays where the steps outlast the compilation.
        model_config: the built model, saved in the hyperparameters (set by the task, not by hand).
    """

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
        new_tokenizer: bool = False,
        layer_decay: float | None = None,
        freeze_blocks: int = 0,
        compile: bool = False,
        model_config: dict | None = None,
    ):
        super().__init__()
        optim.check_hyperparameters(lr, weight_decay, warmup_steps)
        finetune.check_finetune(layer_decay, freeze_blocks)
        if not isinstance(compile, bool):
            raise TypeError(f"compile must be true or false, got {compile!r}")
        self.save_hyperparameters()
        self._compiled = None  # (the model, its compiled forward): a tuple, so not a submodule of the task
        overrides = dict(model_overrides or {})
        data_info = _model_arguments(data_info)
        self._fitted_to_data = model_config is not None or is_checkpoint(model_name)  # those keep their tokenizer
        if model_config is None and is_checkpoint(model_name):
            if source_family(model_name) != "text":
                raise ValueError(f"{model_name!r} is not a language model; LanguageModelTask needs a text model "
                                 "(`zoo models '*gpt*' --pretrained` lists those with weights)")
            tokens = {k: v for k, v in data_info.items() if k != "context_length"}  # the checkpoint keeps its own
            self.model = start_from(model_name, {**tokens, **overrides} if new_tokenizer else overrides)
        elif model_config is None:
            self.model = create(model_name, **{**data_info, **overrides})
        else:
            self.model = model_from_config(model_config)
        self.hparams.model_config = saved_config(self.model)
        finetune.freeze(self.model, freeze_blocks)
        self.val_loss = torchmetrics.MeanMetric()
        self.test_loss = torchmetrics.MeanMetric()

    @property
    def bits(self) -> str:
        """bits per character only where a token is a character; per token otherwise (BPE)."""
        return "bits_per_token" if isinstance(self.model.tokenizer, BPETokenizer) else "bpc"

    def setup(self, stage: str) -> None:
        self._fit_to_data()
        self._match_tokenizer()

    def _fit_to_data(self) -> None:
        """A registered model built without data_info (in Python, where no command line links the data module
        to the task) is built again with the data's vocabulary and tokenizer before any step, and says so: it
        would otherwise train on ids of a vocabulary it does not know and be released without its tokenizer."""
        data = self.trainer.datamodule if self._trainer is not None else None
        info = getattr(data, "data_info", None) if data is not None else None
        if self.hparams.data_info is not None or self._fitted_to_data or not isinstance(info, dict):
            return
        args = {**_model_arguments(info), **(self.hparams.model_overrides or {})}
        self._fitted_to_data = True
        self.hparams.data_info = info
        if all(self.model.config.get(key) == value for key, value in args.items()):
            return
        device = next(self.model.parameters()).device
        self.model = create(self.hparams.model_name, **args).to(device)
        self.hparams.model_config = saved_config(self.model)
        finetune.freeze(self.model, self.hparams.freeze_blocks)
        log.info("LanguageModelTask: built %s for %s's data_info (vocabulary of %d), as `zoo fit` links it; pass "
                 "data_info=datamodule.data_info to build it so at once", self.hparams.model_name,
                 type(data).__name__, self.model.vocab_size)

    def _match_tokenizer(self) -> None:
        """The data must be tokens of the model's tokenizer: a data module that can, re-encodes its text with it
        (CharText.use_tokenizer); any other mismatch is refused. Never a loss over another tokenizer's ids."""
        data = self.trainer.datamodule if self._trainer is not None else None
        theirs, ours = getattr(data, "tokenizer", None), self.model.tokenizer
        if theirs is None or ours is None or theirs.to_dict() == ours.to_dict():
            return
        if not hasattr(data, "use_tokenizer"):
            raise ValueError(f"{type(data).__name__}'s tokenizer ({describe(theirs)}) is not the model's "
                             f"({describe(ours)}), and it cannot take the model's: give the data module the "
                             "model's tokenizer, or fine-tune with new_tokenizer: true")
        base = getattr(self.model, "base_model", None)
        data.use_tokenizer(ours, f"{base}'s" if base else "the model's")

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """A checkpoint's model, rebuilt if this task was built otherwise (from another file's tokenizer, say),
        before Lightning loads its weights; then the data adopts its tokenizer."""
        hparams = checkpoint.get("hyper_parameters") or {}
        saved = hparams.get("model_config")
        if saved is None:  # written before model_config: the model as the checkpoint's data made it
            args = {**self.model.config, **(hparams.get("data_info") or {}), **(hparams.get("model_overrides") or {})}
            saved = {**saved_config(self.model), "args": args}
        if saved["args"] != self.model.config:
            device = next(self.model.parameters()).device
            self.model = model_from_config(saved).to(device)
            self.hparams.model_config = saved_config(self.model)
            finetune.freeze(self.model, self.hparams.freeze_blocks)
            self._match_tokenizer()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    def _loss(self, batch, model=None) -> torch.Tensor:
        x, y = batch
        logits = (self if model is None else model)(x)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    def _training_model(self):
        """The model the training steps run: itself, or with compile its torch.compile'd forward (made again
        where the model was rebuilt, by _fit_to_data or on_load_checkpoint)."""
        if not self.hparams.get("compile"):
            return None
        if self._compiled is None or self._compiled[0] is not self.model:
            self._compiled = (self.model, torch.compile(self.model))
        return self._compiled[1]

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch, self._training_model())
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.val_loss.update(self._loss(batch), weight=batch[1].numel())

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
        self.test_loss.update(self._loss(batch), weight=batch[1].numel())  # per token: a short last batch counts less

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
        total, count = 0.0, 0
        with evaluating(self):
            for x, y in loader:
                loss = self._loss((x.to(self.device), y.to(self.device)))
                total, count = total + float(loss) * y.numel(), count + y.numel()
        loss = total / count
        return {"val/loss": round(loss, 5), f"val/{self.bits}": round(loss / math.log(2), 5),
                "val/perplexity": round(math.exp(loss), 4)}

    def configure_optimizers(self):
        h = self.hparams
        return finetune.configure(self, h.lr, h.weight_decay, h.warmup_steps, h.layer_decay)
