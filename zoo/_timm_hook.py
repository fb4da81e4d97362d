"""Make the image models visible to `timm.create_model` without importing timm in `import zoo`.

If timm is already imported, register now; otherwise a one-shot import hook registers
as soon as timm finishes importing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

_TIMM_ONLY_KWARGS = ("pretrained_cfg_overlay", "features_only", "pretrained_model_args")


def _weights_source(name: str, pretrained_cfg) -> str:
    """Where `timm.create_model(..., pretrained=True)` should take weights from: zoo.load's source."""
    cfg = pretrained_cfg if isinstance(pretrained_cfg, dict) else getattr(pretrained_cfg, "__dict__", None) or {}
    if cfg.get("source") == "hf-hub" and cfg.get("hf_hub_id"):
        return f"hf-hub:{cfg['hf_hub_id']}"
    if cfg.get("source") == "local-dir" and cfg.get("file"):
        return cfg["file"]
    return name  # the shipped checkpoint


def register_with_timm() -> None:
    from timm.models import is_model, register_model

    from zoo.registry import _entries, create
    from zoo.release import load

    for name, e in _entries().items():
        if e.family != "image" or is_model(timm_name := name.replace("-", "_")):
            continue

        def entrypoint(pretrained: bool = False, pretrained_cfg=None, cache_dir=None, _name=name, **kwargs):
            kwargs = {k: v for k, v in kwargs.items() if k not in _TIMM_ONLY_KWARGS}
            if not pretrained:
                return create(_name, **kwargs)
            source = _weights_source(_name, pretrained_cfg)
            hub = {"cache_dir": cache_dir} if source.startswith("hf-hub:") else {}
            return load(source, **hub, **kwargs)

        entrypoint.__name__ = timm_name
        entrypoint.__module__ = "zoo.models.image_transformer"
        entrypoint.__doc__ = f"zoo's {name}"
        register_model(entrypoint)


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
