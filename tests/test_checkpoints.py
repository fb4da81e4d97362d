"""The shipped checkpoints: complete, small, honest cards, loadable offline, also from a wheel."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import zoo
from zoo.release.check import check, shipped_folders

from .conftest import data_root

REPO = Path(__file__).resolve().parents[1]
SHIPPED = shipped_folders()
PLANNED = ["micro-vit-tiny.mnist", "vit-tiny.mnist", "quiet-vit-tiny.mnist", "fused-pool-vit-tiny.mnist",
           "micro-vit-tiny.fashion", "fused-pool-vit-tiny.fashion",
           "vit-tiny.fashion", "quiet-vit-tiny.fashion", "fused-1d-tiny.mnist1d", "fused-2d-tiny.mnist",
           "fused-3d-tiny.adrenal", "gpt-tiny.shakespeare", "quiet-gpt-tiny.shakespeare",
           "micro-gpt-tiny.shakespeare", "elita-gpt-tiny.shakespeare",
           # issue 25: the in-context bias and the hybrids
           "incontext-gpt-tiny.shakespeare", "hybrid-micro-gpt-tiny.shakespeare", "hybrid-elita-gpt-tiny.shakespeare",
           "hybrid-micro-vit-tiny.mnist", "incontext-vit-tiny.mnist",
           "hybrid-micro-conv-gpt-tiny.shakespeare", "hybrid-elita-conv-gpt-tiny.shakespeare",
           "hybrid-elita-conv1-gpt-tiny.shakespeare",
           # issue 24: long context (2,048 characters of War and Peace); elita also without its sine positions
           # and with ALiBi's fading history instead, micro with its mean fading the same way; softmax also with
           # rotary positions, the fair baseline, and with ALiBi, the softmax positions said to extrapolate
           "gpt-tiny.warpeace", "gpt-tiny.warpeace-rope", "gpt-tiny.warpeace-alibi", "micro-gpt-tiny.warpeace",
           "elita-gpt-tiny.warpeace", "elita-gpt-tiny.warpeace-nopos",
           "elita-gpt-tiny.warpeace-alibi", "micro-gpt-tiny.warpeace-alibi",
           # the hybrids at 2,048: ELiTA, and micro, with the fading history and a rotary softmax block; micro
           # with short convolutions
           "hybrid-elita-gpt-tiny.warpeace", "hybrid-micro-gpt-tiny.warpeace", "hybrid-micro-conv-gpt-tiny.warpeace",
           # the field's yardsticks at 2,048 characters of War and Peace
           "deltanet-gpt-tiny.warpeace", "gla-gpt-tiny.warpeace", "window-gpt-tiny.warpeace", "ssd-gpt-tiny.warpeace",
           # issue 108: the mini size's runs that met both long-context targets (docs/capabilities/mini.md); kept
           # in the repository, out of the wheel
           "elita-gpt-mini.warpeace", "elita-gpt-mini.stdlib"]
IN_WHEEL = [n for n in PLANNED if "-mini." not in n]


def test_the_checkpoints_kept_out_of_the_wheel_are_named_where_an_installed_zoo_reads_them():
    from zoo.models.registry import IN_REPOSITORY_ONLY

    assert sorted(IN_REPOSITORY_ONLY) == sorted(set(PLANNED) - set(IN_WHEEL))


def test_a_checkpoint_kept_out_of_the_wheel_is_refused_saying_where_it_is(monkeypatch):
    import zoo.models.registry as registry

    monkeypatch.setattr(registry, "checkpoint_roots", lambda: [])  # as an installed wheel without the mini folders
    # without a tag, the mini models' default (War and Peace), though the standard library's sorts first
    for asked, folder in (("elita-gpt-mini.warpeace", "warpeace"), ("elita-gpt-mini", "warpeace"),
                          ("elita-gpt-mini.stdlib", "stdlib")):
        with pytest.raises(ValueError, match=rf"^elita-gpt-mini\.{folder}: not in the wheel .* source repository's "
                                             r"checkpoints/ folder"):
            zoo.load(asked)
    with pytest.raises(ValueError, match="no pretrained weights are shipped for 'gpt-mini'"):  # none anywhere
        zoo.load("gpt-mini")
    with pytest.raises(ValueError, match=r"tagged 'shakespeare'; available: warpeace \(in the source repository\), "
                                         r"stdlib \(in the source repository\)$"):
        registry.checkpoint_folder("elita-gpt-mini.shakespeare")
    monkeypatch.undo()  # in this checkout, where it is
    assert registry.checkpoint_folder("elita-gpt-mini") == REPO / "checkpoints" / "elita-gpt-mini.warpeace"


def test_every_planned_checkpoint_is_shipped():
    assert sorted(p.name for p in SHIPPED) == sorted(PLANNED)
    assert sorted(zoo.list_models(pretrained=True)) == sorted({n.split(".")[0] for n in PLANNED})
    # without a tag, an image model loads its MNIST checkpoint, not the first tag alphabetically (fashion)
    assert zoo.load("micro-vit-tiny").config["label_names"] == [str(i) for i in range(10)]
    assert zoo.load("micro-vit-tiny.fashion").config["label_names"][0] == "T-shirt/top"
    # a text model's default is its tiny-shakespeare checkpoint; War and Peace's goes by its tag
    assert zoo.load("elita-gpt-tiny").context_length == 64
    assert zoo.load("elita-gpt-tiny.warpeace").context_length == 2048


def test_readme_counts_the_shipped_checkpoints():
    readme = (REPO / "README.md").read_text()
    assert f"shipped with {len(IN_WHEEL)} pretrained checkpoints in the wheel" in readme


def test_train_all_retrains_every_planned_checkpoint():
    script = (REPO / "checkpoints" / "train_all.sh").read_text()
    listed = script.split("recipes=(", 2)[2].split(")", 1)[0].split()  # the default list, after "recipes=("$@")"
    assert sorted(listed) == sorted(PLANNED)


@pytest.mark.parametrize("folder", SHIPPED, ids=lambda p: p.name)
def test_shipped_checkpoint_is_complete_and_its_card_honest(folder):
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    # every checkpoint under 10 MB: a mini one (4 to 6 million parameters) stores its weights in bfloat16, its card
    # measured on them; the wheel carries the tiny ones only
    assert sum(p.stat().st_size for p in folder.iterdir()) < 10e6
    config = json.loads((folder / "config.json").read_text())
    card = (folder / "README.md").read_text()
    training = config["training"]
    assert config["metrics"] and training["command"].startswith("zoo fit --config recipes/")
    recipe = training["command"].split()[3]
    assert (REPO / recipe).is_file() and folder.name in (REPO / recipe).read_text()
    assert card.startswith("---\nlibrary_name: zoo\nlicense: mit\n")
    for section in ("## Data", "## Results", "## Training", "## Use", "## Limitations"):
        assert section in card, section
    assert f"zoo check {folder.name}" in card and training["command"] in card
    for metric, value in config["metrics"].items():  # the card's table is the measured metrics, nothing else
        assert f"| {metric} | {value} |" in card
    if training["data"].get("source"):  # a text read from no file (the standard library's) names where it was read
        assert f"{training['data']['name']} ({training['data']['source']}): " in card
    if training["data"].get("hub_id"):
        assert f"datasets:\n- {training['data']['hub_id']}" in card
    with open(folder / "model.safetensors", "rb") as file:  # the header alone: its length, then its JSON
        header = json.loads(file.read(int.from_bytes(file.read(8), "little")))
    dtypes = {entry["dtype"] for name, entry in header.items() if name != "__metadata__"}
    if training.get("weights_dtype"):  # rounded to fit: the card says its metrics are measured on what is stored
        assert dtypes == {"BF16"} and training["weights_dtype"] == "bfloat16"
        assert "Measured in float32 on the weights as stored (bfloat16" in card
    else:
        assert dtypes == {"F32"} and "Measured at export in float32" in card
    model = zoo.load(folder.name)
    assert not model.training
    params = sum(p.numel() for p in model.parameters())
    assert f"{params:,} parameters" in card
    board = config.get("leaderboard")
    if board:  # a seed-0 run of bench/leaderboard.py: its card gives the table's mean and spread, from the JSON
        table = json.loads((REPO / board["results"]).read_text())
        record = table["runs"][f"{board['group']}/{config['model_name']}/seed0"]
        assert record["metrics"] == config["metrics"] and board["values"][board["seeds"].index(0)] == record["metric"]
        cell = next(c for c in table["cells"] if (c["group"], c["model"]) == (board["group"], config["model_name"]))
        assert (board["mean"], board["std"], board["values"]) == (cell["mean"], cell["std"], cell["values"])
        assert f"{board['metric']} {board['mean']:.4f}" in card and "seed-0 run of the leaderboard" in card
        if len(board["seeds"]) > 1:
            assert f"one run of {len(board['seeds'])}" in card and "One training run with one seed" not in card
        else:  # a group of one seed so far: the card says it is one run, with no spread to compare by
            assert "One training run with one seed" in card and "one run of" not in card
        if training.get("target"):  # how many seeds met it, counted again from the JSON
            _, op, value = training["target"].split()[:3]
            met = sum(v >= float(value) if op == ">=" else v <= float(value) for v in cell["values"])
            counted = "Every seed meets" if met == len(cell["values"]) else f"{met} of {len(cell['values'])} seeds"
            assert counted in card


def test_three_lines_classify_a_real_digit():
    root = data_root()
    if root is None or "micro-vit-tiny.mnist" not in {p.name for p in SHIPPED}:
        pytest.skip("needs the shared data folder (ZOO_DATA) and the shipped micro-vit-tiny.mnist")
    import torchvision

    test = torchvision.datasets.MNIST(str(root), train=False, download=False)
    model = zoo.load("micro-vit-tiny.mnist")
    hits = sum(model.classify(test[i][0])[0][0] == str(test[i][1]) for i in range(50))  # PIL images, as they come
    assert hits >= 48


def test_three_lines_generate_text():
    if "gpt-tiny.shakespeare" not in {p.name for p in SHIPPED}:
        pytest.skip("gpt-tiny.shakespeare is not shipped")
    model = zoo.load("gpt-tiny.shakespeare")
    a = model.generate("ROMEO:", max_new_tokens=100, seed=0)
    assert a == model.generate("ROMEO:", max_new_tokens=100, seed=0) and a.startswith("ROMEO:") and len(a) == 106
    words = a.split()
    assert sum(w.strip(",.;:!?'").lower() in {"the", "and", "to", "i", "of", "a", "my", "you", "that", "in", "is",
                                              "not", "me", "it", "with", "be", "your", "he", "his", "for", "thou"}
               for w in words) >= 2


@pytest.mark.skipif(not SHIPPED, reason="no checkpoints in this checkout")
def test_wheel_in_a_fresh_environment_is_the_product(tmp_path):
    """The wheel a stranger installs, in a fresh virtual environment, used from outside the source tree:
    it carries the checkpoints (zoo.load offline), the recipes (`zoo fit --config quickstart`), py.typed
    and every subpackage, under its own distribution name."""
    src = tmp_path / "src"
    src.mkdir()
    for item in ("pyproject.toml", "README.md", "zoo", "checkpoints", "recipes"):
        copy = shutil.copytree if (REPO / item).is_dir() else shutil.copy
        copy(REPO / item, src / item, **({"ignore": shutil.ignore_patterns("__pycache__")} if copy is shutil.copytree
                                         else {}))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist")], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("attention_zoo-*.whl")
    assert wheel.stat().st_size < 100e6  # PyPI's limit for one file
    import zipfile

    carried = {Path(n).parent.name for n in zipfile.ZipFile(wheel).namelist() if n.startswith("zoo/checkpoints/")}
    assert sorted(carried - {"checkpoints"}) == sorted(IN_WHEEL)  # the tiny ones, every file of each
    # The dependencies come from this interpreter's site-packages (they are not what is tested, and the
    # machine has no network for them); zoo itself only from the wheel. They are named in a .pth file, not
    # reached by --system-site-packages: run from a virtual environment, that would give the base interpreter's
    # packages (without torch), not this environment's. Paths a .pth file adds have their own .pth files left
    # unread, so this environment's editable zoo (a .pth file's import hook) stays out of the new one.
    venv = tmp_path / "venv"  # without a pip of its own (6 s to install): this one installs into it
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python, zoo_command = venv / "bin" / "python", venv / "bin" / "zoo"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    dependencies = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]
    (Path(purelib) / "suite_dependencies.pth").write_text("\n".join(dependencies) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, capture_output=True)
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    name = SHIPPED[0].name
    packages = sorted(".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "zoo").rglob("__init__.py"))
    # One process (each pays ~10 s to import Lightning): the checks, then `zoo fit --config quickstart` through
    # the console script's entry point as the wheel declares it (the script itself runs `--version` below).
    fit = ["fit", "--config", "quickstart", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
           "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false"]
    code = ("import zoo, sys, importlib, importlib.resources as r, importlib.metadata as md; "
            "m = zoo.load(sys.argv[1]); "
            f"[importlib.import_module(p) for p in {packages!r}]; "  # every subpackage made it into the wheel
            "print(zoo.__file__); print(sorted(zoo.list_models(pretrained=True))); print(m.training); "
            "print(r.files('zoo').joinpath('py.typed').is_file(), flush=True)\n"
            "try: zoo.load('elita-gpt-mini.warpeace')\n"  # out of the wheel: the refusal says where it is
            "except ValueError as e: print(e, flush=True)\n"
            "(script,) = md.entry_points(group='console_scripts', name='zoo'); "
            f"sys.argv = ['zoo', *{fit!r}]; sys.exit(script.load()())")
    out = subprocess.run([python, "-c", code, name], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    file, listed, training, typed, mini = out.stdout.strip().splitlines()[:5]
    assert "not in the wheel" in mini and "source repository's checkpoints/" in mini
    assert file.startswith(str(venv))  # the wheel's copy, not this checkout
    assert name.split(".")[0] in listed and "elita-gpt-mini" not in listed and training == "False" and typed == "True"
    assert "args parameter" not in out.stderr  # no spurious warning from the fit
    version = subprocess.run([zoo_command, "--version"], cwd=work, env=env, capture_output=True, text=True)
    assert version.stdout.startswith("attention-zoo ")
    recipes = subprocess.run([zoo_command, "recipes"], cwd=work, env=env, capture_output=True, text=True).stdout
    assert "quickstart" in recipes and str(venv) in recipes
    assert (work / "runs" / "quickstart" / "micro-vit-tiny.digits" / "model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("folder", SHIPPED, ids=lambda p: p.name)
def test_shipped_metrics_measure_again_within_tolerance(folder):
    root = data_root()
    if root is None:
        pytest.skip("needs the shared data folder (ZOO_DATA)")
    torch.set_num_threads(2)
    try:
        rows = check(folder, root)
    except ValueError as e:  # a standard-library checkpoint, on a Python whose library is another text
        if "this Python's standard library is another text" not in str(e):
            raise
        pytest.skip(str(e))
    assert rows and all(r["ok"] for r in rows), rows
