"""Make the image models visible to `timm.create_model` without importing timm in `import zoo`.

If timm is already imported, register now; otherwise an import hook registers as soon as
timm finishes importing.

The hook stays in place until timm has actually been executed. Finding timm's spec is not
importing it: `importlib.util.find_spec("timm")` (which transformers calls while
`import lightning` imports it, to learn whether timm is installed) asks every finder on
`sys.meta_path`, this one included, and executes nothing. A hook that took itself away on
the first question would then be gone before the real import, and zoo's models would be
missing from timm's registry whenever transformers is installed.
"""

from __future__ import annotations

import importlib.abc
import sys


def register_with_timm() -> None:
    importing = sys.modules.get("zoo.release.timm_models")
    if importing is not None and not hasattr(importing, "register_with_timm"):
        return  # timm_models imported timm: it registers on its own last line
    from zoo.release.timm_models import register_with_timm

    register_with_timm()


class _AfterTimmImport(importlib.abc.MetaPathFinder):
    """Finds timm through the finders after it and wraps its loader: once timm's module has run, zoo's
    models are registered and the hook leaves `sys.meta_path`."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "timm":
            return None
        spec = None
        for finder in sys.meta_path[sys.meta_path.index(self) + 1:] if self in sys.meta_path else ():
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            register_with_timm()

        spec.loader.exec_module = exec_then_register
        return spec


if "timm" in sys.modules:
    register_with_timm()
elif not any(isinstance(f, _AfterTimmImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _AfterTimmImport())
