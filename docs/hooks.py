"""MkDocs hook: pages filled at build time from the one place each thing is written.

- `<!-- readme:NAME -->` becomes README.md's section between `<!-- section:NAME -->` and
  `<!-- /section:NAME -->`, its links to docs/ made relative to the page (a missing section fails the build);
- `<!-- cli-reference -->` becomes every command's help, from the commands' own parsers.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
CLI = "<!-- cli-reference -->"


def readme_section(name: str) -> str:
    text = README.read_text()
    found = re.search(rf"<!-- section:{name} -->\n(.*?)<!-- /section:{name} -->", text, re.S)
    if found is None:
        raise ValueError(f"README.md has no section {name!r} (<!-- section:{name} --> ... <!-- /section:{name} -->)")
    return found.group(1)


def _help(command: str) -> str:
    from zoo.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([command, "--help"])
    return out.getvalue().rstrip()


def cli_reference() -> str:
    from zoo.cli import HELP, LIGHTNING, usage

    parts = ["```text", usage().rstrip(), "```", ""]
    for command, summary in HELP.items():
        if command in LIGHTNING and command != "fit":
            continue  # validate, test and predict take fit's options
        parts += [f"## zoo {command}", "", summary[0].upper() + summary[1:] + ".", "", "```text", _help(command), "```",
                  ""]
    parts.append("`zoo validate`, `zoo test` and `zoo predict` take the same options as `zoo fit`, with `--ckpt_path`.")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page, **kwargs) -> str:
    up = "../" * page.file.src_uri.count("/")
    markdown = re.sub(r"<!-- readme:([\w-]+) -->",
                      lambda m: readme_section(m.group(1)).replace("](docs/", "](" + up), markdown)
    return markdown.replace(CLI, cli_reference()) if CLI in markdown else markdown
