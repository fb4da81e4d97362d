"""zoo's image models are in timm's registry, and its text models in transformers' Auto classes, however and whenever
timm, transformers and zoo are imported.

Each order runs in a fresh interpreter: in this one, timm and zoo are long imported. The orders that matter
are those where something asks for timm's spec before importing it (transformers does, through
`importlib.util.find_spec("timm")`, when `import lightning` imports it); the bare find_spec case stands for it
where transformers is not installed.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = "import timm; assert timm.is_model('micro_vit_tiny'), 'micro_vit_tiny missing from timm'; " \
        "timm.create_model('micro_vit_tiny', pretrained=False)"

ORDERS = {
    "zoo, then timm": "import zoo",
    "timm, then zoo": "import timm, zoo",
    "zoo, find_spec('timm'), then timm": "import zoo, importlib.util; assert importlib.util.find_spec('timm')",
    "zoo, lightning, then timm": "import zoo, lightning",
    "lightning, zoo, then timm": "import lightning, zoo",
    "zoo.models alone, then timm": "import zoo.models",
}
WITH_TRANSFORMERS = {
    "zoo, transformers, then timm": "import zoo, transformers",
    "transformers, zoo, then timm": "import transformers, zoo",
}


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("order", list(ORDERS))
def test_models_reach_timm_in_any_import_order(order):
    done = _run(f"{ORDERS[order]}; {CHECK}")
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
@pytest.mark.parametrize("order", list(WITH_TRANSFORMERS))
def test_models_reach_timm_with_transformers_installed(order):
    done = _run(f"{WITH_TRANSFORMERS[order]}; {CHECK}")
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_hook_leaves_once_timm_is_imported():
    done = _run("import sys, zoo; from zoo.release.import_hook import hooked as waiting; "
                "hooked = lambda: waiting('timm'); assert hooked(); "
                "import importlib.util; importlib.util.find_spec('timm'); assert hooked(), 'left on a find_spec'; "
                "import timm; assert not hooked(), 'still there after timm was imported'")
    assert done.returncode == 0, done.stderr[-2000:]


# zoo's text models in transformers' Auto classes (zoo/release/transformers_hook.py), whichever comes first
LOAD = ("from transformers import AutoModelForCausalLM; "
        "m = AutoModelForCausalLM.from_pretrained('checkpoints/micro-gpt-tiny.shakespeare'); "
        "assert type(m).__name__ == 'ZooTextForCausalLM', type(m)")
TRANSFORMERS_ORDERS = {
    "zoo, then transformers": "import zoo",
    "transformers, then zoo": "import transformers, zoo",
    "transformers' Auto class, then zoo": "from transformers import AutoModelForCausalLM; import zoo",
    "zoo, find_spec('transformers'), then transformers":
        "import zoo, importlib.util; assert importlib.util.find_spec('transformers')",
}


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
@pytest.mark.parametrize("order", list(TRANSFORMERS_ORDERS))
def test_text_models_reach_transformers_in_any_import_order(order):
    done = subprocess.run([sys.executable, "-c", f"{TRANSFORMERS_ORDERS[order]}; {LOAD}"], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers is not installed")
def test_the_transformers_hook_leaves_once_transformers_is_imported_and_import_zoo_stays_light():
    done = _run("import sys, zoo; from zoo.release.import_hook import hooked as waiting; "
                "hooked = lambda: waiting('transformers'); "
                "assert hooked() and 'transformers' not in sys.modules, 'import zoo imported transformers'; "
                "import importlib.util; importlib.util.find_spec('transformers'); "
                "assert hooked(), 'left on a find_spec'; "
                "import transformers; assert not hooked(), 'still there after transformers was imported'; "
                "from transformers import CONFIG_MAPPING; assert 'zoo_text' in CONFIG_MAPPING")
    assert done.returncode == 0, done.stderr[-2000:]
