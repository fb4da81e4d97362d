"""zoo: a model zoo of lightweight attention mechanisms.

`import zoo` is light: torch and the heavy libraries load when something needs them.

    zoo.list_models("micro-*")
    model = zoo.create("micro-vit-tiny")      # random weights
    model = zoo.load("micro-vit-tiny")        # shipped weights, a release folder, or "hf-hub:org/repo"
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "attention": ("zoo.attention", None),
    "models": ("zoo.models", None),
    "list_models": ("zoo.models.registry", "list_models"),
    "create": ("zoo.models.registry", "create"),
    "load": ("zoo.models.pretrained", "load"),
    "save_pretrained": ("zoo.models.pretrained", "save_pretrained"),
    "CharTokenizer": ("zoo.models.tokenizer", "CharTokenizer"),
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'zoo' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = importlib.import_module(module)
    value = getattr(value, attr) if attr else value
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_LAZY])


# the image models reach timm's registry, and the text models transformers' Auto classes, once each is imported
from zoo.release import timm_hook, transformers_hook  # noqa: E402,F401
