"""Make the image models visible to `timm.create_model` without importing timm in `import zoo`.

If timm is already imported, register now; otherwise a one-shot import hook registers
as soon as timm finishes importing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys


def register_with_timm() -> None:
    importing = sys.modules.get("zoo.release.timm_models")
    if importing is not None and not hasattr(importing, "register_with_timm"):
        return  # timm_models imported timm: it registers on its own last line
    from zoo.release.timm_models import register_with_timm

    register_with_timm()


class _AfterTimmImport(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != "timm":
            return None
        sys.meta_path.remove(self)  # one shot: find the real spec without us
        spec = importlib.util.find_spec("timm")
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            register_with_timm()

        spec.loader.exec_module = exec_then_register
        return spec


if "timm" in sys.modules:
    register_with_timm()
elif not any(isinstance(f, _AfterTimmImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterTimmImport())
