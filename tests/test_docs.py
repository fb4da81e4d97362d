"""The documentation: the site builds with --strict, a broken reference fails it, and every public
class and function documents each of its arguments."""

import importlib.util
import inspect
import re
import shutil
from pathlib import Path

import pytest

import zoo
import zoo.attention
import zoo.data
import zoo.models
import zoo.training
from tests.site_build import build, the_strict_site

ROOT = Path(__file__).resolve().parents[1]
needs_mkdocs = pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                                  reason="mkdocs is not installed: pip install -e '.[docs]'")


@needs_mkdocs
def test_the_site_builds_strict_with_the_api_and_the_cli_reference(tmp_path_factory):
    out = the_strict_site(tmp_path_factory)  # tests/test_site.py opens the same build in Chromium
    assert out.returncode == 0, out.stderr[-3000:]
    attention = (out.site / "attention" / "index.html").read_text()
    assert "MicroAttention" in attention and "softmax_one" in attention
    cli = (out.site / "cli" / "index.html").read_text()
    assert all(f"zoo {command}" in cli for command in ("fit", "export", "push", "recipes", "build-kernels"))
    assert "--trainer.max_epochs" in cli  # fit's options come from Lightning's own parser
    assert not (out.site / "hooks.py").exists()


@needs_mkdocs
def test_a_broken_reference_fails_the_build(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copy(ROOT / "docs" / "hooks.py", docs / "hooks.py")
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")  # where the hook reads the sections
    config = (ROOT / "mkdocs.yml").read_text().split("\nnav:")[0].replace('paths: ["."]', f'paths: ["{ROOT}"]')
    (tmp_path / "mkdocs.yml").write_text(config + "\nnav:\n  - Home: index.md\n")
    (docs / "index.md").write_text("# Home\n\n::: zoo.attention.NoSuchAttention\n")
    out = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert out.returncode != 0 and "NoSuchAttention" in out.stderr
    (docs / "index.md").write_text("# Home\n\n<!-- readme:no-such-section -->\n")
    out = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert out.returncode != 0 and "no section 'no-such-section'" in out.stderr


def public_api() -> list[tuple[str, object]]:
    items = [(f"zoo.{name}", getattr(zoo, name)) for name in ("create", "list_models", "load", "save_pretrained")]
    for module in (zoo.attention, zoo.models, zoo.data, zoo.training):
        items += [(f"{module.__name__}.{name}", getattr(module, name)) for name in module.__all__
                  if callable(getattr(module, name))]
    return items


def own_doc(obj) -> str:
    """The docstring written for `obj` itself (a class's and its __init__'s), never one it inherits."""
    if inspect.isclass(obj):
        return (vars(obj).get("__doc__") or "") + (vars(obj).get("__init__").__doc__ or ""
                                                   if "__init__" in vars(obj) else "")
    return obj.__doc__ or ""


@pytest.mark.parametrize("name,obj", public_api(), ids=[n for n, _ in public_api()])
def test_every_public_class_and_function_documents_its_arguments(name, obj):
    doc = own_doc(obj)
    assert doc.strip(), f"{name} has no docstring of its own"
    target = obj.__init__ if inspect.isclass(obj) else obj
    arguments = [p.name for p in inspect.signature(target).parameters.values()
                 if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    # google style, as mkdocstrings renders a table of them: an "Args:" section with a line per argument
    args = doc.split("Args:", 1)[-1] if "Args:" in doc else ""
    listed = set(re.findall(r"^\s+(\w+)(?: \([^)]*\))?: ", args, re.M))
    missing = [a for a in arguments if a not in listed]
    assert not missing, f"{name}'s docstring has no Args: line for {missing}"
