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
    """Cards ship with the checkpoints, recipes print with `zoo recipes`, docstrings render on the API pages and
    the benchmarks' in their --help, and messages reach users: none names a tracker number or a write-up's file
    name."""
    files = [*(ROOT / "checkpoints").glob("*/README.md"), *(ROOT / "recipes").glob("*.yaml"),
             *(ROOT / "zoo").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]
    found = [f"{f.relative_to(ROOT)}: {m.group(0)}" for f in files for pattern in (WRITE_UPS, TRACKER)
             for m in [pattern.search(f.read_text())] if m]
    assert not found, found


def _figures(text: str) -> set[str]:
    """Every "mean ± std" in a table row or a bold answer."""
    lines = [line for line in text.splitlines() if line.startswith("|") or line.startswith("**")]
    return set(re.findall(r"\d+\.\d+ ± \d+\.\d+", "\n".join(lines)))


def test_length_page_rows_are_the_long_context_json_and_the_checkpoints():
    """Every War and Peace checkpoint has a row in the length page's table, and each figure in it is the one
    bench/results/long_context.json holds (`python bench/long_context.py`) or the checkpoint's own config: the
    validation loss, the loss by position range, the two targets and whether each is met, and the minutes."""
    results = json.loads((ROOT / "bench" / "results" / "long_context.json").read_text())["runs"]
    page = (ROOT / "docs" / "capabilities" / "length.md").read_text()
    table = next(block for block in page.split("\n\n") if block.startswith("| checkpoint |"))
    rows = {}
    for line in table.splitlines()[2:]:
        cells = [c.strip().replace("**", "") for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells
    shipped = {p.name for p in (ROOT / "checkpoints").glob("*-tiny.warpeace*")}  # the mini ones: mini.md's
    assert set(rows) == shipped and shipped <= set(results)

    def same(cell: str, value: float, digits: int) -> None:  # the JSON's value at the page's digits (0.3535: +0.354)
        shown = cell.split()[0]
        assert len(shown.partition(".")[2]) == digits and abs(float(shown) - value) <= 0.5001 * 10**-digits, (
            cell, value)

    for name, (_, _, val_loss, first, second_half, gain, at_4x, rise, at_64x, minutes) in rows.items():
        run, config = results[name], json.loads((ROOT / "checkpoints" / name / "config.json").read_text())
        context = str(run["context"])
        same(val_loss, config["metrics"]["val/loss"], 3)
        same(first, run["by_length"][context]["loss"]["0-64"], 3)
        same(second_half, run["by_length"][context]["loss"]["1024-2048"], 3)
        same(gain, run["uses_context"]["gain"], 3)
        assert gain.split(" ", 1)[1] == ("met" if run["uses_context"]["met"] else "not met"), (name, gain)
        if "8192" in run["by_length"]:
            same(at_4x, run["by_length"]["8192"]["loss"]["4096-8192"], 4)
            kept = run["keeps_context_at_4x"]
            same(rise, kept["rise"], 3)
            assert rise.split(" ", 1)[1] == ("met" if kept["met"] else "not met"), (name, rise)
        else:
            assert at_4x == "-" and rise.startswith("- ("), (name, at_4x, rise)
        if "131072" in run["by_length"]:
            same(at_64x, run["by_length"]["131072"]["loss"]["65536-131072"], 4)
        else:
            assert at_64x.startswith("-"), (name, at_64x)
        assert int(minutes.split()[0]) == round(config["training"]["seconds"] / 60), (name, minutes)


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


def test_each_shipped_mini_checkpoint_is_a_row_of_the_mini_study_with_its_own_loss():
    """A mini checkpoint ships because the study measured it: its row on the mini page gives its own validation
    loss (bench/mini_study.py writes the table; tests/test_bench_mini_study.py holds the page to it)."""
    page = (ROOT / "docs" / "capabilities" / "mini.md").read_text()
    folders = sorted((ROOT / "checkpoints").glob("*-mini.*"))
    assert folders
    for folder in folders:
        model, _, text = folder.name.partition(".")
        loss = json.loads((folder / "config.json").read_text())["metrics"]["val/loss"]
        shown = {"warpeace": "War and Peace", "stdlib": "Python stdlib"}[text]
        assert re.search(rf"^\| `{model}` \| {shown} \| [\d,]+ \| {loss:.3f} \|", page, re.M), folder.name
