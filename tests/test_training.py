"""Data modules on the real data, short fits, the command line, and a two-process run."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch

import zoo
from zoo.cli import main
from zoo.data import MNIST, MNIST1D, AdrenalMNIST3D, CharText, Digits, FashionMNIST
from zoo.training import ClassificationTask, LanguageModelTask
from zoo.training.classification import fit_to_data
from zoo.training.optim import parameter_groups, warmup_cosine

from .conftest import data_root

ROOT = data_root()
needs_data = pytest.mark.skipif(ROOT is None, reason="shared data folder not found (set ZOO_DATA)")
REPO = Path(__file__).resolve().parents[1]


def quick_trainer(tmp_path, **kw):
    return L.Trainer(default_root_dir=tmp_path, accelerator="cpu", devices=1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, **kw)


# ---- data modules ---------------------------------------------------------------------------


def test_digits_split_is_fixed_and_disjoint():
    a, b = Digits(batch_size=32), Digits(batch_size=32)
    a.setup(), b.setup()
    assert len(a.train_set) + len(a.val_set) + len(a.test_set) == 1797
    assert a.val_set.indices == b.val_set.indices
    assert torch.equal(a.test_set.tensors[0], b.test_set.tensors[0])  # fixed: the same test images each time
    # disjoint: training and validation split one pool by index; no test image is one of that pool's
    train, val = set(a.train_set.indices), set(a.val_set.indices)
    assert not train & val and train | val == set(range(len(a.train_set.dataset)))
    pool = {image.numpy().tobytes() for image in a.train_set.dataset.tensors[0]}
    assert len(pool) == len(a.train_set.dataset)  # the pool's images are distinct, so bytes identify them
    assert not any(image.numpy().tobytes() in pool for image in a.test_set.tensors[0])
    x, y = next(iter(a.train_dataloader()))
    assert x.shape == (32, 1, 8, 8) and y.dtype == torch.long


@needs_data
@pytest.mark.parametrize("cls,shape,n_train,n_test", [
    (MNIST, (1, 28, 28), 60000, 10000),
    (FashionMNIST, (1, 28, 28), 60000, 10000),
    (MNIST1D, (1, 40), 4000, 1000),
])
def test_real_data_modules(cls, shape, n_train, n_test):
    dm = cls(root=str(ROOT), batch_size=16, **({"download": False} if cls in (MNIST, FashionMNIST) else {}))
    dm.setup()
    assert len(dm.train_set) + len(dm.val_set) == n_train and len(dm.test_set) == n_test
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, *shape) and 0 <= int(y.min()) and int(y.max()) < 10
    assert abs(float(dm.test_set.tensors[0].mean())) < 0.5  # normalized


@needs_data
# the 64^3 volumes go through the same code as the 28^3 ones and take 20 s to read: in the slow set
@pytest.mark.parametrize("size", [28, pytest.param(64, marks=pytest.mark.slow)])
def test_adrenal_3d(size):
    dm = AdrenalMNIST3D(root=str(ROOT), batch_size=4, size=size)
    dm.setup()
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (1188, 98, 298)
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (4, 1, size, size, size) and set(y.tolist()) <= {0, 1}


@needs_data
def test_char_text_split_and_windows():
    dm = CharText(path=str(ROOT / "tinyshakespeare" / "input.txt"), context_length=32, batch_size=4,
                  train_samples=8)
    assert dm.tokenizer.vocab_size == 65
    assert len(dm.train_tokens) == int(1_115_394 * 0.9)
    assert dm.tokenizer.decode(dm.train_tokens[:13].tolist()) == "First Citizen"
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == y.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1])


@needs_data
def test_char_text_with_bpe_tokenizer():
    pytest.importorskip("tokenizers")
    dm = CharText(path=str(ROOT / "tinyshakespeare" / "input.txt"), context_length=32, batch_size=4,
                  train_samples=8, tokenizer="bpe", vocab_size=512)
    assert dm.tokenizer.vocab_size == 512
    text = dm.text[int(len(dm.text) * 0.9):]
    assert dm.tokenizer.decode(dm.val_tokens.tolist()) == text  # validation is exactly the last 10%
    assert len(dm.train_tokens) < 0.6 * int(len(dm.text) * 0.9)  # fewer tokens than characters
    task = LanguageModelTask("gpt-tiny", {"depth": 1}, dm.data_info)
    assert set(task.evaluate([next(iter(dm.train_dataloader()))])) == {"val/loss", "val/bits_per_token",
                                                                        "val/perplexity"}
    with pytest.raises(ValueError, match="tokenizer must be one of"):
        CharText(path=str(ROOT / "tinyshakespeare" / "input.txt"), tokenizer="words")


def test_missing_data_fails_with_a_clear_message(tmp_path):
    with pytest.raises(FileNotFoundError, match="MNIST is not under .* could not be downloaded|download=False"):
        MNIST(root=str(tmp_path), download=False).setup()
    with pytest.raises(FileNotFoundError, match="AdrenalMNIST3D not found"):
        AdrenalMNIST3D(root=str(tmp_path)).setup()
    with pytest.raises(FileNotFoundError, match="text file not found"):
        CharText(path=str(tmp_path / "none.txt"))


# ---- tasks ----------------------------------------------------------------------------------


def test_torchvision_augmentation_settings(tmp_path):
    from torch.utils.data import TensorDataset

    x = torch.arange(2 * 28 * 28, dtype=torch.float32).view(2, 1, 28, 28)
    data = TensorDataset(x.repeat(50, 1, 1, 1), torch.zeros(100, dtype=torch.long))
    flipped = FashionMNIST(root=str(tmp_path), shift=0, flip=True).train_transform(data)
    seen = [flipped[i][0] for i in range(100)]
    plain = sum(torch.equal(s, x[i % 2]) for i, s in enumerate(seen))
    mirrored = sum(torch.equal(s, x[i % 2].flip(-1)) for i, s in enumerate(seen))
    assert plain + mirrored == 100 and 25 < mirrored < 75  # each image as it is or mirrored, about half each
    assert MNIST(root=str(tmp_path), shift=0).train_transform(data) is data  # nothing to do: the data untouched
    assert MNIST(root=str(tmp_path)).shift == 2 and not MNIST(root=str(tmp_path)).flip
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=f"shift must be a whole number of pixels >= 0, got {bad!r}"):
            MNIST(root=str(tmp_path), shift=bad)


def test_precision_auto_follows_the_measured_matmul_rates(monkeypatch):
    from zoo.training import precision

    def rates(fp32, bf16):
        monkeypatch.setattr(precision, "matmul_rate", lambda dtype, **kw: bf16 if dtype == torch.bfloat16 else fp32)
        precision.choose.cache_clear()

    monkeypatch.setattr(precision.torch.cuda, "is_available", lambda: False)
    try:
        rates(332.0, 173.0)  # a CPU without AMX, as measured on one (issue 13)
        choice = precision.choose("cpu")
        assert choice.precision == "32-true" and "0.52x the float32 rate" in choice.reason
        assert "173 against 332 GFLOP/s" in choice.reason and "CPU flags" in choice.reason
        rates(100.0, 149.0)
        assert precision.choose("cpu").precision == "32-true"
        rates(100.0, 150.0)
        assert precision.choose("cpu").precision == "bf16-mixed"
        rates(107.0, 1309.0)
        trainer = precision.Trainer(precision="auto", accelerator="cpu", logger=False, enable_checkpointing=False,
                                    enable_progress_bar=False, enable_model_summary=False)
        assert trainer.precision == "bf16-mixed" and trainer.precision_reason.startswith("auto: a bf16 matrix")
        given = precision.Trainer(precision="32", accelerator="cpu", logger=False, enable_checkpointing=False)
        assert given.precision == "32-true" and given.precision_reason is None
    finally:
        precision.choose.cache_clear()


def test_matmul_rate_is_a_plausible_measurement():
    from zoo.training.precision import cpu_flags, matmul_rate

    rate = matmul_rate(torch.float32, size=256, repeats=2)
    assert 0.1 < rate < 1e5  # GFLOP/s: anything from a slow emulator to a big server
    assert set(cpu_flags()) <= {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8"}


def test_matmul_rate_times_one_product_where_one_outlasts_the_budget(monkeypatch):
    """Slow products (bf16 without AVX-512: 2 s each) are timed once, fast ones after a warm-up, best of repeats."""
    from zoo.training import precision

    calls = []

    def mm(a, b, seconds):
        calls.append(seconds)
        time.sleep(seconds)  # sleep lasts at least this long, so the budget is passed or not for certain
        return a

    monkeypatch.setattr(precision.torch, "mm", lambda a, b: mm(a, b, 0.3))
    rate = precision.matmul_rate(torch.float32, size=64, budget=0.2)
    assert len(calls) == 1 and rate <= 2 * 64**3 / 0.3 / 1e9
    calls.clear()
    monkeypatch.setattr(precision.torch, "mm", lambda a, b: mm(a, b, 0.01))
    precision.matmul_rate(torch.float32, size=64, repeats=3, budget=float("inf"))
    assert len(calls) == 4  # the warm-up and three timed


def test_weight_decay_groups_and_schedule():
    model = zoo.create("gpt-tiny", depth=1)
    decay, no_decay = parameter_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in no_decay["params"]} >= {"tok_embed.weight", "pos_embed", "norm.weight"}
    assert all(p.ndim == 2 for p in decay["params"]) and "tok_embed.weight" not in {names[id(p)] for p in
                                                                                    decay["params"]}
    assert warmup_cosine(0, 10, 100) == pytest.approx(0.1) and warmup_cosine(9, 10, 100) == pytest.approx(1.0)
    assert warmup_cosine(100, 10, 100) == pytest.approx(0.1)


def test_fit_to_data_checks():
    info = Digits.info
    assert fit_to_data("micro-vit-tiny", {}, info)["img_size"] == 8
    assert fit_to_data("fused-1d-tiny", {}, MNIST1D.info)["input_size"] == [40]
    with pytest.raises(ValueError, match="num_classes=3, but the data has 10 classes"):
        fit_to_data("vit-tiny", {"num_classes": 3}, info)
    with pytest.raises(ValueError, match="text model"):
        fit_to_data("gpt-tiny", {}, info)


def test_short_classification_fit_beats_chance(tmp_path):
    L.seed_everything(0)
    dm = Digits(batch_size=64)
    task = ClassificationTask("micro-vit-tiny", {"patch_size": 2, "embed_dim": 32, "depth": 2},
                              dm.data_info, lr=3e-3, warmup_steps=10)
    dm.setup()
    before = task.evaluate(dm.test_dataloader())["test/acc"]
    quick_trainer(tmp_path, max_epochs=4).fit(task, dm)
    after = task.evaluate(dm.test_dataloader())["test/acc"]
    assert after > 0.3 and after > before + 0.2  # chance is 0.1


@needs_data
def test_short_language_model_fit_lowers_loss(tmp_path):
    L.seed_everything(0)
    dm = CharText(path=str(ROOT / "tinyshakespeare" / "input.txt"), context_length=32, batch_size=8,
                  train_samples=8 * 60, val_windows=40)
    task = LanguageModelTask("micro-gpt-tiny", {"depth": 1, "embed_dim": 64}, dm.data_info, lr=3e-3,
                             warmup_steps=5, sample_tokens=20)
    before = task.evaluate(dm.val_dataloader())["val/loss"]
    quick_trainer(tmp_path, max_epochs=1).fit(task, dm)
    after = task.evaluate(dm.val_dataloader())["val/loss"]
    assert before > 4.0 and after < 3.3  # uniform over 65 characters is ln 65 = 4.17
    assert len(task.sample) == 21


# ---- the command line ---------------------------------------------------------------------------


def run_zoo(*args, cwd, timeout=300):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}  # tests.helpers, for callbacks
    return subprocess.run([sys.executable, "-m", "zoo.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_cli_models_table(capsys):
    main(["models", "micro-*"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "family", "attention", "params", "pretrained"]
    assert any(line.startswith("micro-vit-tiny") and "micro" in line for line in lines)


def test_cli_fit_test_and_export(tmp_path, capsys, monkeypatch):
    """`zoo fit`, then `zoo export` and `zoo check`, in this process (a new one pays ~10 s to import Lightning:
    `zoo fit` in a process of its own, from the installed wheel, is tests/test_checkpoints.py's wheel test; the
    commands' one-line errors are tested in tests/test_cli.py)."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text((REPO / "recipes" / "quickstart.yaml").read_text()
                      .replace("max_epochs: 30", "max_epochs: 2")
                      .replace("runs/quickstart/micro-vit-tiny.digits", str(tmp_path / "release")))
    monkeypatch.chdir(tmp_path)  # where a user runs it: Lightning's runs/ land in the working folder
    main(["fit", "--config", str(recipe), "--trainer.enable_progress_bar", "false"])
    card = (tmp_path / "release" / "README.md").read_text()
    assert "test/acc" in card and "zoo fit --config" in card
    assert "`precision: auto` chose " in card and "CPU flags" in card  # the recipe's precision is auto
    metrics = json.loads((tmp_path / "release" / "config.json").read_text())["metrics"]
    model = zoo.load(tmp_path / "release")
    assert model.config["img_size"] == 8
    # the recorded accuracy is the released model's on the test set, recomputed here from the folder
    digits = Digits(batch_size=64)
    digits.setup()
    images, labels = digits.test_set.tensors
    with torch.no_grad():
        accuracy = (model.eval()(images).argmax(-1) == labels).float().mean().item()
    # config.json rounds to 5 decimals; where the recipe's `precision: auto` chose bf16, the recorded figure was
    # measured under bf16 autocast and one borderline image may fall the other way in float32 here
    slack = 5e-6 + (1 / len(labels) if "chose bf16" in card else 0.0)
    assert metrics["test/acc"] == pytest.approx(accuracy, abs=slack)
    ckpts = sorted((tmp_path / "runs").rglob("last.ckpt"))
    assert ckpts, "ModelCheckpoint kept no last checkpoint"
    main(["export", str(ckpts[0]), str(tmp_path / "exported"), "--config", str(recipe)])
    assert "test/acc" in (tmp_path / "exported" / "README.md").read_text()
    capsys.readouterr()
    main(["check", str(tmp_path / "release"), "--data-root", str(tmp_path)])
    checked = capsys.readouterr().out
    assert "test/acc" in checked and "MISMATCH" not in checked, checked
    main(["export", str(ckpts[0]), str(tmp_path / "bare")])
    assert "No metrics were recorded" in (tmp_path / "bare" / "README.md").read_text()


@pytest.mark.slow  # 24 s: three short fits, one killed
def test_resume_after_sigkill_ends_like_an_uninterrupted_run(tmp_path):
    """Killed mid-epoch with SIGKILL, resumed with --ckpt_path last from a checkpoint saved in the middle of an
    epoch: the same weights and metrics, bit for bit (before zoo.training.resume, Lightning began the epoch's
    data again and they differed). The recipe's own ModelCheckpoint (a point every 5 steps, as the long
    recipes keep one) writes into the run's folder, and the release is the best on validation loss that zoo's
    checkpoint chose (before zoo put its own first, the export took theirs: no best, the last weights)."""
    from safetensors.torch import load_file

    recipe = tmp_path / "r.yaml"
    recipe.write_text((REPO / "recipes" / "quickstart.yaml").read_text().replace("max_epochs: 30", "max_epochs: 2"))
    every = ["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.every_n_train_steps=5",
             "--trainer.callbacks.save_top_k=0", "--trainer.callbacks.save_last=true"]

    def fit(run, *extra):
        return run_zoo("fit", "--config", str(recipe), "--trainer.default_root_dir", str(tmp_path / run),
                       "--export.dirpath", str(tmp_path / run / "release"), "--trainer.enable_progress_bar", "false",
                       *every, *extra, cwd=tmp_path)

    assert fit("straight").returncode == 0
    # 1294 training digits in batches of 64: 21 steps an epoch; validation (and zoo's last.ckpt) at 21, the
    # recipe's points at 5, 10, ..., 30; killed at 32, in the middle of the second epoch
    killed = fit("resumed", "--trainer.callbacks+=tests.helpers.KillAtStep", "--trainer.callbacks.step=32")
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert not (tmp_path / "resumed" / "release").exists()
    folder = tmp_path / "resumed" / "checkpoints" / "release"
    # each ModelCheckpoint keeps a last file of its own (Lightning numbers the second: last-v1.ckpt)
    assert sorted(p.name for p in folder.iterdir()) == ["best.ckpt", "last-v1.ckpt", "last.ckpt"]
    lasts = sorted(folder.glob("last*.ckpt"), key=lambda p: p.stat().st_mtime)
    assert [torch.load(p, weights_only=True)["global_step"] for p in lasts] == [21, 30]
    resumed = fit("resumed", "--ckpt_path", "last")
    said = resumed.stderr + resumed.stdout
    assert resumed.returncode == 0 and "Restored all states" in said
    # zoo's line on where the epoch went on, and not Lightning's warning that the loader could not resume
    assert "Resuming epoch 1 after its batch 9 of 21" in said and "not resumable" not in said, said[-3000:]
    a, b = (json.loads((tmp_path / run / "release" / "config.json").read_text()) for run in ("straight", "resumed"))
    assert b["training"]["resumed_at_step"] == 30
    assert a["metrics"] == b["metrics"] and a["training"]["steps"] == b["training"]["steps"] == 2 * 21
    wa, wb = (load_file(tmp_path / run / "release" / "model.safetensors") for run in ("straight", "resumed"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    best = torch.load(folder / "best.ckpt", weights_only=True)
    monitor = next(v for k, v in best["callbacks"].items() if "val/loss" in k)
    assert b["training"]["selected_by"] == "val/loss (min)"
    assert b["training"]["best_score"] == pytest.approx(float(monitor["best_model_score"]))
    closing = next(line for line in resumed.stdout.splitlines() if line.startswith("checkpoints: "))
    assert closing.startswith("checkpoints: best ") and "best.ckpt (val/loss" in closing, closing


def test_zoos_checkpoint_stays_the_trainers_when_a_recipe_adds_its_own(tmp_path, monkeypatch):
    """Lightning's trainer.checkpoint_callback is the first ModelCheckpoint, and the export, the run's folder
    lock and the closing line read it: a recipe's own ModelCheckpoint under trainer.callbacks came first, and the
    export took its best (none: the last weights). Theirs without a folder now write into the run's, where
    `--ckpt_path last` looks (tests/test_training.py's SIGKILL test resumes from one)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from zoo.cli.lightning import run_lightning

    monkeypatch.chdir(tmp_path)
    cli = run_lightning(["--config", str(REPO / "recipes" / "quickstart.yaml"), "--export.dirpath", "out/q",
                         "--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.every_n_train_steps=5",
                         "--trainer.callbacks.save_top_k=0", "--trainer.callbacks.save_last=true"], run=False)
    ours, theirs = cli.trainer.checkpoint_callbacks
    assert cli.trainer.checkpoint_callback is ours and ours.monitor == "val/loss" and theirs.monitor is None
    assert isinstance(theirs, ModelCheckpoint) and theirs._every_n_train_steps == 5
    assert ours.dirpath == theirs.dirpath == str(tmp_path / "runs" / "checkpoints" / "q")


def test_epoch_sampler_resumes_once_at_the_index_given_and_keeps_the_epochs_length():
    from zoo.data.sampling import EpochSampler

    sampler = EpochSampler(range(10), seed=3)
    sampler.set_epoch(1)
    whole = list(sampler)
    sampler.resume(1, 4)
    assert len(sampler) == 10 and list(sampler) == whole[4:]
    assert list(sampler) == whole  # once: the next pass over the epoch is whole again
    sampler.resume(2, 4)  # for another epoch: this one runs whole
    assert list(sampler) == whole
    other = EpochSampler(range(10), seed=3)
    other.set_epoch(2)
    sampler.set_epoch(2)
    assert list(sampler) == list(other)[4:]
    ordered = EpochSampler(range(5), shuffle=False)
    ordered.resume(0, 2)
    assert list(ordered) == [2, 3, 4]


@pytest.mark.slow  # 12 s: two processes over gloo
def test_two_process_ddp_fit(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text((REPO / "recipes" / "quickstart.yaml").read_text().replace("max_epochs: 30", "max_epochs: 1"))
    out = run_zoo("fit", "--config", str(recipe), "--trainer.devices", "2", "--trainer.strategy", "ddp",
                  "--trainer.precision", "32", "--trainer.enable_progress_bar", "false", cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "runs" / "quickstart" / "micro-vit-tiny.digits" / "model.safetensors").is_file()


@needs_data
@pytest.mark.parametrize("recipe", sorted(p.name for p in (REPO / "recipes").glob("*.yaml")))
def test_every_recipe_builds_its_model_and_data(recipe, tmp_path, monkeypatch):
    from zoo.cli.lightning import run_lightning

    monkeypatch.chdir(tmp_path)
    import importlib
    import inspect

    import yaml

    text = (REPO / "recipes" / recipe).read_text()
    module, _, name = yaml.safe_load(text)["data"]["class_path"].rpartition(".")
    takes = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    # the shared data where the data module reads files; generated tasks (MQAR, ...) and Digits need none
    override = (["--data.init_args.path", str(ROOT / "tinyshakespeare" / "input.txt")] if "CharText" in text
                else ["--data.init_args.path", str(ROOT / "warpeace" / "warpeace_input.txt")]
                if "LongContextText" in text
                else ["--data.init_args.root", str(ROOT)] if "root" in takes and "Digits" not in text else [])
    cli = run_lightning(["--config", str(REPO / "recipes" / recipe), *override], run=False)
    assert recipe == "quickstart.yaml" or recipe.startswith(cli.model.model.model_name + ".")
    # float32 bytes: a tiny recipe's checkpoint fits the wheel (under 10 MB); the mini study's take 16 to 23 MB
    limit = 25e6 if "-mini." in recipe else 10e6
    assert sum(p.numel() for p in cli.model.parameters()) * 4 < limit


@needs_data
def test_leaderboard_commands_parse_into_the_runs_they_name(tmp_path, monkeypatch):
    """Each group's `zoo fit` command builds the model it names, with its seed, budget and callbacks."""
    sys.path.insert(0, str(REPO))
    from bench.leaderboard import GROUPS, Run
    from zoo.cli.lightning import run_lightning
    from zoo.training.outliers import TrackOutliers
    from zoo.training.timeline import Timeline

    monkeypatch.chdir(REPO)  # the commands name the recipes relative to the repository
    for group in GROUPS:
        run = Run(group, group.models[-1], group.seeds[-1])
        command = run.command(ROOT)
        assert command[:2] == ["zoo", "fit"]
        resumes = (run.folder / "checkpoints" / "release" / "last.ckpt").is_file()  # a run begun before resumes
        assert command[-2:] == ["--ckpt_path", "last"] if resumes else "--ckpt_path" not in command
        cli = run_lightning(command[2:-2] if resumes else command[2:], run=False)  # ckpt_path is fit's, not parsed here
        assert cli.model.model.model_name == run.model and cli.datamodule.seed == run.seed
        kinds = {type(c) for c in cli.trainer.callbacks}
        assert Timeline in kinds and (TrackOutliers in kinds) == group.name.startswith("shakespeare")
        if group.name == "shakespeare-4x":
            assert cli.datamodule.train_samples == 4 * 24_000
        assert cli.trainer.precision in ("bf16-mixed", "32-true")


def test_timeline_counts_training_time_across_a_resume(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from zoo.training.timeline import Timeline, read, time_to

    path = tmp_path / "timeline.jsonl"

    def fit(epochs, ckpt_path=None):
        L.seed_everything(0)
        dm = Digits(batch_size=64)
        task = ClassificationTask("vit-tiny", {"depth": 1, "patch_size": 2, "embed_dim": 32, "num_heads": 2},
                                  data_info=dm.data_info)
        timeline = Timeline(str(path))
        trainer = L.Trainer(default_root_dir=tmp_path, accelerator="cpu", max_epochs=epochs, logger=False,
                            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=1,
                            callbacks=[timeline, ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)])
        trainer.fit(task, dm, ckpt_path=ckpt_path)
        return timeline

    fit(2)
    first = read(path)
    assert [e["epoch"] for e in first] == [0, 1]  # one line per validation, none for the sanity check
    assert 0 < first[0]["seconds"] < first[1]["seconds"] and "val/acc" in first[0]["metrics"]
    resumed = fit(3, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    # the checkpoint carried the time trained so far (lines round to 0.01 s, so one can read up to 0.005 s ahead)
    assert resumed.clock.before >= first[1]["seconds"] - 0.005
    lines = read(path)
    assert [e["epoch"] for e in lines] == [0, 1, 2] and lines[2]["seconds"] > lines[1]["seconds"]
    best = max(e["metrics"]["val/acc"] for e in lines)
    assert time_to(path, "val/acc", best)["metrics"]["val/acc"] == best
    assert time_to(path, "val/acc", 1.01) is None
    assert time_to(path, "val/loss", lines[0]["metrics"]["val/loss"], higher_is_better=False) == lines[0]


def test_a_resumed_runs_export_reports_its_whole_training_time(tmp_path):
    """The release a resumed run exports counts the time trained before the resume (carried in the checkpoint),
    and says at which step it resumed; before, it counted from the resume only and under-reported the run."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from zoo.release.callback import ExportRelease

    def fit(epochs, ckpt_path=None):
        L.seed_everything(0)
        dm = Digits(batch_size=64)
        task = ClassificationTask("vit-tiny", {"depth": 1, "patch_size": 2, "embed_dim": 32, "num_heads": 2},
                                  data_info=dm.data_info)
        export = ExportRelease(dirpath=str(tmp_path / f"release{epochs}"), command="zoo fit ...")
        trainer = L.Trainer(default_root_dir=tmp_path, accelerator="cpu", max_epochs=epochs, logger=False,
                            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                            limit_train_batches=3, limit_val_batches=1, limit_test_batches=1,
                            callbacks=[export, ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)])
        trainer.fit(task, dm, ckpt_path=ckpt_path)
        return json.loads((tmp_path / f"release{epochs}" / "config.json").read_text())["training"], trainer

    first, trainer = fit(1)
    steps = trainer.global_step
    last = tmp_path / "ckpt" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    carried = checkpoint["callbacks"]["ExportRelease"]["seconds"]
    assert "resumed_at_step" not in first and 0 < carried <= first["seconds"]
    # as if the part before the resume had taken an hour: the resumed export counts that hour and its own part
    checkpoint["callbacks"]["ExportRelease"]["seconds"] = 3600.0
    torch.save(checkpoint, last)
    resumed, _ = fit(2, ckpt_path=str(last))
    assert (resumed["resumed_at_step"], resumed["seconds_before_resume"]) == (steps, 3600.0)
    assert 3600 < resumed["seconds"] < 3600 + 600
    # a checkpoint that did not carry the time (written before zoo kept it): the record says so, not a whole run
    del checkpoint["callbacks"]["ExportRelease"]
    torch.save(checkpoint, last)
    resumed, _ = fit(2, ckpt_path=str(last))
    assert (resumed["resumed_at_step"], resumed["seconds_before_resume"]) == (steps, None)
    assert resumed["seconds"] < 600
    # a checkpoint zoo did not write, its time not a finite number of seconds: no record, not a traceback
    # (the timeline keeps the same clock: it took float() of whatever was there)
    from zoo.training.timeline import Timeline

    for bad in (float("nan"), float("inf"), -5.0, "an hour", None, True):
        for callback in (ExportRelease(), Timeline(str(tmp_path / "timeline.jsonl"))):
            callback.load_state_dict({"seconds": bad})
            assert callback.clock.before is None, (type(callback).__name__, bad)


def test_timeline_read_names_a_line_that_is_not_an_entry(tmp_path):
    from zoo.training.timeline import read

    path = tmp_path / "timeline.jsonl"
    path.write_text('{"step": 1, "seconds": 2.0, "metrics": {}}\n{"step": 1, "sec')  # a line cut off mid-write
    with pytest.raises(ValueError, match=r"line 2 is not a timeline entry"):
        read(path)
    path.write_text('{"step": 1, "seconds": 2.0, "metrics": {}}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"line 2 is not a timeline entry"):
        read(path)


@pytest.mark.bench
def test_bench_results_survive_two_writers_at_once(tmp_path, monkeypatch):
    """Two benchmark processes finishing together: each writes whole, neither trips on the other's temporary file."""
    import threading

    import bench.common

    monkeypatch.setattr(bench.common, "RESULTS", tmp_path)
    errors = []

    def write(who: int) -> None:
        try:
            for i in range(200):
                bench.common.write_json("both", {"who": who, "i": i, "rows": list(range(2000))})
        except Exception as error:  # noqa: BLE001  (reported below, with what it was)
            errors.append(error)

    threads = [threading.Thread(target=write, args=(who,)) for who in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert json.loads((tmp_path / "both.json").read_text())["i"] == 199
    assert [p.name for p in tmp_path.iterdir()] == ["both.json"]  # no temporary file left behind


def test_an_evaluation_gives_the_model_back_in_the_mode_it_had():
    from zoo.utils.modes import evaluating

    model = torch.nn.Sequential(torch.nn.Dropout(0.5)).train()
    with pytest.raises(RuntimeError), evaluating(model):
        assert not model.training and not model[0].training
        raise RuntimeError("a failure inside the evaluation")
    assert model.training and model[0].training  # back in training mode, the failure notwithstanding
    with evaluating(model.eval()):
        pass
    assert not model.training  # an evaluating model stays so
