"""bench/threads.py: one row per model and shape, both thread counts measured on the same model and batch, and
the JSON's figures the ones in docs/benchmarks.md (nothing here is timed against anything)."""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

pytestmark = pytest.mark.bench


def test_a_row_has_both_thread_counts_and_their_ratio():
    from bench.threads import measure

    row = measure("micro-gpt-tiny", "mqar", rounds=1, steps=1)
    assert (row["model"], row["batch"], row["tokens"]) == ("micro-gpt-tiny", 64, 64)
    assert row["ms 1 thread"] > 0 and row["ms 2 threads"] > 0
    assert row["1 thread / 2 threads"] == pytest.approx(row["ms 1 thread"] / row["ms 2 threads"], rel=0.02)


def test_results_cover_every_suite_mechanism_and_are_on_the_benchmarks_page():
    results = json.loads((REPO / "bench" / "results" / "threads.json").read_text())
    from bench.threads import MODELS, SHAPES

    assert {(r["model"], r["shape"]) for r in results["rows"]} == {(m, s) for m in MODELS for s in SHAPES}
    page = (REPO / "docs" / "benchmarks.md").read_text()
    for row in results["rows"]:
        assert f"| {row['model']} | {row['shape']} | {row['1 thread / 2 threads']:.2f}x |" in page
