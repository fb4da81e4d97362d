"""A package whose names load from their modules on first use (PEP 562), so importing it stays light."""

from __future__ import annotations

import importlib
import sys


def lazy_attributes(package: str, homes: dict[str, str]):
    """The package's `__getattr__` and `__dir__`: `homes` maps each lazy name to the module that defines it; a name
    is imported on first access and then kept on the package."""

    def __getattr__(name: str):
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(homes[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__():
        return sorted([*vars(sys.modules[package]), *homes])

    return __getattr__, __dir__
