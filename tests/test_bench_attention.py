"""bench/attention.py --mechanisms: the training step of some mechanisms beside causal SDPA, measured in one run and
written under its own name; a part never overwrites the whole run's results."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

pytestmark = pytest.mark.bench


def test_some_mechanisms_beside_causal_sdpa_in_one_run(tmp_path, monkeypatch):
    import bench.common
    from bench import attention

    monkeypatch.setattr(bench.common, "RESULTS", tmp_path)
    monkeypatch.setattr(sys, "argv", ["attention.py", "--mechanisms", "gla", "window", "--lengths", "64",
                                      "--out", "attention_part"])
    attention.main()
    rows = json.loads((tmp_path / "attention_part.json").read_text())["train"]
    assert [(r["mechanism"], r["length"], r["dtype"]) for r in rows] == [
        ("softmax", 64, "fp32"), ("gla", 64, "fp32"), ("window", 64, "fp32")]  # the baseline first, fp32 only
    base = rows[0]["ms"]
    for row in rows:
        assert row["ms"] > 0 and row["vs_causal_sdpa"] == pytest.approx(row["ms"] / base)


def test_growth_rows_with_both_allocators_and_their_page_faults(tmp_path, monkeypatch):
    import bench.common
    from bench import attention

    monkeypatch.setattr(bench.common, "RESULTS", tmp_path)
    monkeypatch.setattr(attention, "GROWTH_PROCESSES", 3)
    monkeypatch.setattr(sys, "argv", ["attention.py", "--mechanisms", "ssd", "--lengths", "32", "128", "--growth",
                                      "--out", "attention_part"])
    attention.main()
    growth = json.loads((tmp_path / "attention_part.json").read_text())["growth"]
    assert [(r["mechanism"], r["dtype"], r["allocator"]) for r in growth] == [
        ("ssd", "fp32", "glibc default"), ("ssd", "fp32", "glibc, freed memory kept")]  # not softmax's
    for row in growth:
        assert len(row["ratios"]) == 3 and row["ratios"] == sorted(row["ratios"])
        assert row["growth"] == row["ratios"][1]  # the median of three
        assert set(row["page_faults"]) == {"32", "128"}
        assert all(isinstance(f, int) and f >= 0 for f in row["page_faults"].values())


def test_growth_too_large_for_memory_is_skipped_saying_so(tmp_path, monkeypatch):
    import bench.common
    from bench import attention

    monkeypatch.setattr(bench.common, "RESULTS", tmp_path)
    monkeypatch.setattr(attention, "MEMORY_LIMIT_GB", 0)  # every length too large: nothing may be run
    monkeypatch.setattr(attention, "in_subprocess", lambda *a, **k: pytest.fail("ran a job over the memory limit"))
    monkeypatch.setattr(sys, "argv", ["attention.py", "--mechanisms", "ssd", "--lengths", "32", "10000000",
                                      "--growth", "--out", "attention_part"])
    attention.main()
    results = json.loads((tmp_path / "attention_part.json").read_text())
    assert all("skipped" in r for r in results["train"] + results["growth"]) and len(results["growth"]) == 2


@pytest.mark.parametrize("argv, expected", [
    (["--mechanisms", "nope", "--out", "x"], r"unknown mechanism\(s\) \['nope'\]; expected some of \["),
    (["--mechanisms", "gla"], "measures a part only: name its own --out"),
    (["--lengths", "64"], "--lengths and --growth go with --mechanisms"),
    (["--growth"], "--lengths and --growth go with --mechanisms"),
    (["--mechanisms", "gla", "--lengths", "64", "--growth", "--out", "x"], "--growth needs --lengths with two"),
])
def test_a_bad_request_gets_one_line(argv, expected):
    out = subprocess.run([sys.executable, str(REPO / "bench" / "attention.py"), *argv], capture_output=True,
                         text=True)
    last = out.stderr.strip().splitlines()[-1]  # argparse's usage line, then the error in one line
    assert out.returncode == 2 and last.startswith("attention.py: error: ") and re.search(expected, last)
