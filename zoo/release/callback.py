"""ExportRelease: the Lightning callback that ends `zoo fit` by writing (and optionally pushing) a release."""

from __future__ import annotations

import lightning as L
import torch

from zoo.models.card import parse_target
from zoo.models.hub import validate_repo_id
from zoo.release.export import check_export_path, export
from zoo.release.push import check_hub, push
from zoo.training.clock import TrainingClock
from zoo.training.runs import claim_run, release_run


class ExportRelease(L.Callback):
    """At the end of fit, load the best checkpoint and export it (with test metrics) to `dirpath`."""

    def __init__(self, dirpath: str | None = None, command: str | None = None, push_to: str | None = None,
                 private: bool = False, target: str | None = None):
        """push_to: a Hub repository (org/name) to upload the exported folder to with `zoo.release.push.push`.
        target: what the run set out to reach, "METRIC >= VALUE (where it comes from)"; the card says
        whether the measured metric met it.
        """
        if target is not None:
            parse_target(target)  # fail before training, not after
        self.dirpath, self.command, self.push_to, self.private, self.target = dirpath, command, push_to, private, target
        # the training time, carried in the checkpoint across `--ckpt_path last` resumes (state_dict below),
        # and the step the run resumed at
        self.clock, self.resumed_at = TrainingClock(), None

    def state_dict(self) -> dict:
        return self.clock.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.clock.load_state_dict(state_dict)

    def setup(self, trainer, pl_module, stage):
        if self.dirpath and stage == "fit":
            check_export_path(self.dirpath, {
                "trainer.default_root_dir": trainer.default_root_dir,
                "the checkpoint folder": getattr(trainer.checkpoint_callback, "dirpath", None),
                "the log folder": trainer.log_dir,
            })
        if self.push_to and not self.dirpath:
            raise ValueError("export.push_to needs export.dirpath: the folder to write and then upload")
        if self.push_to:
            validate_repo_id(self.push_to)  # fail before training, not after
            if stage == "fit":  # the Hub answers and takes the token now, not only after training
                check_hub(what=f"export.push_to {self.push_to}")
        if stage == "fit":
            claim_run(trainer)

    def on_fit_start(self, trainer, pl_module):
        self.clock.start()

    def on_train_start(self, trainer, pl_module):
        self.resumed_at = trainer.global_step or None  # restored from the checkpoint after on_fit_start, before this

    def teardown(self, trainer, pl_module, stage):
        if stage == "fit":
            release_run(trainer)

    def on_fit_end(self, trainer, pl_module):
        if not self.dirpath or not trainer.is_global_zero:
            return
        seconds = self.clock.seconds() if self.clock.started is not None else None
        callback = trainer.checkpoint_callback
        best = callback.best_model_path if callback else ""
        if best:
            state = torch.load(best, map_location=pl_module.device, weights_only=True)["state_dict"]
            pl_module.load_state_dict(state)
        run = {"epochs": trainer.current_epoch, "steps": trainer.global_step, "precision": str(trainer.precision),
               "precision_reason": getattr(trainer, "precision_reason", None), "target": self.target}
        if self.resumed_at:  # the card says what its seconds cover
            run["resumed_at_step"], run["seconds_before_resume"] = self.resumed_at, self.clock.before
        if best:
            run["selected_by"] = f"{callback.monitor} ({callback.mode})"
            run["best_score"] = float(callback.best_model_score) if callback.best_model_score is not None else None
        path, metrics = export(pl_module, trainer.datamodule, self.dirpath, self.command, seconds, run)
        print(f"exported {path} with {metrics}")
        if self.push_to:
            print(f"pushed to {push(path, self.push_to, private=self.private)}")
