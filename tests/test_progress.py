"""zoo's Trainer redraws its progress bar by the clock: a redraw at every step cost a tiny model a quarter of its
step at two threads (zoo/training/progress.py)."""

import pytest
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar, TQDMProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE

from zoo.training.precision import Trainer
from zoo.training.progress import TimedProgressBar, TimedRichProgressBar, _ByTheClock


def test_the_default_bar_is_timed_of_lightnings_kind_and_a_given_or_disabled_bar_is_respected():
    bars = [c for c in Trainer(max_steps=1, logger=False).callbacks if isinstance(c, ProgressBar)]
    assert len(bars) == 1 and isinstance(bars[0], _ByTheClock)
    assert isinstance(bars[0], RichProgressBar if _RICH_AVAILABLE else TQDMProgressBar)  # the kind Lightning picks
    own = TQDMProgressBar(refresh_rate=5)
    callbacks = Trainer(max_steps=1, logger=False, callbacks=[own]).callbacks
    assert own in callbacks and not any(isinstance(c, _ByTheClock) for c in callbacks)
    quiet = Trainer(max_steps=1, logger=False, enable_progress_bar=False)
    assert not any(isinstance(c, ProgressBar) for c in quiet.callbacks)


def test_it_redraws_once_per_interval_and_always_at_the_end(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("zoo.training.progress.time.monotonic", lambda: clock[0])
    bar = TimedProgressBar(interval=0.25)
    assert bar._should_update(1, 10)  # the first step draws
    clock[0] += 0.1
    assert not bar._should_update(2, 10)
    assert bar._should_update(10, 10)  # the last always
    clock[0] += 0.3
    assert bar._should_update(3, 10)
    bar.disable()
    clock[0] += 1.0
    assert not bar._should_update(4, 10)


@pytest.mark.parametrize("callbacks", [None, [], ()])
def test_callbacks_given_in_any_form_get_the_bar(callbacks):
    trainer = Trainer(max_steps=1, logger=False, callbacks=callbacks)
    assert sum(isinstance(c, _ByTheClock) for c in trainer.callbacks) == 1


@pytest.mark.skipif(not _RICH_AVAILABLE, reason="rich is not installed")
def test_the_rich_bar_draws_a_training_step_only_when_due(monkeypatch):
    drawn = []
    monkeypatch.setattr(RichProgressBar, "on_train_batch_end", lambda self, *args: drawn.append(args[-1]))
    clock = [0.0]
    monkeypatch.setattr("zoo.training.progress.time.monotonic", lambda: clock[0])
    bar = TimedRichProgressBar(interval=1.0)
    monkeypatch.setattr(TimedRichProgressBar, "total_train_batches", property(lambda self: 5))
    for index in range(5):  # 0.4 s a step: steps 1, 3 (at 1.2 s) and 5 (the last) are drawn
        bar.on_train_batch_end(None, None, None, None, index)
        clock[0] += 0.6 if index == 1 else 0.4
    assert drawn == [0, 2, 4]
