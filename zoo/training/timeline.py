"""A run's validation metrics against its training wall time, kept across resumes.

    trainer:
      callbacks:
        - class_path: zoo.training.timeline.Timeline
          init_args: {path: runs/my-run/timeline.jsonl}

After every validation (not the sanity check), rank zero appends one JSON line: epoch,
step, the wall-clock seconds the run has trained so far and the validation metrics. The
seconds are carried in the checkpoint, so that a run killed and resumed with
`--ckpt_path last` goes on counting from where its checkpoint was saved (the time lost
after that checkpoint is not counted; lines the killed run wrote after it appear again
from the resumed one, and `read` keeps the last line of each step). This is what "the wall
time to reach a target" is read from.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L

from zoo.training.clock import TrainingClock
from zoo.utils.atomic import appendable_jsonl


class Timeline(L.Callback):
    def __init__(self, path: str):
        self.path = appendable_jsonl(path, "Timeline path")
        self.clock = TrainingClock()

    def on_fit_start(self, trainer, pl_module) -> None:
        self.clock.start()

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
        line = {"epoch": trainer.current_epoch, "step": trainer.global_step, "seconds": round(self.clock.seconds(), 2),
                "metrics": metrics}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:  # one short line per write, appended: never a half-rewritten file
            f.write(json.dumps(line) + "\n")

    def state_dict(self) -> dict:
        return self.clock.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.clock.load_state_dict(state_dict)


def read(path) -> list[dict]:
    """The timeline's lines in step order, the last one written for each step."""
    lines = {}
    for number, text in enumerate(Path(path).read_text().splitlines(), 1):
        if text.strip():
            try:
                entry = json.loads(text)
                lines[entry["step"]] = entry
            except (ValueError, KeyError, TypeError) as error:
                raise ValueError(f"{path} line {number} is not a timeline entry (a JSON object with a step): "
                                 f"{text[:80]!r}") from error
    return [lines[step] for step in sorted(lines)]


def time_to(path, metric: str, target: float, higher_is_better: bool = True) -> dict | None:
    """The first timeline entry whose `metric` reaches `target`, or None."""
    for entry in read(path):
        value = entry["metrics"].get(metric)
        if value is not None and (value >= target if higher_is_better else value <= target):
            return entry
    return None
