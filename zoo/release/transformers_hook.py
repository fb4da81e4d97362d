"""Make zoo's text models loadable by transformers' Auto classes without importing transformers in `import zoo`.

If transformers is already imported, register now; otherwise an import hook registers as soon as
transformers' package has run. Registration (zoo/release/transformers_models.py) puts zoo's config,
causal LM and tokenizers into AutoConfig, AutoModelForCausalLM and AutoTokenizer under the model type
"zoo_text", and zoo's attention functions into transformers' AttentionInterface where zoo has them
(zoo/attention/hf_attention.py).

As with timm, the hook (zoo/release/import_hook.py) stays in place until transformers has actually been
executed, not merely found.

transformers' package is lazy: running it defines names, and its submodules load when a name is first
used. Registration runs once the package's own code has finished (the lazy module is then in
`sys.modules`), and loads the submodules it needs itself.
"""

from __future__ import annotations

import sys
import warnings

from zoo.release.import_hook import register_after_import

NAME = "transformers"


def register_with_transformers() -> None:
    """Register zoo's text models with transformers (transformers must be imported). An installed transformers
    that zoo's integration cannot use (older than 5) is left as it is, with a warning saying why."""
    importing = sys.modules.get("zoo.release.transformers_models")
    if importing is not None and not hasattr(importing, "register_with_transformers"):
        return  # transformers_models imported transformers: it registers on its own last line
    try:
        from zoo.release.transformers_models import register_with_transformers as register
    except ImportError as error:  # never break `import transformers` for an optional integration
        warnings.warn(f"zoo's text models are not registered with transformers: {error}", stacklevel=2)
        return
    register()


register_after_import(NAME, register_with_transformers)
