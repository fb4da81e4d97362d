"""`zoo report`: one static page, loaded in headless Chromium (Debian's chromium and chromedriver, driven by
Selenium): no console error, no broken image, every shipped checkpoint named. The screenshot is kept under
$ZOO_ARTIFACTS (default: the test's temporary folder)."""

import json
import os
from pathlib import Path

import pytest

from tests.browser import chromium, require_chromium
from tests.conftest import data_root
from tests.test_checkpoints import PLANNED

pytest.importorskip("matplotlib")
REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # 36 s: Chromium renders the whole page
def test_report_page_in_a_real_browser(tmp_path):
    from zoo.cli import main
    from zoo.release.check import shipped_folders

    require_chromium()  # before the report is drawn, not after it
    main(["report", "--out", str(tmp_path / "report"), "--bench", str(REPO / "bench" / "results"),
          *(["--data-root", str(data_root())] if data_root() else [])])
    page = tmp_path / "report" / "index.html"
    text = page.read_text()
    assert "<script" not in text and "http://" not in text and "https://" not in text  # nothing to fetch
    browser = chromium()
    try:
        browser.get(page.as_uri())
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        broken = browser.execute_script(
            "return Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).length")
        images = browser.execute_script("return document.images.length")
        body = browser.find_element("tag name", "body").text
        artifacts = Path(os.environ.get("ZOO_ARTIFACTS", tmp_path))
        artifacts.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(artifacts / "report.png"))
    finally:
        browser.quit()
    assert errors == [] and broken == 0 and images == text.count("<img ") > 20
    names = [f.name for f in shipped_folders()]
    assert sorted(names) == sorted(PLANNED) and all(name in body for name in names)
    assert json.loads((tmp_path / "report" / "report.json").read_text())["checkpoints"] == names
    for heading in ("Checkpoints", "Benchmarks", "Pictures", "attention", "models", "deploy"):
        assert heading in body


def test_report_never_replaces_a_users_folder(tmp_path):
    from zoo.release.report import is_report_folder

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "index.html").write_text("<p>my page</p>")
    from zoo.cli import main

    with pytest.raises(SystemExit, match="holds files that are not a zoo report folder"):
        main(["report", "--out", str(tmp_path / "mine"), "--overwrite"])
    assert (tmp_path / "mine" / "index.html").read_text() == "<p>my page</p>"
    (tmp_path / "mine" / "report.json").write_text('{"format": "zoo-report"}')
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    assert not is_report_folder(tmp_path / "mine")  # a marker alone does not make another file ours


def test_capability_plots_draw_zoologys_grid_averaged_over_seeds(monkeypatch):
    """MQAR runs at several pair counts become one line per model and width (Zoology's Figure 2), the accuracy at
    the training length averaged over seeds; a model run at one pair count draws no line, and a task tested at
    the training length only gets no plot against length."""
    from matplotlib.figure import Figure

    from zoo.release import report
    from zoo.viz import figures

    drawn = {}

    def lines(series, xlabel, ylabel, title, log=True):
        drawn[title] = series
        return Figure()

    monkeypatch.setattr(figures, "lines_figure", lines)

    def run(task, model, width, pairs, accuracy):
        return {"task": task, "model": model, "size": {"embed_dim": width},
                "data": {"name": "MQAR", "init_args": {"sequence_length": 64, "num_pairs": pairs}},
                "metrics": {"test/accuracy@64": accuracy}, "loss_by_position": None}

    runs = [run("mqar", "micro-gpt-tiny", 64, 4, 0.5), run("mqar", "micro-gpt-tiny", 64, 4, 0.3),
            run("mqar_p8", "micro-gpt-tiny", 64, 8, 0.2), run("mqar_p8", "micro-gpt-tiny:w128", 128, 8, 0.6),
            run("mqar_p16", "micro-gpt-tiny:w128", 128, 16, 0.4), run("mqar", "gpt-tiny", 64, 4, 1.0)]
    plots = report._bench_plots("capabilities", {"runs": {str(i): r for i, r in enumerate(runs)}})
    grid = drawn.pop("MQAR against width and pairs (Zoology's Figure 2)")
    assert grid == {"micro-gpt-tiny, width 64": ([4, 8], [40.0, 20.0]),
                    "micro-gpt-tiny, width 128": ([8, 16], [60.0, 40.0])}
    assert drawn == {} and len(plots) == 1
