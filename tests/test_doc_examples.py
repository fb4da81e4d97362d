"""Every code block of the documentation runs: README.md, docs/**/*.md and the model cards' usage snippets (one
shipped card per family of models, and the card a fresh `save_pretrained` writes), so a documented example cannot
rot. Each block is a test of its own, named PAGE:LINE (the line of its opening fence).

What runs: blocks labelled python (or py), bash, sh, shell or console. Any other language (text, yaml, json, toml,
none) is shown, not run.

- python: in a fresh interpreter, in a working folder of its own (below). A block sees only its own names: one that
  goes on from the page's previous python block says so with `continue`, and then runs after it (and after what
  that one continues), in one program; each test still runs alone and in any order.
- bash, sh, shell: each command (lines joined at a trailing backslash) runs with bash in the block's working
  folder, and must exit 0. A command that begins with `pip install` is not run: the tests run in the environment
  already installed, and the stranger's check (.ci) runs the install from scratch.
- console: the lines that begin with "$ " are the commands; the others are their output, not checked.

Markers: an HTML comment on the last non-blank line before the opening fence, words separated by commas,
e.g. `<!-- example: continue, slow -->`. The only ones:

    continue           python: runs after the page's previous python block, in the same program
    slow               run only under `-m slow` (minutes: a training run, a benchmark)
    skip network       needs the network (the Hugging Face Hub): not run, the test says so
    skip gpu           needs a CUDA device: run only where there is one
    not-run REASON     not something to run (a template with placeholders, a command's output, a file's
                       contents); not collected

Shell commands that take minutes are slow without a marker: `zoo fit`, `zoo leaderboard` (but for --table and
--list), `zoo check`, `zoo report`, `zoo export ... --format onnx` and `python bench/...`.

The working folder of a block: a new temporary folder with the repository's checkpoints/, recipes/ and bench/
reachable (linked; copied for slow blocks, which may rewrite them: `bench/leaderboard.py --ship` does), and
../shared/data the shared data folder ($ZOO_DATA, as tests/conftest.py finds it), so that the paths the docs use
work as they do in a checkout; HOME is a temporary folder, HF_HUB_OFFLINE=1 (a block that needs the network says
so), and `zoo` and `python` are this checkout's, whatever an installed zoo is.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import data_root

REPO = Path(__file__).resolve().parents[1]
RUN = {"python": "python", "py": "python", "bash": "shell", "sh": "shell", "shell": "shell", "console": "console"}
MARKER = re.compile(r"^\s*<!--\s*example:\s*(.*?)\s*-->\s*$")
KNOWN = ("continue", "slow", "skip network", "skip gpu", "not-run")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
# commands that take minutes: training runs, benchmarks (a leaderboard's --table and --list only read), measuring
# checkpoints again (zoo check), drawing every picture (zoo report), ONNX export with its check in ONNX Runtime
TRAINS = re.compile(r"^(zoo (fit|report|check)\b|zoo leaderboard\b(?!.*--(table|list)\b)|zoo export\b.*--format onnx"
                    r"|python3? bench/)")
REACHABLE = ("checkpoints", "recipes", "bench")  # the repository's folders the docs' commands name
SECONDS = {False: 180, True: 1800}  # a block's time limit, by whether it is slow
MAX_OUTPUT = 3000  # characters of a failing block's output in its message


@dataclass
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence, counted from 1
    language: str  # python, shell or console
    code: str
    markers: list[str] = field(default_factory=list)
    previous: Block | None = None  # the page's previous python block, for `continue`

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def commands(self) -> list[str]:
        """A shell block's commands, continuation lines joined; a console block's "$ " lines (and theirs)."""
        joined, pending = [], None  # pending: a command whose last line ended with a backslash
        for line in self.code.splitlines():
            if pending is not None:
                line = pending + line.strip()
            elif self.language == "console":
                if not line.startswith("$ "):
                    continue  # a command's output
                line = line[2:]
            if line.rstrip().endswith("\\"):
                pending = line.rstrip()[:-1].rstrip() + " "
                continue
            pending = None
            command = line.strip().removeprefix("$ ")
            if command and not command.startswith("#"):
                joined.append(command)
        return joined + ([pending.strip()] if pending and pending.strip() else [])

    @property
    def slow(self) -> bool:
        return "slow" in self.markers or (self.language != "python" and any(TRAINS.match(c) for c in self.commands))

    def chain(self) -> list[Block]:
        """This block, after the blocks it continues, first to last."""
        return ([*self.previous.chain()] if "continue" in self.markers and self.previous else []) + [self]


def blocks_of(text: str, page: str) -> list[Block]:
    """The fenced blocks of a markdown page that are run or marked (not-run ones included, to be left out)."""
    lines, found, previous_python = text.splitlines(), [], None
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, language = len(match.group(1)), match.group(2), match.group(3).lower()
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marked = MARKER.match(before)
        markers = [m.strip() for m in marked.group(1).split(",") if m.strip()] if marked else []
        if language in RUN:
            # a fence indented in a list: its lines lose that indentation, and no more
            body = lines[i + 1:end]
            code = "\n".join(line[indent:] if line[:indent].strip() == "" else line.lstrip() for line in body)
            block = Block(page, i + 1, RUN[language], code + "\n", markers,
                          previous_python if RUN[language] == "python" else None)
            found.append(block)
            if block.language == "python":
                previous_python = block
        i = end + 1
    return found


def card_blocks() -> list[Block]:
    """The usage snippets of one shipped model card per family (image, fused, text: the first by name)."""
    from zoo.models.registry import entry

    chosen: dict[str, Path] = {}
    for card in sorted((REPO / "checkpoints").glob("*/README.md")):
        config = json.loads((card.parent / "config.json").read_text())
        chosen.setdefault(entry(config["model_name"]).family, card)
    return [b for card in chosen.values() for b in blocks_of(card.read_text(), str(card.relative_to(REPO)))]


def doc_blocks() -> list[Block]:
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return [b for page in pages for b in blocks_of(page.read_text(), str(page.relative_to(REPO)))] + card_blocks()


def params(blocks: list[Block]) -> list:
    out = []
    for block in blocks:
        if any(m.startswith("not-run") for m in block.markers):
            continue
        marks = [pytest.mark.slow] if block.slow else []
        if "skip network" in block.markers:
            marks.append(pytest.mark.skip(reason="needs the network (marked `skip network`)"))
        if "skip gpu" in block.markers:
            marks.append(pytest.mark.gpu)
        out.append(pytest.param(block, id=block.id, marks=marks))
    return out


def folder_for(block: Block, tmp_path: Path) -> tuple[Path, dict]:
    """The working folder and environment a block runs in (this module's docstring says what they hold)."""
    work, home, bin_ = tmp_path / "work", tmp_path / "home", tmp_path / "bin"
    for folder in (work, home, bin_):
        folder.mkdir(parents=True)
    for name in REACHABLE:
        if block.slow:  # a copy: the commands that train and benchmark may write into them
            shutil.copytree(REPO / name, work / name, symlinks=True)
        else:
            (work / name).symlink_to(REPO / name, target_is_directory=True)
    shared = data_root()
    if shared is not None:
        (tmp_path / "shared").mkdir()
        (tmp_path / "shared" / "data").symlink_to(shared, target_is_directory=True)
    (bin_ / "python").symlink_to(sys.executable)
    (bin_ / "zoo").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m zoo.cli "$@"\n')
    (bin_ / "zoo").chmod(0o755)
    extensions = os.environ.get("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
    env = {**os.environ, "HOME": str(home), "PATH": f"{bin_}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1", "ZOO_VERBOSE": "",
           # the compiled kernels already built for this machine, rather than 20 s to build them again per block
           "TORCH_EXTENSIONS_DIR": extensions}
    if shared is not None:
        env["ZOO_DATA"] = str(shared)
    return work, env


RUNNER = """\
import json, sys
namespace = {"__name__": "__main__"}
for label, code in json.load(open(sys.argv[1])):
    exec(compile(code, label, "exec"), namespace)
"""


def run_block(block: Block, tmp_path: Path) -> None:
    """Run `block` (after the blocks it continues); fail with its page, line and output where it fails."""
    work, env = folder_for(block, tmp_path)
    seconds = SECONDS[block.slow]
    if block.language == "python":
        (tmp_path / "run.py").write_text(RUNNER)
        (tmp_path / "blocks.json").write_text(json.dumps([[b.id, b.code] for b in block.chain()]))
        done = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(tmp_path / "blocks.json")], cwd=work,
                              env=env, capture_output=True, text=True, timeout=seconds)
        output = (done.stdout + done.stderr)[-MAX_OUTPUT:]
        assert done.returncode == 0, f"{block.id}: the python block failed:\n{output}"
        return
    commands = [c for c in block.commands if not c.startswith("pip install")]
    if not commands:
        pytest.skip("only `pip install` lines: the stranger's check (.ci) runs the install")
    for command in commands:
        done = subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True,
                              timeout=seconds)
        output = (done.stdout + done.stderr)[-MAX_OUTPUT:]
        assert done.returncode == 0, f"{block.id}: `{command}` exited {done.returncode}:\n{output}"


@pytest.mark.parametrize("block", params(doc_blocks()))
def test_documented_example_runs(block, tmp_path):
    if "skip gpu" in block.markers:
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device (marked `skip gpu`), and there is none here")
    run_block(block, tmp_path)


def test_a_fresh_save_pretrained_card_shows_a_usage_that_runs(tmp_path):
    import zoo

    folder = zoo.save_pretrained(zoo.create("micro-vit-tiny"), tmp_path / "fresh")
    blocks = [b for b in blocks_of((folder / "README.md").read_text(), "fresh/README.md") if b.language == "python"]
    assert blocks, "the card shows no python usage"
    for block in blocks:
        run_block(block, tmp_path / f"line-{block.line}")


def test_every_marker_is_one_of_the_few_known():
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    unknown = [f"{b.id}: {m!r}" for page in pages for b in blocks_of(page.read_text(), page.name) for m in b.markers
               if not m.startswith(KNOWN)]
    assert not unknown, f"markers this module does not know (its docstring lists them): {unknown}"
    # `continue` in a block with no python block before it on its page would silently run alone
    orphans = [b.id for page in pages for b in blocks_of(page.read_text(), page.name)
               if "continue" in b.markers and b.previous is None]
    assert not orphans, f"`continue` with no python block before it: {orphans}"


PAGE = """\
# A page

```python
answer = 6 * 7
```

<!-- example: continue -->
```python
assert answer == 42, answer
```

```python
print(answer)
```

    ```console
    $ echo one \\
        two
    one two
    ```

<!-- example: not-run a template -->
```bash
zoo fit --config NAME
```

```bash
pip install attention-zoo && zoo fit --config quickstart
zoo recipes  # the packaged recipes
```

```yaml
not: run
```
"""


def test_the_machinery_on_a_page_of_its_own(tmp_path):
    blocks = blocks_of(PAGE, "page.md")
    assert [(b.line, b.language) for b in blocks] == [(3, "python"), (8, "python"), (12, "python"),
                                                      (16, "console"), (23, "shell"), (27, "shell")]
    first, second, third, console, template, shell = blocks
    assert second.chain() == [first, second] and third.chain() == [third]
    assert console.commands == ["echo one two"]
    assert shell.commands == ["pip install attention-zoo && zoo fit --config quickstart",
                              "zoo recipes  # the packaged recipes"]
    assert [p.id for p in params(blocks)] == ["page.md:3", "page.md:8", "page.md:12", "page.md:16", "page.md:27"]
    assert not shell.slow and Block("p", 1, "shell", "zoo fit --config quickstart\n").slow
    assert not Block("p", 1, "shell", "zoo leaderboard --recipe r --models m --table\n").slow
    indented = blocks_of("- a list\n\n    ```python\n    with open(0):\n        pass\n    ```\n", "list.md")
    assert indented[0].code == "with open(0):\n    pass\n"  # the list's indentation gone, the code's kept
    run_block(second, tmp_path / "second")  # runs after the block it continues: `answer` is defined
    with pytest.raises(AssertionError, match=r"(?s)page.md:12.*NameError: name 'answer' is not defined"):
        run_block(third, tmp_path / "third")  # a block of its own sees none of the page's other names
    run_block(shell, tmp_path / "shell")  # `zoo recipes`, this checkout's, in the block's folder; no pip install
    with pytest.raises(AssertionError, match=r"p:1: `false` exited 1"):
        run_block(Block("p", 1, "shell", "true\nfalse\n"), tmp_path / "false")
