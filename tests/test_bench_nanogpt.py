"""bench/nanogpt.py's parts that decide what is compared: nanoGPT's data is zoo's split and vocabulary, and zoo's
step intervals that hold a validation are the ones left out (nothing here is timed)."""

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from .conftest import data_root

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

pytestmark = pytest.mark.bench


def test_nanogpt_data_is_zoos_split_and_vocabulary(tmp_path):
    from bench.nanogpt import prepare_nanogpt_data
    from zoo.data import CharText

    text = tmp_path / "input.txt"
    text.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 40)
    info = prepare_nanogpt_data(text, tmp_path / "shakespeare_char")
    ours = CharText(path=str(text), context_length=8)
    assert info["vocab_size"] == ours.vocab_size
    for split, tokens in (("train", ours.train_tokens), ("val", ours.val_tokens)):
        ids = np.fromfile(tmp_path / "shakespeare_char" / f"{split}.bin", dtype=np.uint16)
        assert ids.tolist() == tokens.tolist()
    assert (tmp_path / "shakespeare_char" / "meta.pkl").is_file()


@pytest.mark.skipif(data_root() is None, reason="shared data folder not found (set ZOO_DATA)")
def test_recipe_setup_is_nanogpts_cpu_recipe():
    from bench.nanogpt import recipe_setup

    setup = recipe_setup()
    assert (setup["context"], setup["batch"], setup["steps"]) == (64, 12, 2000)
    assert (setup["n_layer"], setup["n_head"], setup["n_embd"]) == (4, 4, 128)


def test_step_clock_leaves_out_the_intervals_that_hold_a_validation(tmp_path):
    import json

    from bench.nanogpt import StepClock

    clock = StepClock(str(tmp_path / "clock.json"))
    trainer = SimpleNamespace(sanity_checking=False, callback_metrics={}, global_step=0, is_global_zero=True,
                              precision="32-true")
    for step in range(4):
        clock.on_train_batch_end(trainer, None, None, None, step)
        if step == 1:
            trainer.callback_metrics = {"val/loss": 2.0}
            trainer.global_step = 2
            clock.on_validation_start(trainer, None)
            clock.on_validation_end(trainer, None)
    clock.on_fit_end(trainer, None)
    saved = json.loads((tmp_path / "clock.json").read_text())
    assert saved["evaluated"] == [False, True, False]
    assert saved["validations"] == [{"step": 2, "val/loss": 2.0}]
