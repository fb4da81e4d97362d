"""`zoo fit` prints what its user needs (progress, metrics, where the run went) and none of the noise around it:
Lightning's advertising tip, start-up lines that say nothing or repeat another, warnings libraries raise about
each other. `--verbose` or ZOO_VERBOSE=1 prints all of it again (zoo/utils/quiet.py)."""

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests.conftest import data_root

REPO = Path(__file__).resolve().parents[1]
# seconds, not minutes: two training batches, one of validation, one of test, the release exported
TINY = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
        "--trainer.limit_test_batches", "1", "--trainer.log_every_n_steps", "1"]
RELEASE = "runs/quickstart/micro-vit-tiny.digits"  # the quickstart recipe's export.dirpath
# a warning as Python prints it (path:line: Category: message), or as Lightning prints its own (path:line: message)
WARNING_LINE = re.compile(r"\.py:\d+: ")


def fit(tmp_path: Path, *extra: str, env: dict | None = None) -> str:
    """stdout and stderr of `zoo fit --config quickstart` with a tiny budget, run as a user runs it: in a folder
    of their own, with a home of their own (no cache or setting of this machine's user changes what it says)."""
    home = tmp_path / "home"
    home.mkdir()
    # the checkout under test, whatever an installed zoo would be
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "HOME": str(home), "PYTHONPATH": path, "ZOO_VERBOSE": "", **(env or {})}
    done = subprocess.run([sys.executable, "-m", "zoo.cli", "fit", "--config", "quickstart", *TINY, *extra],
                          cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    return output


def test_fit_prints_progress_metrics_and_where_things_went_and_no_noise(tmp_path):
    output = fit(tmp_path)
    assert "litlogger" not in output and "Tip:" not in output, output
    assert "Warning" not in output and "deprecated" not in output.lower(), output
    assert not [line for line in output.splitlines() if WARNING_LINE.search(line)], output
    # start-up lines that say nothing (no TPU here) or say again what zoo's precision line said
    assert "TPU available" not in output and "Automatic Mixed Precision" not in output, output
    assert "estimate number of stepping batches" not in output, output
    lines = Counter(line.strip() for line in output.splitlines() if line.strip())
    assert not [line for line, count in lines.items() if count > 1], output
    # what the user needs: the metrics, where the release, the checkpoints and the logs went, why fit stopped
    assert f"exported {RELEASE} with {{'test/acc': " in output, output
    assert re.search(r"^checkpoints: best runs/checkpoints/\S+/best\.ckpt \(val/loss [\d.]+\), last \S+last\.ckpt; "
                     r"logs in runs/lightning_logs/version_0$", output, re.M), output
    assert "`Trainer.fit` stopped" in output and "precision auto ->" in output, output
    assert (tmp_path / RELEASE / "README.md").is_file()


def test_verbose_prints_what_fit_leaves_out(tmp_path):
    output = fit(tmp_path, "--verbose")
    assert "litlogger" in output and "TPU available: False" in output, output
    assert "Loading `train_dataloader` to estimate number of stepping batches" in output, output
    # the flag is zoo's, kept from Lightning's parser and from the config it saves beside the run
    (saved,) = (tmp_path / "runs" / "lightning_logs").glob("version_*/config.yaml")
    assert "verbose" not in yaml.safe_load(saved.read_text())


def test_zoo_verbose_asks_what_the_flag_asks(monkeypatch):
    """ZOO_VERBOSE=1 reaches the one switch `--verbose` reaches (the flag's whole run is above); the flag is taken
    out of what Lightning's parser sees."""
    from zoo.cli.lightning import split_verbose
    from zoo.utils.quiet import verbose_requested

    assert split_verbose(["fit", "--verbose", "--config", "x.yaml"]) == (["fit", "--config", "x.yaml"], True)
    assert split_verbose(["fit", "--config", "x.yaml"]) == (["fit", "--config", "x.yaml"], False)
    for value, asked in (("1", True), ("yes", True), ("", False), ("0", False), (None, False)):
        if value is None:
            monkeypatch.delenv("ZOO_VERBOSE", raising=False)
        else:
            monkeypatch.setenv("ZOO_VERBOSE", value)
        assert (verbose_requested(), verbose_requested(True)) == (asked, True), value


def test_verbose_and_every_data_module_and_task_are_in_fits_help():
    """In a fresh interpreter (zoo.data and zoo.training load their classes lazily, and jsonargparse lists and
    takes by short name only the subclasses Python has loaded): `zoo fit --help` names --verbose and every data
    module and task."""
    import zoo.data
    import zoo.training
    from zoo.cli import usage

    assert "--verbose" in usage() and "ZOO_VERBOSE=1" in usage()
    helped = subprocess.run([sys.executable, "-m", "zoo.cli", "fit", "--help"], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert helped.returncode == 0, helped.stderr[-2000:]
    assert "--verbose" in helped.stdout and "ZOO_VERBOSE=1" in helped.stdout, helped.stdout[-2000:]
    classes = [f"{package.__name__}.{name}" for package in (zoo.data, zoo.training) for name in package.__all__
               if name[0].isupper()]
    assert [name for name in classes if name not in helped.stdout] == []


@pytest.mark.skipif(data_root() is None, reason="shared data folder not found (set ZOO_DATA)")
def test_commands_that_do_not_train_leave_out_libraries_deprecations_too(tmp_path):
    """`zoo viz` (as every command but the Lightning ones) prints its answer, without the deprecations that
    libraries log or warn about each other (torch's pytree on torchao's enums, where torchao is installed: viz of
    a model's own test data reads zoo's data modules, which import Lightning, which imports torchao);
    ZOO_VERBOSE=1 lets them through."""
    import importlib.util

    home = tmp_path / "home"
    home.mkdir()
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

    def viz(verbose: str) -> str:
        out = tmp_path / f"pictures{verbose}"
        done = subprocess.run([sys.executable, "-m", "zoo.cli", "viz", "micro-vit-tiny.mnist", "--samples", "1",
                               "--data-root", str(data_root()), "--out", str(out)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300,
                              env={**os.environ, "HOME": str(home), "PYTHONPATH": path, "ZOO_VERBOSE": verbose})
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout, done.stderr  # stderr: its progress bar

    answer, progress = viz("")
    assert answer == f"wrote {tmp_path / 'pictures'}\n", answer
    assert "deprecated" not in progress.lower() and not WARNING_LINE.search(progress), progress
    if importlib.util.find_spec("torchao") is None:
        pytest.skip("torchao is not installed: no library deprecation to let through")
    assert "deprecated" in "".join(viz("1")).lower()


def test_lightnings_csv_logger_notice_is_left_out_unless_verbose():
    """Where TensorBoard is not installed (a fresh `pip install -e .`), Lightning says it logs to CSV and suggests
    `pip install lightning[extra]`; a quiet run leaves that out, a verbose one keeps it. Raised here as Lightning
    raises it (a UserWarning from its logger connector), since this environment has TensorBoard."""
    import warnings

    from zoo.utils.quiet import quiet_output

    notice = ("Starting from v1.9.0, `tensorboardX` has been removed as a dependency of the `lightning.pytorch` "
              "package, due to potential conflicts with other packages in the ML ecosystem.")
    module = "lightning.pytorch.trainer.connectors.logger_connector.logger_connector"
    for quiet, expected in ((True, 0), (False, 1)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with quiet_output(quiet):
                warnings.warn_explicit(notice, UserWarning, "logger_connector.py", 76, module=module)
        assert len([w for w in caught if "tensorboardX" in str(w.message)]) == expected
