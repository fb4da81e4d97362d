"""Lost or damaged files, and output paths (docs/robustness.md, "Files and folders").

Every test here points zoo at a path that is wrong in one way (a release folder, a link, a
loop, a file on the way, a stray lock, a 240-character name, `.`) and asserts one of two
outcomes: the right result, or a one-line OSError / ValueError naming the path, given
before any work, with every byte outside the target as it was.
"""

import fcntl
import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

import zoo
from zoo.cli import main
from zoo.models.registry import checkpoint_folder
from zoo.utils import atomic

ROOT = Path(__file__).resolve().parents[1]
QS = ["--config", str(ROOT / "recipes" / "quickstart.yaml"), "--trainer.max_epochs", "1",
      "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
AS_ROOT = os.geteuid() == 0  # root writes into read-only folders: those cases cannot be made here


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (links not followed) and a hash of its bytes: what "untouched" is compared on."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def small_release(path: Path) -> Path:
    return zoo.create("fused-1d-tiny").save_pretrained(path)


# ---- 1. zoo check --json never writes into a release or over a foreign file ------------------


def test_check_json_refuses_a_release_folder_and_foreign_files(tmp_path):
    rel = small_release(tmp_path / "rel")
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit, match=r"^zoo check: error: --json .*config.json lies inside the release folder"):
        main(["check", str(rel), "--data-root", str(tmp_path / "data"), "--json", str(rel / "config.json")])
    with pytest.raises(SystemExit, match="lies inside the release folder"):
        main(["check", str(rel), "--data-root", str(tmp_path / "data"), "--json", str(rel / "table.json")])
    (tmp_path / "notes.txt").write_text("mine")
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit, match="notes.txt exists and is not a zoo check table"):
        main(["check", str(rel), "--data-root", str(tmp_path / "data"), "--json", str(tmp_path / "notes.txt")])
    assert snapshot(tmp_path) == before
    zoo.load(rel)  # the release still loads

    from zoo.release.check import check_table_path

    previous = tmp_path / "table.json"
    previous.write_text(json.dumps([{"release": "r", "metric": "test/acc", "ok": True}]))
    assert check_table_path(previous, [rel]) == previous  # a previous table is replaced
    assert check_table_path(tmp_path / "new.json", [rel]) == tmp_path / "new.json"


# ---- 2. zoo export NAME never overwrites the shipped folder it reads -------------------------


def test_export_by_name_refuses_its_own_shipped_folder(tmp_path):
    shipped = checkpoint_folder("micro-vit-tiny.mnist")
    before = snapshot(shipped)
    with pytest.raises(SystemExit, match="overlaps the model it exports"):
        main(["export", "micro-vit-tiny.mnist", str(shipped), "--overwrite"])
    with pytest.raises(SystemExit, match="lies inside the release folder it exports"):
        main(["export", "micro-vit-tiny.mnist", str(shipped / "copy")])
    assert snapshot(shipped) == before


# ---- 3. DrawPictures never writes through a link ---------------------------------------------


def csv_trainer(tmp_path: Path):
    from types import SimpleNamespace

    from lightning.pytorch.loggers import CSVLogger

    logger = CSVLogger(tmp_path / "logs", version=0)
    Path(logger.log_dir).mkdir(parents=True)
    return SimpleNamespace(is_global_zero=True, loggers=[logger]), logger


def test_draw_pictures_refuses_a_link_or_file_where_its_folder_goes(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from zoo.training.pictures import DrawPictures

    user = tmp_path / "user"
    user.mkdir()
    (user / "attention.png").write_bytes(b"my own picture")
    trainer, logger = csv_trainer(tmp_path)
    pictures = Path(logger.log_dir) / "pictures"
    pictures.symlink_to(user, target_is_directory=True)
    before = snapshot(user)
    with pytest.raises(FileExistsError, match="pictures, which is a link"):
        DrawPictures().setup(trainer, None, "fit")
    figure = plt.figure()
    with pytest.raises(FileExistsError, match="which is a link"):  # a link made after setup: still refused
        DrawPictures._log(logger, {"attention": (figure, None)}, 0, 0)
    plt.close(figure)
    assert snapshot(user) == before
    pictures.unlink()
    pictures.write_text("a file")
    with pytest.raises(FileExistsError, match="pictures, which is a file"):
        DrawPictures().setup(trainer, None, "fit")
    assert pictures.read_text() == "a file"
    pictures.unlink()
    DrawPictures().setup(trainer, None, "fit")  # a plain folder: accepted and written
    figure = plt.figure()
    DrawPictures._log(logger, {"attention": (figure, None)}, 3, 0)
    plt.close(figure)
    assert (pictures / "epoch-3" / "attention.png").read_bytes()[:4] == b"\x89PNG"
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="every_n_epochs must be an integer >= 1"):
            DrawPictures(every_n_epochs=bad)


@pytest.mark.skipif(AS_ROOT, reason="root writes into read-only folders")
def test_draw_pictures_refuses_a_read_only_log_folder(tmp_path):
    from zoo.training.pictures import DrawPictures

    trainer, logger = csv_trainer(tmp_path)
    os.chmod(logger.log_dir, 0o555)
    try:
        with pytest.raises(PermissionError, match="not writable"):
            DrawPictures().setup(trainer, None, "fit")
    finally:
        os.chmod(logger.log_dir, 0o755)


# ---- 4. the benchmarks' lock never truncates a linked file -----------------------------------


@pytest.mark.bench
def test_bench_lock_never_follows_a_link(tmp_path, monkeypatch):
    from bench import common

    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    (tmp_path / "results").mkdir()
    victim = tmp_path / "thesis.tex"
    victim.write_text("three years of work")
    (tmp_path / "results" / "attention.lock").symlink_to(victim)
    with pytest.raises(FileExistsError, match="attention.lock is a symbolic link"):
        with common.locked("attention"):
            pass
    assert victim.read_text() == "three years of work"
    with common.locked("models"):  # a plain lock file still serializes: a second holder is turned away
        with open(tmp_path / "results" / "models.lock") as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


# ---- 5. two fits on one root never share a checkpoint or log folder ---------------------------


def hold_run_lock(folder: Path, who: str) -> int:
    """Take the lock a running fit holds on its checkpoint folder, as that run would: the overlap, forced."""
    fd = atomic.open_lock("run-" + atomic.lock_name(folder))
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
    os.write(fd, who.encode())
    return fd


def test_a_second_fit_on_a_held_checkpoint_folder_is_refused_at_once(tmp_path):
    ckdir = tmp_path / "root" / "checkpoints" / "run"
    fd = hold_run_lock(ckdir, "pid 4242: zoo fit --config a.yaml")
    try:
        refused = r"another run \(pid 4242: zoo fit --config a.yaml\) is writing checkpoints to .*checkpoints/run"
        with pytest.raises((SystemExit, FileExistsError), match=refused):
            main(["fit", *QS, "--trainer.default_root_dir", str(tmp_path / "root"),
                  "--checkpoint.dirpath", str(ckdir), "--export.dirpath", str(tmp_path / "out")])
    finally:
        os.close(fd)
    assert not ckdir.exists() or not any(ckdir.iterdir())  # refused in setup: no checkpoint written
    assert not (tmp_path / "out").exists()


def test_runs_claimed_together_get_their_own_versions_and_release_their_lock(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from zoo.training.runs import claim_run, release_run

    def trainer(ckdir):
        return L.Trainer(default_root_dir=tmp_path, logger=CSVLogger(tmp_path), enable_progress_bar=False,
                         callbacks=[ModelCheckpoint(dirpath=ckdir)], enable_model_summary=False)

    first, second = trainer(tmp_path / "ck-a"), trainer(tmp_path / "ck-b")
    # Both loggers are made before either writes: unclaimed, both would count version 0.
    assert first.logger._get_next_version() == second.logger._get_next_version() == 0
    claim_run(first)
    claim_run(second)
    assert (first.logger.version, second.logger.version) == (0, 1)
    assert sorted(p.name for p in (tmp_path / "lightning_logs").iterdir()) == ["version_0", "version_1"]
    third = trainer(tmp_path / "ck-a")
    with pytest.raises(FileExistsError, match=f"pid {os.getpid()}"):
        claim_run(third)
    release_run(first)
    claim_run(third)  # the first run ended: its folder is free again
    release_run(second)
    release_run(third)


# ---- 6. output paths: each works, or is refused before any work ------------------------------


def test_export_refuses_a_link_loop_and_a_path_through_a_file(tmp_path):
    source = small_release(tmp_path / "src")
    loop = tmp_path / "out"
    loop.symlink_to("out")
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit, match="out is a symbolic link"):
        main(["export", str(source), str(loop)])
    (tmp_path / "f.txt").write_text("notes")
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit, match=r"f.txt is a file, not a folder"):
        main(["export", str(source), str(tmp_path / "f.txt" / "out")])
    with pytest.raises(NotADirectoryError, match=r"f.txt is a file, not a folder"):
        atomic.write_text_atomic(tmp_path / "f.txt" / "table.json", "[]")
    with pytest.raises(NotADirectoryError, match=r"out cannot be followed"):
        atomic.write_text_atomic(loop / "table.json", "[]")
    assert snapshot(tmp_path) == before


def test_a_240_character_folder_name_works(tmp_path):
    long = tmp_path / ("m" * 240)
    model = zoo.create("fused-1d-tiny")
    small_release(long)
    small_release(long)  # replaced: staging and swap names fit too
    assert [p.name for p in tmp_path.iterdir()] == [long.name]
    assert zoo.load(long).state_dict().keys() == model.state_dict().keys()
    text = atomic.write_text_atomic(tmp_path / ("t" * 250), "whole")
    assert text.read_text() == "whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([long.name, "t" * 250])


def test_export_to_dot_in_an_empty_folder_works(tmp_path, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    inode = here.stat().st_ino
    monkeypatch.chdir(here)
    main(["export", "micro-vit-tiny.mnist", "."])
    assert sorted(os.listdir(".")) == ["README.md", "config.json", "model.safetensors"]
    assert here.stat().st_ino == inode  # filled where it is: a shell standing in it still sees it
    assert sorted(os.listdir(tmp_path)) == ["here"]  # no staging folder left beside it
    shipped = zoo.load("micro-vit-tiny.mnist").state_dict()
    for name, tensor in zoo.load(".").state_dict().items():
        assert torch.equal(tensor, shipped[name]), name


def test_fit_refuses_an_export_folder_or_root_through_a_file_before_training(tmp_path):
    from zoo.release.callback import ExportRelease
    from zoo.training.runs import claim_run

    (tmp_path / "f.txt").write_text("notes")
    trainer = L.Trainer(default_root_dir=tmp_path / "root", logger=False, enable_checkpointing=False)
    with pytest.raises(NotADirectoryError, match="the export folder .*f.txt/out: .*f.txt is a file, not a folder"):
        ExportRelease(dirpath=str(tmp_path / "f.txt" / "out")).setup(trainer, None, "fit")
    for root in ("f.txt", "f.txt/root"):
        trainer = L.Trainer(default_root_dir=tmp_path / root, logger=False, enable_checkpointing=False)
        with pytest.raises(NotADirectoryError, match="trainer.default_root_dir .*f.txt is a file"):
            claim_run(trainer)
    assert (tmp_path / "f.txt").read_text() == "notes"


@pytest.mark.skipif(AS_ROOT, reason="root writes into read-only folders")
def test_a_read_only_export_parent_is_refused_before_training(tmp_path):
    from zoo.release.callback import ExportRelease

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    trainer = L.Trainer(default_root_dir=tmp_path / "root", logger=False, enable_checkpointing=False)
    try:
        with pytest.raises(PermissionError, match="locked is not writable"):
            ExportRelease(dirpath=str(locked / "out")).setup(trainer, None, "fit")
    finally:
        locked.chmod(0o755)


# ---- 7. a stray lock folder or a planted lock link never blocks a save -----------------------


def test_a_stray_lock_file_or_planted_link_neither_blocks_nor_is_followed(tmp_path, monkeypatch):
    locks = tmp_path / "tmp" / "zoo-locks"
    locks.parent.mkdir()
    monkeypatch.setattr(atomic, "LOCKS", locks)
    locks.write_text("a stray file")
    folder = small_release(tmp_path / "a")
    assert locks.read_text() == "a stray file"
    own = locks.with_name(f"zoo-locks-{os.getuid()}")
    assert stat.S_IMODE(own.stat().st_mode) == 0o700
    with atomic.locked(folder):  # still one writer at a time
        other = atomic.open_lock(atomic.lock_name(folder))
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(other)

    locks.unlink()
    locks.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (locks / atomic.lock_name(folder)).symlink_to(victim)
    small_release(folder)  # saved again, through this user's own lock folder
    assert victim.read_text() == "keep me"
    with atomic.locked(folder):
        other = atomic.open_lock(atomic.lock_name(folder))
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(other)


# ---- 8. written files get the usual mode; killed writers' temporaries are removed ------------


def test_written_files_get_the_usual_mode_and_keep_their_own(tmp_path):
    old = os.umask(0o022)
    try:
        new = atomic.write_text_atomic(tmp_path / "result.json", "{}")
        assert stat.S_IMODE(new.stat().st_mode) == 0o644
        new.chmod(0o640)
        atomic.write_text_atomic(new, "{}")
        assert stat.S_IMODE(new.stat().st_mode) == 0o640
    finally:
        os.umask(old)


def test_a_later_write_removes_the_temporaries_of_killed_writers(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".result.json.{dead.pid}.abcd1234.tmp"
    stale.write_bytes(b"\0" * (1 << 20))
    live = tmp_path / f".result.json.{os.getppid()}.live0000.tmp"  # a writer still running: left alone
    live.write_bytes(b"half")
    foreign = tmp_path / ".result.json.notes.tmp"
    foreign.write_bytes(b"not ours")
    atomic.write_text_atomic(tmp_path / "result.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["result.json", live.name, foreign.name])


# ---- 9. zoo export refuses NaN weights before writing ----------------------------------------


def test_export_refuses_a_checkpoint_with_nan_weights(tmp_path):
    from zoo.training import ClassificationTask

    task = ClassificationTask(model_name="fused-1d-tiny")
    state = task.state_dict()
    state["model.head.weight"][0, 0] = float("nan")
    torch.save({"state_dict": state, "hyper_parameters": dict(task.hparams),
                "pytorch-lightning_version": L.__version__}, tmp_path / "nan.ckpt")
    for extra in ([], ["--format", "onnx"]):
        with pytest.raises(SystemExit, match=r"nan.ckpt: tensor 'head.weight' holds NaN or inf"):
            main(["export", str(tmp_path / "nan.ckpt"), str(tmp_path / "out"), *extra])
    assert sorted(os.listdir(tmp_path)) == ["nan.ckpt"]


# ---- 10. zoo check: workers capped, missing data refused in one line -------------------------


def test_check_caps_workers_and_refuses_missing_data_without_touching_the_root(tmp_path, capsys):
    from zoo.release.check import cores, datamodule_for

    config = json.loads((checkpoint_folder("micro-vit-tiny.mnist") / "config.json").read_text())
    config["training"]["data"]["init_args"]["num_workers"] = 64
    assert datamodule_for(config, tmp_path).num_workers == min(64, cores())
    empty = tmp_path / "data"
    empty.mkdir()
    with pytest.raises(SystemExit, match=r"^zoo check: error: micro-vit-tiny.mnist: the MNIST data is not under the "
                                         r"data root .*data; give --data-root"):
        main(["check", "micro-vit-tiny.mnist", "--data-root", str(empty)])
    assert os.listdir(empty) == []
    assert "http" not in capsys.readouterr().out


def test_bytes_are_written_whole_as_text_is(tmp_path):
    png = bytes(range(256)) * 4  # every byte value, no newline translation
    path = atomic.write_bytes_atomic(tmp_path / "picture.png", png)
    assert path.read_bytes() == png
    path.chmod(0o600)
    atomic.write_bytes_atomic(path, b"again")  # replaced, keeping the file's own mode, no temporary left
    assert path.read_bytes() == b"again" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["picture.png"]
    with pytest.raises(IsADirectoryError, match="expected the path of a file"):
        atomic.write_bytes_atomic(tmp_path, b"x")


@pytest.mark.bench
def test_bench_pictures_are_written_whole(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from bench.common import save_figure

    figure = Figure()
    figure.add_subplot().plot([0, 1], [1, 0])
    save_figure(figure, tmp_path / "new" / "line.png")
    assert (tmp_path / "new" / "line.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["line.png"]


def _write_many(path, fill: int) -> None:
    for _ in range(20):
        atomic.write_bytes_atomic(path, bytes([fill]) * 300_000)


def test_bytes_from_two_processes_at_once_leave_one_whole_file_and_a_wrong_type_nothing(tmp_path):
    import multiprocessing

    path = tmp_path / "picture.png"
    writers = [multiprocessing.get_context("fork").Process(target=_write_many, args=(path, fill)) for fill in (1, 2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=60)
    assert [writer.exitcode for writer in writers] == [0, 0]
    data = path.read_bytes()
    assert data in (b"\x01" * 300_000, b"\x02" * 300_000)  # one writer's whole file, never a mix
    assert [p.name for p in tmp_path.iterdir()] == ["picture.png"]
    with pytest.raises(TypeError, match="bytes-like"):  # text where bytes belong: the file there stays as it was
        atomic.write_bytes_atomic(path, "text")
    assert path.read_bytes() == data and [p.name for p in tmp_path.iterdir()] == ["picture.png"]


def test_check_refuses_a_standard_library_release_on_another_pythons_text(tmp_path):
    # the standard library differs between Python versions: measured on another's, a card's figures would not
    # come back, through no fault of the weights
    folder = tmp_path / "elita-gpt-mini.stdlib"
    zoo.create("elita-gpt-mini", embed_dim=32, depth=1, num_heads=2).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["metrics"] = {"val/loss": 1.2}
    config["training"] = {"command": "zoo fit --config recipes/elita-gpt-mini.stdlib.yaml", "data": {
        "name": "Python standard library source", "source": "734 .py files of /opt/python3.11.0/lib/python3.11",
        "class_path": "zoo.data.sequences.LongContextText",
        "init_args": {"path": "stdlib", "context_length": 64, "batch_size": 4, "val_windows": 2},
        "splits": "first 10 characters training, last 2 validation and test (character tokenizer, 5 tokens)"}}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit, match=r"^zoo check: error: elita-gpt-mini.stdlib was measured on 734 .py files of "
                                         r"/opt/python3.11.0/lib/python3.11 \(first 10 characters .*\); this Python's "
                                         r"standard library is another text \(first [\d,]+ characters.*\): check it "
                                         r"with that Python$"):
        main(["check", str(folder), "--data-root", str(tmp_path)])
