"""The house's floors: every import in zoo/ (lazy ones inside functions too) runs down or sideways, never up,
and no modules import each other in a loop.

    utils (0) -> attention (1) -> models, quantization, viz (2) -> data, training (3) -> release (4) -> cli (5)

`zoo/__init__.py` is the façade above them all. The graph is read from the source with `ast`, so a test
fails on the import as written, whether or not it ever runs.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import zoo

PACKAGE = Path(zoo.__file__).resolve().parent
FLOORS = {"utils": 0, "attention": 1, "models": 2, "quantization": 2, "viz": 2, "data": 3, "training": 3,
          "release": 4, "cli": 5}


def modules() -> dict[str, Path]:
    found = {}
    for file in PACKAGE.rglob("*.py"):
        parts = ("zoo", *file.relative_to(PACKAGE).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return found


def imports(name: str, file: Path, known: dict[str, Path]) -> set[str]:
    """The zoo modules `name` imports: `from a.b import c` counts a.b.c where c is a module, else a.b."""
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.module == "zoo" and [alias.name for alias in node.names] == ["__version__"]:
                continue  # the version is the one name every floor may read from the façade
            base = node.module or ""
            if node.level:
                head = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(head + ([base] if base else []))
            submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
            targets = submodules + ([base] if len(submodules) < len(node.names) else [])
        else:
            continue
        for target in targets:
            while target and target not in known:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target.startswith("zoo") and target != name:
                found.add(target)
    return found


def floor(name: str) -> int | None:
    parts = name.split(".")
    return FLOORS.get(parts[1]) if len(parts) > 1 else None  # None: the façade, zoo/__init__.py


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, file, known) for name, file in known.items()}


def test_every_module_has_a_floor():
    loose = sorted(name for name in modules() if name != "zoo" and floor(name) is None)
    assert loose == [], f"modules outside the floors {sorted(FLOORS)}: {loose}"


def test_no_import_runs_upward():
    upward = [f"{name} (floor {floor(name)}) imports {target} (floor {floor(target)})"
              for name, targets in graph().items() if name != "zoo"
              for target in sorted(targets) if floor(target) is None or floor(target) > floor(name)]
    assert upward == [], "\n".join(upward)


def test_no_modules_import_each_other_in_a_loop():
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    loops = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                loops.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert loops == [], "\n".join(loops)


def test_the_checker_sees_a_loop_and_an_upward_import(tmp_path, monkeypatch):
    # the three tests above are only worth their silence if they can speak: a fake package with both faults
    fake = tmp_path / "zoo"
    for rel, text in {"__init__.py": "", "models/__init__.py": "", "cli/__init__.py": "",
                      "models/a.py": "from zoo.models import b\nfrom zoo.cli import run\n",
                      "models/b.py": "def f():\n    from zoo.models.a import x\n", "cli/run.py": ""}.items():
        (fake / rel).parent.mkdir(parents=True, exist_ok=True)
        (fake / rel).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    edges = graph()
    assert edges["zoo.models.a"] == {"zoo.models.b", "zoo.cli.run"}
    assert edges["zoo.models.b"] == {"zoo.models.a"}
    assert floor("zoo.cli.run") > floor("zoo.models.a")


def test_the_lazy_packages_name_the_same_classes_three_times():
    """zoo.data and zoo.training load their modules on first use (`zoo evaluate` needs no Lightning); each names
    its classes in a table (what runs), in imports under TYPE_CHECKING (what the API reference and type checkers
    read) and in __all__. The three must agree, and each name must load from the module its table gives."""
    import importlib

    for package, table in (("zoo.data", "_HOME"), ("zoo.training", "_TASKS")):
        module = importlib.import_module(package)
        lazy = getattr(module, table)
        tree = ast.parse(Path(module.__file__).read_text())
        guarded = {alias.name: node.module for block in tree.body
                   if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
                   for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
        assert guarded == lazy, package
        classes = {name for name in module.__all__ if name[0].isupper()}
        assert classes == set(lazy), package
        assert all(getattr(module, name).__module__ == lazy[name] for name in lazy), package
