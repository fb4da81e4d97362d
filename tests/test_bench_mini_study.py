"""bench/mini_study.py: a mini release's row is what its folder records, its loss by position as
bench/long_context.py wrote it, and its tiny form's figure as the tiny study holds it; the docs page's table is the
one the script prints from bench/results/mini_study.json."""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

pytestmark = pytest.mark.bench


def _release(folder: Path, model: str, data_path: str, val_loss: float, seconds: float, resumed: bool = False,
             flags: str | None = None):
    """A small model of the named mini architecture saved as `zoo fit` exports it: weights, and a config with the
    metrics and the training record the exporter writes."""
    import zoo

    model = zoo.create(model, embed_dim=32, depth=2, num_heads=2)
    model.save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    config["metrics"] = {"val/loss": val_loss}
    command = f"zoo fit --config recipes/{folder.name}.yaml" + (" --ckpt_path last" if resumed else "")
    config["training"] = {"command": command, "seconds": seconds,
                          "threads": 1, "precision": "bf16-mixed",
                          # as precision auto records the CPU it measured
                          **({"precision_reason": f"auto: a bf16 matrix product ran 3.56x (...; CPU flags: {flags})"}
                             if flags else {}),
                          # as LongContextText records it: a file by its name, the standard library as a path
                          "data": {"init_args": {"path": "stdlib", "context_length": 2048}} if data_path == "stdlib"
                          else {"file": data_path, "init_args": {"context_length": 2048}}}
    (folder / "config.json").write_text(json.dumps(config))
    return sum(p.numel() for p in model.parameters())


def _scored(gain: float, rise: float | None, far: float | None) -> dict:
    """A bench/long_context.py record of a release at a context of 2,048."""
    by_length = {"2048": {"loss": {"0-64": 1.5, "1024-2048": 1.5 - gain}}}
    if far is not None:
        by_length["131072"] = {"loss": {"65536-131072": far}}
    return {"context": 2048, "by_length": by_length, "uses_context": {"gain": gain, "met": gain >= 0.15},
            "keeps_context_at_4x": None if rise is None else {"rise": rise, "met": rise <= 0.05}}


def test_a_row_is_the_folder_its_loss_by_position_and_its_tiny_form(tmp_path, monkeypatch):
    from bench import mini_study

    warpeace, stdlib = tmp_path / "gpt-mini.warpeace", tmp_path / "elita-gpt-mini.stdlib"
    params = _release(warpeace, "gpt-mini", "warpeace/warpeace_input.txt", 1.23456, 7200.0)
    _release(stdlib, "elita-gpt-mini", "stdlib", 1.5, 3600.0, resumed=True, flags="avx2 avx512f amx_bf16 amx_tile")
    texts = {"warpeace": tmp_path / "long.json", "stdlib": tmp_path / "long_stdlib.json"}
    texts["warpeace"].write_text(json.dumps({"runs": {"gpt-mini.warpeace": _scored(0.2, 2.5, None)}}))
    texts["stdlib"].write_text(json.dumps({"runs": {"elita-gpt-mini.stdlib": _scored(0.1, 0.01, 1.7)}}))
    monkeypatch.setattr(mini_study, "TEXTS", texts)
    out = tmp_path / "mini.json"
    mini_study.main(["--releases", str(warpeace), str(stdlib), "--out", str(out)])
    runs = json.loads(out.read_text())["runs"]

    row = runs["gpt-mini.warpeace"]
    tiny = json.loads((REPO / "checkpoints" / "gpt-tiny.warpeace-rope" / "config.json").read_text())
    assert (row["model"], row["text"], row["parameters"], row["val_loss"], row["hours"]) == (
        "gpt-mini", "warpeace", params, 1.2346, 2.0)
    assert (row["first"], row["second_half"], row["gain"], row["gain_met"]) == (1.5, 1.3, 0.2, True)
    assert (row["rise_4x"], row["rise_met"], row["at_64x"]) == (2.5, False, None)
    assert row["tiny"]["name"] == "gpt-tiny.warpeace-rope"
    assert row["tiny"]["loss"] == pytest.approx(tiny["metrics"]["val/loss"], abs=5e-5)

    row = runs["elita-gpt-mini.stdlib"]
    suite = json.loads((REPO / "bench" / "results" / "capabilities.json").read_text())["runs"]
    losses = [suite[f"stdlib/elita-gpt-tiny:alibi/{seed}"]["metrics"]["test/loss"] for seed in range(3)
              if f"stdlib/elita-gpt-tiny:alibi/{seed}" in suite]
    assert row["text"] == "stdlib" and row["tiny"]["name"] == "elita-gpt-tiny:alibi" and losses
    assert row["tiny"]["loss"] == pytest.approx(sum(losses) / len(losses), abs=5e-5)
    assert (row["gain_met"], row["rise_met"], row["at_64x"]) == (False, True, 1.7)

    lines = mini_study.table(json.loads(out.read_text()))
    assert lines[2] == (f"| `gpt-mini` | War and Peace | {params:,} | 1.235 | `gpt-tiny.warpeace-rope` "
                        f"{tiny['metrics']['val/loss']:.3f} | 1.500 | 1.300 | +0.200 met | +2.500 **not met** | - | "
                        "2.00 (1 thread, bf16-mixed) |")
    assert lines[3].startswith("| `elita-gpt-mini` | Python stdlib |")
    # a resumed run's seconds are the resumed part's: its hours say so
    assert lines[3].endswith("| +0.100 **not met** | +0.010 met | 1.7000 | 1.00 (1 thread, bf16-mixed, AMX; the "
                             "resumed part only) |")
    assert (runs["gpt-mini.warpeace"]["amx"], row["amx"]) == (None, True)  # unrecorded says nothing
    # an export that carried the time before the resume records the step: its hours are the whole run's
    assert mini_study.resumed({"resumed": True, "resumed_at_step": 1500}) == "; resumed at step 1,500"
    assert mini_study.record(stdlib)["resumed_at_step"] is None  # an older record: its hours are the resumed part's
    config = json.loads((stdlib / "config.json").read_text())
    for before, step in ((1800.0, 1500), (None, None)):  # where the checkpoint carried the time before, or did not
        config["training"].update(resumed_at_step=1500, seconds_before_resume=before)
        (stdlib / "config.json").write_text(json.dumps(config))
        assert (mini_study.record(stdlib)["resumed"], mini_study.record(stdlib)["resumed_at_step"]) == (True, step)
    assert mini_study.resumed({"resumed": True, "resumed_at_step": None}) == "; the resumed part only"
    assert mini_study.resumed({"resumed": False, "resumed_at_step": None}) == ""


def test_what_is_not_a_scored_mini_release_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    from bench import mini_study

    texts = {"warpeace": tmp_path / "long.json", "stdlib": tmp_path / "long_stdlib.json"}
    monkeypatch.setattr(mini_study, "TEXTS", texts)
    out = tmp_path / "mini.json"
    unscored = tmp_path / "gpt-mini.warpeace"
    _release(unscored, "gpt-mini", "warpeace/warpeace_input.txt", 1.3, 60.0)
    tiny = tmp_path / "gpt-tiny.warpeace"
    import zoo

    zoo.create("gpt-tiny").save_pretrained(tiny)
    garbled = tmp_path / "garbled"
    garbled.mkdir()
    (garbled / "config.json").write_text("not JSON")
    for folder, said in ((unscored, f"has no loss by position in {texts['warpeace']}: run `python "
                                    f"bench/long_context.py --releases {unscored}` first"),
                         (tiny, "holds 'gpt-tiny', not a mini model"),
                         (tmp_path / "absent", "is not a release folder (no config.json)"),
                         (garbled, "config.json is not a release's config")):
        with pytest.raises(SystemExit, match="bench/mini_study.py: error: ") as raised:
            mini_study.main(["--releases", str(folder), "--out", str(out)])
        assert said in str(raised.value) and "\n" not in str(raised.value)
    assert not out.exists()  # nothing written for a refused run
    with pytest.raises(SystemExit, match="holds no runs to show"):
        mini_study.main(["--table", "--out", str(out)])


@pytest.mark.parametrize("reason, expected", [
    ("auto: ... 3.56x ... CPU flags: avx2 avx512f avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8)", True),
    ("auto: ... 2.38x ... CPU flags: avx2 avx512f avx512_bf16 avx512_vnni)", False),
    ("auto: ... CPU flags: none of avx2 avx512f avx512_bf16 amx_bf16)", False),  # named as absent, not present
    (None, None),
    (42, None),  # a config zoo did not write: no record, not a traceback
])
def test_amx_is_read_from_the_flags_precision_auto_recorded(reason, expected):
    from bench import mini_study

    assert mini_study.has_amx({"precision_reason": reason}) is expected


def test_the_mini_page_table_is_the_scripts():
    from bench import mini_study

    page = (REPO / "docs" / "capabilities" / "mini.md").read_text()
    table = mini_study.table(json.loads(mini_study.OUT.read_text()))
    assert "\n".join(table) in page
