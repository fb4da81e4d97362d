"""The leaderboard on any recipe (issue 23): `zoo leaderboard`, zoo.training.leaderboard, and the callbacks that
find the zoo model inside any LightningModule.

Records and tables are checked against hand computations and against the format of the committed
bench/results/leaderboard.json; the runner is driven by a stand-in `zoo fit` (a script that writes a
release folder) for speed, and once end to end with the real one on the quickstart recipe.
"""

import json
import math
import sys
import textwrap
from pathlib import Path

import lightning as L
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import zoo
from zoo.cli.errors import one_line
from zoo.cli.leaderboard import leaderboard_command
from zoo.training import leaderboard
from zoo.training.leaderboard import Group, Run

REPO = Path(__file__).resolve().parents[1]
BENCH_JSON = REPO / "bench" / "results" / "leaderboard.json"

# A stand-in for `zoo fit`: it writes what a finished run leaves (a release folder and a timeline), with test/acc
# 0.5 + seed / 10 + (0.01 for micro models), and appends its arguments to ./calls.jsonl.
FAKE_FIT = textwrap.dedent("""
    import json, struct, sys
    from pathlib import Path
    args = sys.argv[1:]
    value = lambda flag: args[args.index(flag) + 1]
    root, seed = Path(value("--trainer.default_root_dir")), int(value("--seed_everything"))
    with open("calls.jsonl", "a") as f:  # in the test's folder, where the runner starts
        f.write(json.dumps(args) + "\\n")
    if "fail" in str(root):
        sys.exit("zoo fit: error: this run fails")
    release = Path(value("--export.dirpath"))
    release.mkdir(parents=True)
    acc = 0.5 + seed / 10 + (0.01 if "micro" in str(root) else 0.0)
    (release / "config.json").write_text(json.dumps({"metrics": {"test/acc": acc}, "training": {
        "seconds": 9.0, "epochs": 1, "steps": 2, "precision": "32-true", "threads": 1}}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]},  # safetensors by hand:
                         "b": {"dtype": "F32", "shape": [5], "data_offsets": [48, 68]}}).encode()  # no torch import
    (release / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(68))
    Path(value("--trainer.callbacks.path")).write_text(json.dumps(
        {"epoch": 0, "step": 2, "seconds": 7.5, "metrics": {"val/acc": acc}}) + "\\n")
""")


@pytest.fixture
def fake_fit(tmp_path, monkeypatch):
    script = tmp_path / "fake_fit.py"
    script.write_text(FAKE_FIT)
    monkeypatch.setattr(leaderboard, "FIT", [sys.executable, str(script)])
    monkeypatch.setattr(leaderboard, "POLL_SECONDS", 0.05)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def calls(root: Path) -> list[list[str]]:
    path = root / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def finished_run(folder: Path, metrics: dict, timeline: list[dict], tensors: dict) -> None:
    (folder / "release").mkdir(parents=True)
    (folder / "release" / "config.json").write_text(json.dumps({"metrics": metrics, "training": {
        "seconds": 99.0, "epochs": 3, "steps": 30, "precision": "bf16-mixed", "precision_reason": "auto",
        "threads": 1}}))
    save_file(tensors, str(folder / "release" / "model.safetensors"))
    (folder / "timeline.jsonl").write_text("".join(json.dumps(e) + "\n" for e in timeline))


# ---- records and tables --------------------------------------------------------------------------


def test_record_has_the_committed_format_and_hand_counted_values(tmp_path):
    group = Group("g", "r.yaml", ("vit-tiny",), (0,), "test/acc", target=0.9, val_metric="val/acc")
    run = Run(group, "vit-tiny", 0, tmp_path)
    timeline = [{"epoch": e, "step": 10 * (e + 1), "seconds": 20.0 * (e + 1), "metrics": {"val/acc": acc}}
                for e, acc in enumerate([0.5, 0.95, 0.97])]
    finished_run(run.folder, {"test/acc": 0.96, "test/acc_top5": 1.0}, timeline,
                 {"a": torch.zeros(7, 3), "b": torch.zeros(11), "c": torch.zeros(2, 2, 2)})
    record = run.record(["zoo", "fit", "--config", "r.yaml"], 12.34)
    committed = next(iter(json.loads(BENCH_JSON.read_text())["runs"].values()))
    assert list(record) == list(committed)  # the same fields, in the same order, as bench's records
    assert record["params"] == 7 * 3 + 11 + 8 and record["metric"] == 0.96
    assert record["train_seconds"] == 60.0  # the timeline's last entry, not the release's own count
    assert record["target_reached_on_validation"] == {"seconds": 40.0, "epoch": 1, "step": 20, "val/acc": 0.95}
    assert record["wall_seconds_last_process"] == 12.3 and record["command"] == "zoo fit --config r.yaml"
    assert run.key == "g/vit-tiny/seed0" and run.folder == tmp_path / "g" / "vit-tiny" / "seed0"


def test_cells_and_markdown_match_a_hand_computed_mean_and_sample_std():
    group = Group("g", "recipes/{model}.x.yaml", ("a", "b"), (0, 1, 2), "test/acc", target=0.91)
    values = {2: 0.97, 0: 0.90, 1: 0.92}  # finished out of seed order
    results = {"runs": {f"g/a/seed{s}": {"group": "g", "model": "a", "seed": s, "metric": v, "params": 12345,
                                         "train_seconds": 60.0 * (s + 1), "precision": "32-true",
                                         "target_reached_on_validation": {"seconds": 30.0} if v > 0.91 else None}
                        for s, v in values.items()}}
    [cell] = leaderboard.cells(results, [group])  # b has no runs: no cell
    mean = (0.90 + 0.92 + 0.97) / 3
    std = math.sqrt(((0.90 - mean) ** 2 + (0.92 - mean) ** 2 + (0.97 - mean) ** 2) / 2)  # n - 1
    assert cell["values"] == [0.90, 0.92, 0.97] and cell["seeds"] == [0, 1, 2]
    assert cell["mean"] == pytest.approx(0.93) and cell["std"] == pytest.approx(std) and std == pytest.approx(0.0360555)
    assert cell["train_minutes_mean"] == pytest.approx(2.0) and cell["seeds_meeting_target"] == 2
    assert cell["validation_reached_target_in_minutes"] == [0.5, 0.5]
    results["cells"] = [cell]
    lines = leaderboard.markdown(results, [group]).splitlines()
    assert lines[1] == "**g** (test/acc, %; recipes/<model>.x.yaml)"
    assert lines[-1] == "| `a` | 12k | 93.00 ± 3.61 | 3 | 90.00, 92.00, 97.00 | 2.0 | 2/3 seeds >= 91 | 0.5, 0.5 |"
    lower = Group("g", "r.yaml", ("a",), (0, 1, 2), "val/loss", higher_is_better=False, target=0.91)
    assert leaderboard.cells(results, [lower])[0]["seeds_meeting_target"] == 1  # 0.90 <= 0.91 only


@pytest.mark.bench
def test_the_bench_table_is_the_package_table():
    """bench/leaderboard.py's groups through the package: the committed cells and commands come out again."""
    sys.path.insert(0, str(REPO))
    import bench.leaderboard as bench

    results = json.loads(BENCH_JSON.read_text())
    assert leaderboard.cells(results, bench.boards()) == results["cells"]
    assert {g.name: g.describe() for g in bench.boards()} == results["groups"]
    run = bench.Run(bench.GROUPS[0], "vit-tiny", 0)
    assert run.folder == REPO / "bench" / "runs" / "leaderboard" / "mnist" / "vit-tiny" / "seed0"


# ---- the runner -----------------------------------------------------------------------------------


def test_a_finished_run_is_skipped_and_the_rest_are_recorded_at_once(fake_fit, capsys):
    group = Group("g", "r.yaml", ("vit-tiny", "micro-vit-tiny"), (0, 1), "test/acc", set_model_name=True)
    runs = [Run(group, m, s, fake_fit / "runs") for s in group.seeds for m in group.models]
    out = fake_fit / "runs" / "results.json"
    faked = {"group": "g", "model": "vit-tiny", "seed": 0, "metric": 0.25, "params": 1, "train_seconds": 1.0,
             "precision": "32-true"}
    leaderboard.save(out, {"runs": {"g/vit-tiny/seed0": faked}}, [group], "test")
    resumed = runs[3].folder / "checkpoints" / "release"
    resumed.mkdir(parents=True)
    (resumed / "last.ckpt").write_bytes(b"")  # a run cut off after a checkpoint
    assert leaderboard.run_all(runs, out, [group], "test", jobs=2) == []
    made = calls(fake_fit)
    assert sorted(c[c.index("--trainer.default_root_dir") + 1] for c in made) == [
        "runs/g/micro-vit-tiny/seed0", "runs/g/micro-vit-tiny/seed1", "runs/g/vit-tiny/seed1"]
    assert [c[-2:] == ["--ckpt_path", "last"] for c in made if "micro-vit-tiny/seed1" in " ".join(c)] == [True]
    results = json.loads(out.read_text())
    assert results["runs"]["g/vit-tiny/seed0"] == faked  # untouched
    assert results["runs"]["g/micro-vit-tiny/seed1"]["metric"] == pytest.approx(0.61)
    assert results["runs"]["g/micro-vit-tiny/seed1"]["params"] == 17
    cells = {c["model"]: c for c in results["cells"]}
    assert cells["vit-tiny"]["values"] == [0.25, 0.6] and cells["micro-vit-tiny"]["mean"] == pytest.approx(0.56)
    assert "1 of 4 runs done or running elsewhere; 3 to run" in capsys.readouterr().out
    assert leaderboard.run_all(runs, out, [group], "test") == []  # all recorded: nothing starts again
    assert len(calls(fake_fit)) == 3


def test_a_failed_run_is_named_with_its_error_and_left_without_a_record(fake_fit, capsys):
    group = Group("g", "r.yaml", ("fail", "vit-tiny"), (0,), "test/acc")
    runs = [Run(group, m, 0, fake_fit / "runs") for m in group.models]
    out = fake_fit / "runs" / "results.json"
    assert leaderboard.run_all(runs, out, [group], "test") == ["g/fail/seed0"]
    assert "FAILED g/fail/seed0 (exit 1): zoo fit: error: this run fails" in capsys.readouterr().out
    assert list(json.loads(out.read_text())["runs"]) == ["g/vit-tiny/seed0"]


def test_zoo_leaderboard_passes_seeds_models_and_arguments_to_each_fit(fake_fit, capsys):
    argv = ["--recipe", "quickstart", "--models", "vit-tiny,micro-vit-tiny", "--seeds", "2", "--jobs", "2",
            "--", "--trainer.max_epochs", "1"]
    leaderboard_command(argv)
    made = calls(fake_fit)
    assert len(made) == 4
    for args in made:
        seed, model = args[args.index("--seed_everything") + 1], args[args.index("--model.init_args.model_name") + 1]
        assert args[args.index("--data.init_args.seed") + 1] == seed  # Digits takes a seed
        assert args[args.index("--trainer.default_root_dir") + 1] == f"runs/leaderboard/quickstart/{model}/seed{seed}"
        assert args[:3] == ["fit", "--config", str(REPO / "recipes" / "quickstart.yaml")]
        assert args[args.index("--trainer.max_epochs") + 1] == "1"
    printed = capsys.readouterr().out
    assert "| `micro-vit-tiny` | 0k | 56.00 ± 7.07 | 2 | 51.00, 61.00 |" in printed  # (0.51, 0.61): std 0.0707
    results = json.loads((fake_fit / "runs" / "leaderboard" / "leaderboard.json").read_text())
    assert results["command"].startswith("zoo leaderboard --recipe quickstart")
    leaderboard_command([*argv[:6], "--list"])
    assert capsys.readouterr().out.count(" done\n") == 4


def test_a_data_module_without_a_seed_gets_none(fake_fit, monkeypatch, capsys):
    (fake_fit / "noseed.py").write_text("import lightning as L\nclass Data(L.LightningDataModule):\n"
                                        "    def __init__(self, root: str = 'data'):\n        super().__init__()\n")
    monkeypatch.syspath_prepend(str(fake_fit))
    assert not leaderboard.takes_seed("noseed.Data") and leaderboard.takes_seed("zoo.data.MNIST1D")  # via **kwargs
    recipe = fake_fit / "mine.yaml"
    recipe.write_text("model:\n  class_path: zoo.training.ClassificationTask\n  init_args: {model_name: vit-tiny}\n"
                      "data:\n  class_path: noseed.Data\n")
    leaderboard_command(["--recipe", str(recipe), "--models", "vit-tiny", "--seeds", "1"])
    [args] = calls(fake_fit)
    assert "--data.init_args.seed" not in args and args[args.index("--seed_everything") + 1] == "0"
    assert "noseed.Data takes no seed" in capsys.readouterr().err


@pytest.mark.parametrize("argv, error, message", [
    (["--models", "vit-tiny,micro-vit-tny"], ValueError,
     "--models: unknown model 'micro-vit-tny'; closest: micro-vit-tiny"),
    (["--models", "vit-tiny", "--seeds", "0"], ValueError, "--seeds must be at least 1, got 0"),
    (["--models", "vit-tiny", "--seeds", "100000000"], ValueError, "--seeds must be at most 1000, got 100000000"),
    (["--models", "vit-tiny", "--jobs", "-1"], ValueError, "--jobs must be at least 1, got -1"),
    (["--models", " , "], ValueError, "--models expects registered model names separated by commas"),
    (["--models", "vit-tiny,vit-tiny"], ValueError, "--models names a model twice"),
    (["--models", "gpt-tiny"], ValueError, "gpt-tiny trains with zoo.training.LanguageModelTask"),
    (["--models", "vit-tiny", "--out", "."], IsADirectoryError, "--out . is a folder; expected the path of a JSON"),
    (["--models", "vit-tiny", "--name", "a/b"], ValueError, "--name must be a plain name"),
])
def test_bad_arguments_are_refused_in_one_line_before_anything_runs(fake_fit, argv, error, message):
    with pytest.raises(error) as caught:
        leaderboard_command(["--recipe", "quickstart", *argv])
    assert message in one_line(caught.value) and "\n" not in one_line(caught.value)
    assert calls(fake_fit) == [] and not (fake_fit / "runs").exists()


def test_bad_recipes_and_result_files_are_refused_and_left_as_they_were(fake_fit):
    with pytest.raises(FileNotFoundError, match="--recipe quickstrt: no such file.*closest: quickstart"):
        leaderboard_command(["--recipe", "quickstrt", "--models", "vit-tiny"])
    (fake_fit / "nodata.yaml").write_text("model:\n  class_path: zoo.training.ClassificationTask\n")
    with pytest.raises(ValueError, match="nodata.yaml has no data: section"):
        leaderboard_command(["--recipe", "nodata.yaml", "--models", "vit-tiny"])
    (fake_fit / "nomodel.yaml").write_text("data:\n  class_path: zoo.data.Digits\n")
    with pytest.raises(ValueError, match="nomodel.yaml has no model: section"):
        leaderboard_command(["--recipe", "nomodel.yaml", "--models", "vit-tiny"])
    notes = fake_fit / "notes.json"
    notes.write_text('{"mine": 1}')
    with pytest.raises(FileExistsError, match="notes.json exists and is not a leaderboard's results"):
        leaderboard_command(["--recipe", "quickstart", "--models", "vit-tiny", "--out", str(notes)])
    assert notes.read_text() == '{"mine": 1}' and calls(fake_fit) == []
    (fake_fit / "afile").write_text("")
    with pytest.raises(NotADirectoryError, match="afile is a file, not a folder"):
        leaderboard_command(["--recipe", "quickstart", "--models", "vit-tiny", "--runs", "afile"])
    leaderboard_command(["--recipe", "quickstart", "--models", "vit-tiny", "--seeds", "1"])
    with pytest.raises(ValueError, match="already holds a group quickstart run with another extra_arguments"):
        leaderboard_command(["--recipe", "quickstart", "--models", "vit-tiny", "--", "--trainer.max_epochs", "2"])
    assert len(calls(fake_fit)) == 1  # the second budget would have been skipped as done: refused instead


# 26 s beside the other tests; the tests above run the same command on a stand-in fit, test_training the real one
@pytest.mark.slow
def test_zoo_leaderboard_end_to_end_on_the_quickstart_recipe(tmp_path, monkeypatch, capsys):
    """The real `zoo fit`, 2 models x 1 seed on a budget of two steps (about 20 s on two cores)."""
    monkeypatch.chdir(tmp_path)
    argv = ["--recipe", "quickstart", "--models", "vit-tiny,micro-vit-tiny", "--seeds", "1", "--jobs", "2",
            "--", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    leaderboard_command(argv)
    results = json.loads((tmp_path / "runs" / "leaderboard" / "leaderboard.json").read_text())
    for model in ("vit-tiny", "micro-vit-tiny"):
        record = results["runs"][f"quickstart/{model}/seed0"]
        release = tmp_path / "runs" / "leaderboard" / "quickstart" / model / "seed0" / "release"
        assert zoo.load(release).model_name == model  # the recipe's model replaced by each one in turn
        assert record["metric"] == record["metrics"]["test/acc"] and 0.0 <= record["metric"] <= 1.0
        assert record["steps"] == 2 and record["params"] == sum(p.numel() for p in zoo.load(release).parameters())
    printed = capsys.readouterr().out
    assert "**quickstart** (test/acc, %;" in printed and "| `micro-vit-tiny` |" in printed
    leaderboard_command(argv)  # everything recorded: resumed, nothing trained again
    assert "2 of 2 runs done or running elsewhere; 0 to run" in capsys.readouterr().out


# ---- the callbacks on any LightningModule -----------------------------------------------------------


class Custom(L.LightningModule):
    """Not a zoo task: the zoo model is `self.net`, inside a wrapper, and `self.model` is something else."""

    def __init__(self, net: nn.Module | None):
        super().__init__()
        self.wrapper = nn.ModuleDict({"net": net if net is not None else nn.Linear(64, 10)})
        self.model = nn.Identity()
        self.steps = 0

    def forward(self, x):
        net = self.wrapper["net"]
        return net(x if not isinstance(net, nn.Linear) else x.flatten(1))

    def training_step(self, batch, batch_idx):
        self.steps += 1
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_callbacks_find_the_zoo_model_inside_any_lightning_module(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from lightning.pytorch.loggers import CSVLogger

    from zoo.data import Digits
    from zoo.quantization.outliers import ActivationStats
    from zoo.training.outliers import TrackOutliers
    from zoo.training.pictures import DrawPictures, first_validation_inputs

    torch.manual_seed(0)
    net = zoo.create("vit-tiny", img_size=8, in_chans=1, num_classes=10, patch_size=2, embed_dim=32, depth=1,
                     num_heads=2)
    module, data = Custom(net), Digits(batch_size=32)
    logger = CSVLogger(tmp_path, name="csv")
    trainer = L.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, logger=logger, accelerator="cpu",
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0,
                        callbacks=[DrawPictures(), TrackOutliers(every_n_steps=1, max_inputs=16,
                                                                 path=str(tmp_path / "o.jsonl"))])
    trainer.fit(module, data)
    pngs = {p.name for p in (Path(logger.log_dir) / "pictures" / "epoch-0").iterdir()}
    assert "attention.png" in pngs
    lines = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    net.eval()  # measured again by hand, after the last step: the same inputs through the same weights
    with torch.no_grad(), ActivationStats(net) as stats:
        net(first_validation_inputs(trainer, 16))
    assert lines[-1]["kurtosis"] == pytest.approx(stats.summary()["kurtosis"], rel=1e-5)
    assert lines[-1]["max_abs"] == pytest.approx(stats.summary()["max_abs"], rel=1e-5)

    for callback in (DrawPictures(), TrackOutliers()):
        plain = Custom(None)
        trainer = L.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, callbacks=[callback])
        with pytest.raises(TypeError, match=f"{type(callback).__name__} looks for a zoo model .*Custom holds none"):
            trainer.fit(plain, data)
        assert plain.steps == 0  # refused before the first step
