"""Register zoo with a library once that library has been imported, without importing it in `import zoo`.

timm (zoo/release/timm_hook.py) and transformers (zoo/release/transformers_hook.py) are optional: `import zoo`
must not import them, yet zoo's models must be in their registries whenever they are. So a library already
imported is registered with at once; otherwise a finder on `sys.meta_path` wraps the library's loader and
registers as soon as the library's own module has run.

The hook stays in place until the library has actually been executed. Finding a spec is not importing:
`importlib.util.find_spec("timm")`, which libraries call to learn whether another is installed (transformers
asks for timm while `import lightning` imports it), asks every finder on `sys.meta_path`, this one included,
and executes nothing. A hook that took itself away on the first question would be gone before the real import,
and zoo would be missing from the registry.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable


class AfterImport(importlib.abc.MetaPathFinder):
    """Finds `name` through the finders after it and wraps its loader: once the module has run, `register` is
    called and the hook leaves `sys.meta_path`."""

    def __init__(self, name: str, register: Callable[[], None]):
        self.name, self.register = name, register

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
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
            self.register()

        spec.loader.exec_module = exec_then_register
        return spec


def imported(name: str) -> bool:
    """Whether module `name` has finished running (not absent, nor half-way through its own import)."""
    module = sys.modules.get(name)
    return module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False)


def hooked(name: str) -> bool:
    """Whether a hook waits for `name` on `sys.meta_path`."""
    return any(isinstance(finder, AfterImport) and finder.name == name for finder in sys.meta_path)


def register_after_import(name: str, register: Callable[[], None]) -> None:
    """Call `register` now if `name` is imported, else once it is (one hook per name, however often called)."""
    if imported(name):
        register()
    elif name not in sys.modules and not hooked(name):
        sys.meta_path.insert(0, AfterImport(name, register))
