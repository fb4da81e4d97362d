"""Make the image models visible to `timm.create_model` without importing timm in `import zoo`.

If timm is already imported, register now; otherwise an import hook (zoo/release/import_hook.py)
registers as soon as timm finishes importing.
"""

from __future__ import annotations

import sys

from zoo.release.import_hook import register_after_import


def register_with_timm() -> None:
    importing = sys.modules.get("zoo.release.timm_models")
    if importing is not None and not hasattr(importing, "register_with_timm"):
        return  # timm_models imported timm: it registers on its own last line
    from zoo.release.timm_models import register_with_timm

    register_with_timm()


register_after_import("timm", register_with_timm)
