"""The packaged recipes: `zoo fit --config quickstart` names `recipes/quickstart.yaml`.

Recipes live in recipes/ at the top of the repository and travel inside the wheel as
zoo/recipes/ (pyproject.toml), so a name works from a source checkout and from an install.
A path always wins over a name: `--config quickstart` reads ./quickstart, else ./quickstart.yaml, if such a
file exists (and refuses a dangling link of either name rather than fall back).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

SUFFIX = ".yaml"


def recipe_roots() -> list[Path]:
    """Where packaged recipes live: the installed package's own, then a source checkout's recipes/."""
    package = Path(__file__).resolve().parents[1]
    return [p for p in (package / "recipes", package.parent / "recipes") if p.is_dir()]


def list_recipes() -> dict[str, Path]:
    """name -> file of every packaged recipe (the first root that has a name wins)."""
    found: dict[str, Path] = {}
    for root in recipe_roots():
        for file in sorted(root.glob(f"*{SUFFIX}")):
            found.setdefault(file.name.removesuffix(SUFFIX), file)
    return found


def resolve_recipe(value: str) -> tuple[Path, str | None]:
    """The file that `--config value` means, and a note to show when a path hid a recipe of the same name."""
    recipes = list_recipes()
    name = value.removesuffix(SUFFIX)
    # the file as written, else with the recipes' suffix: ./quickstart.yaml is what `--config quickstart` names
    candidates = [Path(value)] + ([Path(value + SUFFIX)] if not value.endswith(SUFFIX) else [])
    for path in candidates:
        if path.is_symlink() and not path.exists():  # a dangling link: the user meant a file that is not there
            raise FileNotFoundError(f"--config {value}: {path} is a link to {os.readlink(path)}, which does not "
                                    "exist; fix or remove the link (a packaged recipe is never read in its place)")
    local = next((path for path in candidates if path.exists()), None)
    if local is not None:
        shadowed = name in recipes and "/" not in value and recipes[name].resolve() != local.resolve()
        return local, (f"--config {value}: reading the file ./{local}; the packaged recipe of the same name "
                       f"is {recipes[name]}") if shadowed else None
    if "/" not in value and name in recipes:
        return recipes[name], None
    close = difflib.get_close_matches(name, list(recipes), n=3, cutoff=0.5)
    hint = f"; closest: {', '.join(close)}" if close else f"; packaged recipes: {', '.join(recipes)}"
    raise FileNotFoundError(f"--config {value}: no such file, and no packaged recipe of that name{hint} "
                            "(`zoo recipes` lists them)")


def read_recipe(path: Path) -> dict:
    """A recipe's YAML mapping, refused in one line when it is not UTF-8 YAML holding a mapping.

    yaml.safe_load builds plain data only: a `!!python/...` tag is refused, never run.
    """
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"recipe {path} is not UTF-8 text (byte {error.start}: {error.reason})") from None
    except IsADirectoryError:
        raise IsADirectoryError(f"recipe {path} is a folder; expected a YAML file") from None
    try:
        recipe = yaml.safe_load(text)
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ValueError(f"recipe {path} is not plain YAML{at}: {problem}") from None
    if recipe is None:
        return {}
    if not isinstance(recipe, dict):
        raise ValueError(f"recipe {path} must hold a mapping (seed_everything, trainer, model, data, ...), "
                         f"got a YAML {type(recipe).__name__}")
    return recipe
