"""bench/recipe_cost.py: a recipe's model, batch shape, steps and vocabulary read as `zoo fit` reads them, and the
projected hours the timed step times those steps (nothing here is timed against anything)."""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

pytestmark = pytest.mark.bench


def test_a_recipe_is_read_as_zoo_fit_reads_it_and_its_hours_are_its_steps_timed(tmp_path, monkeypatch):
    from bench import recipe_cost
    from zoo.cli.lightning import run_lightning

    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "t.txt").write_text("\ufeff" + "the cat sat on the mat; " * 40)  # a BOM, as War and Peace
    recipe = tmp_path / "micro.book.yaml"
    recipe.write_text((REPO / "recipes" / "micro-gpt-tiny.warpeace.yaml").read_text()
                      .replace("data/warpeace/warpeace_input.txt", "data/book/t.txt")
                      .replace("context_length: 2048", "context_length: 32")
                      .replace("{context_length: 2048}", "{context_length: 32, embed_dim: 32, depth: 1}")
                      .replace("train_samples: 8000", "train_samples: 80"))
    shape = recipe_cost.recipe_shape(recipe)
    cli = run_lightning(["--config", str(recipe), "--data.init_args.path", str(tmp_path / "book" / "t.txt")],
                        run=False)
    assert shape["batch"] == cli.datamodule.batch_size and shape["context"] == cli.datamodule.context_length
    assert shape["steps"] == 80 // 4 and shape["model"] == cli.model.model.model_name
    monkeypatch.setattr(recipe_cost, "DATA", tmp_path)
    assert recipe_cost.vocabulary(shape["text"]) == cli.datamodule.tokenizer.vocab_size == len(set("the cat sat on;m"))

    out = tmp_path / "cost.json"
    recipe_cost.main([str(recipe), "--steps", "1", "--out", str(out)])
    record = json.loads(out.read_text())["runs"]["micro.book@1"]
    params = sum(p.numel() for p in cli.model.parameters())
    assert (record["parameters"], record["vocabulary"], record["steps"]) == (params, 11, 20)
    assert record["hours"] == round(record["seconds per step"] * 20 / 3600, 2) and record["threads"] == 1
    assert record["precision"] in ("bf16-mixed", "32-true")  # precision: auto, decided as zoo fit decides it


def test_recipe_cost_refuses_in_one_line(tmp_path, capsys):
    from bench import recipe_cost

    for recipe, why in ((REPO / "recipes" / "quickstart.yaml", "expected a text recipe"),
                        (tmp_path / "absent.yaml", "No such file")):
        with pytest.raises(SystemExit, match=f"^bench/recipe_cost.py: error: .*{why}"):
            recipe_cost.main([str(recipe), "--out", str(tmp_path / "cost.json")])
    missing = tmp_path / "missing.warpeace.yaml"  # a text recipe whose text is not where ZOO_DATA says
    missing.write_text((REPO / "recipes" / "gpt-tiny.warpeace-rope.yaml").read_text().replace("data/warpeace/",
                                                                                            "data/absent/"))
    with pytest.raises(SystemExit, match="^bench/recipe_cost.py: error: the recipe's text is not at .*set ZOO_DATA"):
        recipe_cost.main([str(missing), "--out", str(tmp_path / "cost.json")])
    assert not (tmp_path / "cost.json").exists()
    (tmp_path / "other.json").write_text("[1, 2]")  # another tool's file is refused, not overwritten
    with pytest.raises(SystemExit, match="is not a results JSON of this benchmark"):
        recipe_cost.main([str(REPO / "recipes" / "gpt-tiny.shakespeare.yaml"), "--out", str(tmp_path / "other.json")])
    assert (tmp_path / "other.json").read_text() == "[1, 2]"
    with pytest.raises(SystemExit):
        recipe_cost.main([str(REPO / "recipes" / "gpt-tiny.shakespeare.yaml"), "--threads", "0"])
    assert "--threads and --steps count from 1" in capsys.readouterr().err


def test_the_mini_studys_hours_on_the_capabilities_page_are_the_json():
    """The capability overview's mini-study paragraph gives each mini recipe's projected hours as
    bench/results/recipe_cost.json holds them (`python bench/recipe_cost.py recipes/*-mini.*.yaml`)."""
    runs = [r for r in json.loads((REPO / "bench" / "results" / "recipe_cost.json").read_text())["runs"].values()
            if "-mini." in r["recipe"] and r["threads"] == 1]
    assert sorted(r["recipe"] for r in runs) == sorted(p.stem for p in (REPO / "recipes").glob("*-mini.*.yaml"))
    words = " ".join((REPO / "docs" / "capabilities" / "index.md").read_text().split())
    hours = [r["hours"] for r in runs]
    bias = sorted(r["hours"] for r in runs if r["model"].startswith("incontext"))
    total = sum(hours)
    said = (f"{min(hours):.1f} to {max(hours):.1f} hours a run (the in-context bias {bias[0]:.1f} and {bias[1]:.1f} "
            f"on its fused kernel, which takes bf16 now; 7.7 and 8.5 before); {total:.1f} hours for the ten, about "
            f"{total / 2:.0f} two at a time")
    assert said in words and {r["precision"] for r in runs} == {"bf16-mixed"} and "one thread, bf16-mixed" in words
