"""The `zoo` command as a stranger meets it: every command listed, a version, recipes by name, and
every error a user can fix said in one line, `zoo COMMAND: error: ...` (the traceback behind --debug)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zoo.cli import HELP, main
from zoo.cli.recipes import list_recipes

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
         "--trainer.enable_progress_bar", "false"]


def error_of(argv: list[str]) -> str:
    """The message `zoo` exits with; it must be one line."""
    with pytest.raises(SystemExit) as exit:
        main(argv)
    message = str(exit.value)
    assert message.count("\n") == 0, message
    return message


def test_help_lists_every_command_with_one_line_each(capsys):
    main(["--help"])
    out = capsys.readouterr().out
    for command in ["fit", "validate", "test", "predict", "models", "recipes", "export", "push", "check",
                    "generate", "viz", "report", "build-kernels", "evaluate", "leaderboard"]:
        assert any(line.split()[:1] == [command] for line in out.splitlines()), command
    assert set(HELP) >= {"fit", "export", "recipes"} and "--version" in out and "--debug" in out


def test_version_names_the_distribution(capsys):
    import zoo

    main(["--version"])
    assert capsys.readouterr().out.strip() == f"attention-zoo {zoo.__version__} (import name zoo)"


def test_an_unknown_command_names_the_closest():
    assert error_of(["fitt"]) == "zoo: error: unknown command 'fitt'; did you mean fit? (zoo --help lists them)"


def test_recipes_are_listed_and_every_one_is_a_file_in_recipes(capsys):
    main(["recipes"])
    out = capsys.readouterr().out
    shipped = sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))
    assert sorted(list_recipes()) == shipped and all(name in out for name in shipped)


@pytest.mark.parametrize("argv", [["recipes"], ["--help"]])
def test_a_reader_that_leaves_early_gets_no_error(argv):
    """`zoo recipes | head -1`: the pipe closes before zoo has written all; no 'Broken pipe' error, status 141."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has already gone, so the first write fails (deterministically, not by a race)
    try:
        out = subprocess.run([sys.executable, "-m", "zoo.cli", *argv], stdout=write_end, stderr=subprocess.PIPE,
                             text=True, timeout=60)
    finally:
        os.close(write_end)
    assert (out.returncode, out.stderr) == (141, "")


def test_a_broken_connection_elsewhere_is_still_an_error():
    """Only a closed stdout ends zoo quietly: a broken pipe from anything else (an upload) is reported."""
    code = ("import zoo.cli.models as m\n"
            "def broken(argv): raise BrokenPipeError('the connection to the Hub closed')\n"
            "m.recipes_command = broken\n"
            "from zoo.cli import main; main(['recipes'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and out.stderr.strip() == "zoo recipes: error: the connection to the Hub closed"


def test_a_broken_pipe_with_no_file_behind_stdout_is_an_error(monkeypatch, capsys):
    """In-process, stdout captured (no descriptor): a broken pipe cannot be stdout's, so it is reported."""
    import zoo.cli.models

    def broken(argv):
        raise BrokenPipeError("the connection to the Hub closed")

    monkeypatch.setattr(zoo.cli.models, "recipes_command", broken)
    assert error_of(["recipes"]) == "zoo recipes: error: the connection to the Hub closed"


def test_a_recipe_name_resolves_and_a_path_of_the_same_name_wins(tmp_path, monkeypatch, capsys):
    from zoo.cli.lightning import resolve_configs

    monkeypatch.chdir(tmp_path)
    assert resolve_configs(["fit", "--config", "quickstart"]) == ["fit", "--config",
                                                                   str(list_recipes()["quickstart"])]
    (tmp_path / "quickstart").write_text("data: {class_path: zoo.data.Digits}\n")
    assert resolve_configs(["fit", "--config=quickstart"]) == ["fit", "--config", "quickstart"]
    assert "reading the file ./quickstart" in capsys.readouterr().err


@pytest.mark.parametrize("content,message", [
    (b"data: \xff\xfe\n", "is not UTF-8 text"),
    (b"- a\n- b\n", "must hold a mapping (seed_everything, trainer, model, data, ...), got a YAML list"),
    (b"trainer: {max_epochs: 1}\n", "has no data: section and no --data was given"),
    (b"trainer: [\n", "is not plain YAML at line"),
])
def test_a_bad_recipe_is_one_line(tmp_path, content, message):
    (tmp_path / "r.yaml").write_bytes(content)
    assert message in error_of(["fit", "--config", str(tmp_path / "r.yaml")])


def test_a_python_tag_in_a_recipe_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "r.yaml").write_text(f'data: !!python/object/apply:os.system ["touch {marker}"]\n')
    assert "could not determine a constructor for the tag" in error_of(["fit", "--config", str(tmp_path / "r.yaml")])
    assert not marker.exists()


def test_an_unknown_recipe_name_lists_the_closest():
    message = error_of(["fit", "--config", "quickstartt"])
    assert "no packaged recipe of that name; closest: quickstart" in message


@pytest.mark.parametrize("override,message", [
    (["--trainer.max_epochs", "1e9"], "trainer.max_epochs: expected int; got '1e9'"),
    (["--trainer.precision", "autoo"], "trainer.precision: expected int or 'transformer-engine'"),
    (["--model.init_args.lr", "nan"], "model.init_args.lr: expected float; got 'nan'"),
    (["--model.init_args.lr", "-1"], "lr must be a finite number above 0, got -1.0"),
    (["--model.init_args.warmup_steps", "-3"], "warmup_steps must be an integer of at least 0, got -3"),
    (["--seed_everything", "-1"], "seed_everything must be between 0 and 4294967295"),
    (["--trainer.max_epochs", "-2"], "`max_epochs` must be a non-negative integer or -1"),
    (["--trainer.devices", "0"], "value is not a valid input using cpu accelerator"),
    (["--data", "os.system"], "data: Import path does not correspond to a subclass of LightningDataModule"),
    (["--model.init_args.model_overrides", "{depth: -1}"], "depth must be between 0 and"),
    (["--export.target", "bogus"], "export.target must read 'METRIC >= VALUE (source)'"),
    (["--export.push_to", "../x"], "expected a Hub repository id like 'org/name'"),
])
def test_lightning_and_jsonargparse_errors_are_one_line(tmp_path, override, message):
    got = error_of(["fit", "--config", "quickstart", *QUICK, "--trainer.default_root_dir", str(tmp_path), *override])
    assert got.startswith("zoo fit: error: ") and message in got, got


def test_debug_keeps_the_traceback(tmp_path):
    with pytest.raises(ValueError, match="lr must be a finite number"):
        main(["fit", "--debug", "--config", "quickstart", *QUICK, "--trainer.default_root_dir", str(tmp_path),
              "--model.init_args.lr", "-1"])


def test_generate_on_an_image_model_says_so():
    message = error_of(["generate", "micro-vit-tiny.mnist"])
    assert message.startswith("zoo generate: error: micro-vit-tiny.mnist (ImageTransformer) does not generate text")


def test_build_kernels_refuses_when_turned_off(monkeypatch):
    monkeypatch.setenv("ZOO_NATIVE", "0")
    assert error_of(["build-kernels"]) == "zoo build-kernels: error: ZOO_NATIVE=0 turns the kernels off; unset it to " \
                                          "build them"


@pytest.mark.slow  # two first builds of the kernels at once, about 30 s on 2 cores
def test_two_build_kernels_at_once_on_an_empty_cache_build_once(tmp_path):
    """Both processes end with working kernels; the second waits on the build's lock and loads the first's, so
    exactly one says it is building (the build is two compiler units side by side, bindings.cpp and kernels.cpp)."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    check = ("import sys, torch; from zoo.cli import main; from zoo.attention import native; main(['build-kernels']); "
             "x = torch.randn(3, 9); assert torch.allclose(native.softmax_one(x), "
             "x.exp() / (1 + x.exp().sum(-1, keepdim=True)), atol=1e-6)")
    runs = [subprocess.Popen([sys.executable, "-c", check], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    outs = [run.communicate(timeout=600) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err[-2000:] for _, err in outs]
    assert sum("building the compiled CPU kernels once" in err for _, err in outs) == 1, outs
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert sorted(p.name for p in folder.glob("*.o")) == ["bindings.o", "kernels.o"]


def test_no_spurious_warning_from_lightnings_cli(tmp_path):
    out = subprocess.run([sys.executable, "-m", "zoo.cli", "fit", "--config", "quickstart", *QUICK,
                          "--trainer.default_root_dir", str(tmp_path), "--model.init_args.lr", "-1"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 1 and "args parameter" not in out.stderr and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == "zoo fit: error: lr must be a finite number above 0, got -1.0"


@pytest.mark.slow
def test_processes_started_together_build_the_kernels_once(tmp_path):
    """Two processes on an empty kernel cache: one builds (saying so on stderr), the other waits and loads it."""
    import os

    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    code = "from zoo.attention import native; assert native.load() is not None"
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    errs = [p.communicate(timeout=900)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errs
    assert sum("building the compiled CPU kernels" in e for e in errs) == 1, errs


def test_a_recipe_file_named_with_its_suffix_wins_and_a_dangling_link_is_refused(tmp_path, monkeypatch, capsys):
    """`--config quickstart` with ./quickstart.yaml here reads that file, as the README says a local file wins;
    a dangling ./quickstart link is refused, never taken for the packaged recipe."""
    from zoo.cli.lightning import resolve_configs

    monkeypatch.chdir(tmp_path)
    (tmp_path / "quickstart.yaml").write_text("data: {class_path: zoo.data.Digits}\n")
    assert resolve_configs(["fit", "--config", "quickstart"]) == ["fit", "--config", "quickstart.yaml"]
    assert "reading the file ./quickstart.yaml" in capsys.readouterr().err
    (tmp_path / "quickstart.yaml").unlink()
    (tmp_path / "quickstart").symlink_to(tmp_path / "gone.yaml")
    assert "quickstart is a link to" in error_of(["fit", "--config", "quickstart"])


def test_zoo_without_a_command_is_a_usage_error():
    done = subprocess.run([sys.executable, "-m", "zoo.cli"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "usage: zoo COMMAND" in done.stderr and not done.stdout
    helped = subprocess.run([sys.executable, "-m", "zoo.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "usage: zoo COMMAND" in helped.stdout
