"""The README and the docs as a product: the front page is short and its tables are the measured files, every
results page opens with its answer, no page is too long, and nothing names a tracker number or a file the reader
does not have."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DOCS = sorted((ROOT / "docs").rglob("*.md"))
# results pages: they open with a bold answer holding a figure, then one table, then at most five bullets
RESULTS = [ROOT / "docs" / name for name in ("leaderboard.md", "outliers.md")] + sorted(
    (ROOT / "docs" / "capabilities").glob("*.md"))
# the write-ups' file names in the source folder the reader does not have, and tracker references
WRITE_UPS = re.compile(r"\b(sciformer|quiet-attention|micro-attention|elita|fused-attention)\.md\b", re.I)
TRACKER = re.compile(r"\bissues? #?\d+|\bissue's\b|\bthe issue\b|\bcompanion issue\b", re.I)


def test_readme_is_a_front_page_of_at_most_300_lines_with_its_sections_in_order():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings == ["Two commands", "Use it", "Choosing an attention", "Speed", "Models", "Documentation"]
    two = text.split("## Two commands", 1)[1]
    assert "pip install -e . && zoo fit --config quickstart" in two
    assert "pip install -e '.[dev]' && bash .ci/timm-tests && python -m pytest" in two


def test_readme_tables_are_the_measured_files():
    """"Choosing an attention" and the model table come from bench/results and the checkpoints: writing them
    again (`python bench/readme_tables.py`) changes nothing."""
    from bench import readme_tables

    text = (ROOT / "README.md").read_text()
    assert readme_tables.fill(text, readme_tables.tables()) == text, "run: python bench/readme_tables.py"


def test_the_choosing_table_answers_both_questions_with_figures_that_link_to_their_pages():
    from bench import readme_tables

    text = (ROOT / "README.md").read_text()
    assert "**A long-context language model:**" in text and "**A small image classifier:**" in text
    table = readme_tables.choosing_table()
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        for cell in cells[2:-1]:
            assert cell in ("-", "not measured", "- (learned positions)") or re.fullmatch(
                r"\[[\d.]+x?( \([^)]*\))?\]\(docs/[\w/-]+\.md\)", cell), cell
    for link in set(re.findall(r"\]\((docs/[\w/.-]+\.md)", table)):
        assert (ROOT / link).is_file(), link
    rows = [r.split("|")[1].strip() for r in table.splitlines()[2:]]
    assert rows[:5] == ["softmax", "quiet (softmax_one)", "micro", "elita", "incontext"]


def test_model_table_counts_the_weights_of_each_checkpoint():
    """The parameter count read from a safetensors header equals the loaded model's (a weight tied to another,
    as the text models' output layer to the embedding, counts once, as it is stored once)."""
    import zoo
    from bench import readme_tables

    for name in ("micro-vit-tiny.mnist", "hybrid-elita-conv1-gpt-tiny.shakespeare"):
        model = zoo.load(name)
        assert readme_tables.parameters(ROOT / "checkpoints" / name) == sum(
            p.numel() for p in model.parameters())


@pytest.mark.parametrize("page", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_no_docs_page_is_over_5000_words(page):
    assert len(page.read_text().split()) <= 5000


@pytest.mark.parametrize("page", RESULTS, ids=[str(p.relative_to(ROOT)) for p in RESULTS])
def test_every_results_page_opens_with_its_figure_a_table_and_at_most_five_bullets(page):
    text = page.read_text()
    blocks = [b for b in text.split("\n\n") if b.strip()]
    assert blocks[0].startswith("# ")
    assert blocks[1].startswith("**") and re.search(r"\d", blocks[1].split("**")[1]), "a bold answer with a figure"
    head = text.split("## ", 1)[0] if "\n## " in text else text
    assert "|---" in head, "one table before the details"
    if "**What it says**" in head:
        says = head.split("**What it says**", 1)[1]
        assert 1 <= len(re.findall(r"^- ", says, re.M)) <= 5


@pytest.mark.parametrize("page", [ROOT / "README.md", ROOT / "CHANGELOG.md", *DOCS],
                         ids=["README.md", "CHANGELOG.md", *[str(p.relative_to(ROOT)) for p in DOCS]])
def test_no_tracker_numbers_or_write_up_file_names_in_what_a_reader_sees(page):
    text = page.read_text()
    assert not WRITE_UPS.search(text), WRITE_UPS.search(text)
    assert not TRACKER.search(text), TRACKER.search(text)


def test_no_tracker_numbers_or_write_up_file_names_in_cards_recipes_or_docstrings():
    """Cards ship with the checkpoints, recipes print with `zoo recipes`, docstrings render on the API pages,
    and messages reach users: none names a tracker number or a write-up's file name."""
    files = [*(ROOT / "checkpoints").glob("*/README.md"), *(ROOT / "recipes").glob("*.yaml"),
             *(ROOT / "zoo").rglob("*.py")]
    found = [f"{f.relative_to(ROOT)}: {m.group(0)}" for f in files for pattern in (WRITE_UPS, TRACKER)
             for m in [pattern.search(f.read_text())] if m]
    assert not found, found


def _figures(text: str) -> set[str]:
    """Every "mean ± std" in a table row or a bold answer."""
    lines = [line for line in text.splitlines() if line.startswith("|") or line.startswith("**")]
    return set(re.findall(r"\d+\.\d+ ± \d+\.\d+", "\n".join(lines)))


def test_leaderboard_and_outlier_figures_are_their_jsons(capsys):
    """Each mean ± std in the leaderboard's and the outlier study's tables and answers is one their bench
    scripts print from bench/results (`python bench/leaderboard.py --markdown`, `python bench/outliers.py
    --markdown`)."""
    from bench import leaderboard, outliers

    leaderboard.markdown(leaderboard.load())
    printed = capsys.readouterr().out
    shown = _figures((ROOT / "docs" / "leaderboard.md").read_text())
    assert shown and not {f for f in shown if f not in printed}
    outliers.table(json.loads(outliers.OUT.read_text()), markdown=True)
    printed = capsys.readouterr().out
    shown = _figures((ROOT / "docs" / "outliers.md").read_text())
    assert shown and not {f for f in shown if f not in printed}
