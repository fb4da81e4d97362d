"""Starting from any checkpoint, and text scored with the model's own tokenizer (issue 23, items 1 and 2).

Adapted weights are checked against timm's formulas written out here (a channel sum, a repetition
scaled by 1/N), learning rates against lr * decay ** (depth + 1 - layer), and `evaluate_text` against
a float64 computation token by token. Each bad input is refused with an error naming what to change.
Nothing here needs the network or the shared data folder: the text is written by the tests, the
checkpoints are the shipped ones.
"""

import json
import logging
import math
import re

import lightning as L
import pytest
import torch

import zoo
from zoo.cli.evaluate import evaluate_command
from zoo.data import CharText
from zoo.models.tokenizer import BPETokenizer, CharTokenizer
from zoo.training import ClassificationTask, LanguageModelTask, task_class
from zoo.training.evaluate import evaluate_text
from zoo.training.finetune import freeze, layer_decay_groups, layer_ids
from zoo.training.source import check_model_source, start_from

LINES = ["First Citizen: we are accounted poor citizens, the patricians good.",
         "What authority surfeits on would relieve us: if they would yield us but the superfluity,",
         "while it were wholesome, we might guess they relieved us humanely; but they think we are too dear.",
         "Let us revenge this with our pikes, ere we become rakes: for the gods know I speak this in hunger."]
TEXT = "\n".join(LINES * 6) + "\n"  # every character is in gpt-tiny.shakespeare's vocabulary

DATA_INFO = {"num_classes": 3, "in_chans": 3, "mean": [0.4, 0.5, 0.6], "std": [0.2, 0.25, 0.3],
             "label_names": ["cat", "dog", "emu"], "input_size": [28, 28]}


def quick_trainer(tmp_path, **kw):
    return L.Trainer(default_root_dir=tmp_path, accelerator="cpu", devices=1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, **kw)


def warnings_of(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


# ---- starting from a checkpoint -----------------------------------------------------------------


def test_a_tag_starts_with_its_weights_and_adapts_head_and_channels_as_timm(caplog):
    base = zoo.load("micro-vit-tiny.mnist")
    with caplog.at_level(logging.WARNING):
        model = start_from("micro-vit-tiny.mnist", {"in_chans": 3, "num_classes": 5, "mean": [0.5] * 3,
                                                    "std": [0.5] * 3})
    # timm's adapt_input_conv to N channels: the one channel repeated N times, divided by N
    assert torch.allclose(model.patch_embed.weight, base.patch_embed.weight.repeat(1, 3, 1, 1) / 3)
    assert torch.equal(model.blocks[2].mlp[0].weight, base.blocks[2].mlp[0].weight)
    assert model.head.weight.shape == (5, 128) and model.training
    log = warnings_of(caplog)
    assert "classifier re-initialized for 5 classes (the checkpoint's has 10)" in log
    assert "patch embedding adapted from 1 to 3 input channels" in log
    # an RGB image of one grey level gives the grey model's features: the rescaling keeps the input's scale
    grey = torch.rand(1, 1, 28, 28)
    assert torch.allclose(model.forward_features(grey.expand(1, 3, 28, 28)), base.forward_features(grey), atol=1e-5)


def test_to_one_channel_the_channels_are_summed_and_the_fused_linear_embedding_too(tmp_path):
    rgb = start_from("fused-2d-tiny.mnist", {"in_chans": 3})
    rgb.save_pretrained(tmp_path / "rgb")
    grey = start_from(str(tmp_path / "rgb"), {"in_chans": 1})
    # the linear patch embedding reads (C, 4, 4) patches: channel c is columns 16c .. 16c + 15
    w = rgb.patch_embed.weight
    assert torch.allclose(grey.patch_embed.weight, w[:, :16] + w[:, 16:32] + w[:, 32:], atol=1e-6)
    assert torch.allclose(w, zoo.load("fused-2d-tiny.mnist").patch_embed.weight.repeat(1, 3) / 3)
    assert grey.base_model == str(tmp_path / "rgb")


def test_a_new_image_size_resamples_the_position_table(caplog):
    with caplog.at_level(logging.WARNING):
        model = start_from("micro-vit-tiny.mnist", {"img_size": 35})
    assert model.pos_embed.shape == (1, 26, 128) and model(torch.rand(2, 1, 35, 35)).shape == (2, 10)
    assert "resampled from a 4x4 to a 5x5 patch grid" in warnings_of(caplog)


def test_what_a_checkpoint_cannot_take_is_refused(tmp_path):
    with pytest.raises(ValueError, match="TextTransformer .*takes no in_chans"):
        start_from("gpt-tiny.shakespeare", {"in_chans": 3})
    with pytest.raises(ValueError, match=r"embed_dim.*cannot be adapted: cls_token \(1, 1, 128\) -> \(1, 1, 64\)"):
        start_from("micro-vit-tiny.mnist", {"embed_dim": 64})
    rgb = start_from("micro-vit-tiny.mnist", {"in_chans": 3, "mean": [0.4, 0.5, 0.6], "std": [0.2] * 3})
    rgb.save_pretrained(tmp_path / "rgb")
    with pytest.raises(ValueError, match="in_chans=2 needs mean for 2 channels; the checkpoint's is for 3"):
        start_from(str(tmp_path / "rgb"), {"in_chans": 2})


def test_model_names_are_checked_before_anything_is_built(tmp_path):
    check_model_source("micro-vit-tiny")
    check_model_source("micro-vit-tiny.mnist")
    check_model_source("hf-hub:some-org/some-model")  # its syntax only: downloaded when the task is built
    with pytest.raises(ValueError, match="unknown model 'micro-vit-tny'.*name.tag, a release folder or hf-hub"):
        check_model_source("micro-vit-tny")
    with pytest.raises(ValueError, match="no checkpoint tagged 'cifar'"):
        check_model_source("micro-vit-tiny.cifar")
    with pytest.raises(FileNotFoundError, match="no release folder at runs/nothing"):
        check_model_source("runs/nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a release folder: it has no config.json"):
        check_model_source(str(tmp_path / "empty"))
    assert task_class("gpt-tiny.shakespeare") is LanguageModelTask
    assert task_class("micro-vit-tiny.mnist") is ClassificationTask


def test_classification_from_a_tag_takes_the_data_config_and_saves_a_loadable_card(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    task = ClassificationTask("micro-vit-tiny.mnist", data_info=DATA_INFO)
    config = task.model.config
    assert (config["in_chans"], config["num_classes"], config["mean"], config["std"], config["label_names"]) == (
        3, 3, DATA_INFO["mean"], DATA_INFO["std"], DATA_INFO["label_names"])
    assert task.model.data_cfg()["mean"] == (0.4, 0.5, 0.6)  # preprocess normalizes as the new data
    task.model.save_pretrained("runs/ft/pets")
    card = (tmp_path / "runs/ft/pets/README.md").read_text()
    assert 'zoo.load("runs/ft/pets")' in card and "Fine-tuned from `micro-vit-tiny.mnist`" in card
    loaded = zoo.load("runs/ft/pets")
    assert loaded.base_model == "micro-vit-tiny.mnist" and loaded.config["label_names"] == ["cat", "dog", "emu"]
    x = torch.rand(2, 3, 28, 28)
    assert torch.equal(loaded(x), task.model.eval()(x))
    # a Lightning checkpoint's task is rebuilt from model_config alone: the starting point is not needed again
    again = ClassificationTask("runs/gone", data_info=DATA_INFO, model_config=task.hparams.model_config)
    again.load_state_dict(task.state_dict())
    assert torch.equal(again.model.eval()(x), loaded(x))


def test_a_text_checkpoint_is_refused_for_classification_and_an_image_one_for_text():
    with pytest.raises(ValueError, match="is a text model; classification needs"):
        ClassificationTask("gpt-tiny.shakespeare", data_info=DATA_INFO)
    with pytest.raises(ValueError, match="is not a language model"):
        LanguageModelTask("micro-vit-tiny.mnist")


def test_strict_false_names_every_tensor_it_left_random(caplog):
    with caplog.at_level(logging.WARNING):
        zoo.load("micro-vit-tiny.mnist", in_chans=3, strict=False)
    assert "1 tensor(s) left at their random initialization: patch_embed.weight" in warnings_of(caplog)


# ---- freezing and layer-wise learning-rate decay --------------------------------------------------


def test_layer_decay_gives_each_block_lr_times_decay_to_its_distance_from_the_top():
    model = zoo.create("micro-vit-tiny")  # 4 blocks: embedding 0, blocks 1..4 (the final norm with the last), head 5
    groups = layer_decay_groups(model, lr=1e-3, weight_decay=0.05, layer_decay=0.5)
    lr_of = {id(p): (g["lr"], g["weight_decay"]) for g in groups for p in g["params"]}
    named = dict(model.named_parameters())
    expected = {"patch_embed.weight": 1e-3 * 0.5**5, "blocks.0.attn.proj.weight": 1e-3 * 0.5**4,
                "blocks.3.attn.proj.weight": 1e-3 * 0.5, "norm.weight": 1e-3 * 0.5, "head.weight": 1e-3}
    for name, lr in expected.items():
        assert lr_of[id(named[name])][0] == pytest.approx(lr), name
    assert lr_of[id(named["head.weight"])][1] == 0.05 and lr_of[id(named["head.bias"])][1] == 0.0
    assert lr_of[id(named["pos_embed"])][1] == 0.0  # no_weight_decay() is honoured as in zoo's own groups
    assert sum(len(g["params"]) for g in groups) == len(named)


def test_freeze_blocks_freezes_the_embedding_and_that_many_blocks(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        task = ClassificationTask("micro-vit-tiny.mnist", data_info={**DATA_INFO, "in_chans": 1, "mean": [0.5],
                                                                     "std": [0.5]}, freeze_blocks=2, lr=1e-2,
                                  warmup_steps=0, layer_decay=0.7)
    frozen = {name for name, p in task.model.named_parameters() if not p.requires_grad}
    assert frozen == {n for n, layer in layer_ids(task.model).items() if layer <= 2}
    assert "blocks.1.mlp.0.weight" in frozen and "blocks.2.mlp.0.weight" not in frozen and "cls_token" in frozen
    assert "the embedding and blocks 0 to 1 are frozen" in warnings_of(caplog)
    before = {k: v.clone() for k, v in task.model.state_dict().items()}
    data = [(torch.rand(8, 1, 28, 28), torch.randint(0, 3, (8,))) for _ in range(2)]
    quick_trainer(tmp_path, max_steps=2).fit(task, torch.utils.data.DataLoader(data, batch_size=None))
    after = task.model.state_dict()
    assert all(torch.equal(before[n], after[n]) for n in frozen)
    assert not torch.equal(before["blocks.3.mlp.0.weight"], after["blocks.3.mlp.0.weight"])


@pytest.mark.parametrize("bad", [{"layer_decay": 0}, {"layer_decay": 1.5}, {"layer_decay": True},
                                 {"freeze_blocks": -1}, {"freeze_blocks": 1.0}, {"freeze_blocks": 5}])
def test_bad_finetune_options_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        ClassificationTask("micro-vit-tiny", **bad)
    with torch.no_grad():
        freeze(zoo.create("gpt-tiny"), 0)  # nothing frozen, nothing said


# ---- text with the model's tokenizer ------------------------------------------------------------


def reference_loss(model, ids: list[int], context: int) -> float:
    """Summed next-token loss in float64, one prediction at a time: token j from the tokens of its window before
    it (windows start at 0, context, 2 context, ...), as log-sum-exp minus the target's logit."""
    model = model.double().eval()
    total = 0.0
    with torch.no_grad():
        for j in range(1, len(ids)):
            start = (j - 1) // context * context
            logits = model(torch.tensor([ids[start:j]]))[0, -1].tolist()
            top = max(logits)
            total += top + math.log(math.fsum(math.exp(v - top) for v in logits)) - logits[ids[j]]
    return total


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_evaluate_text_matches_a_float64_computation_token_by_token(kind, tmp_path):
    pytest.importorskip("tokenizers") if kind == "bpe" else None
    text = "Thé citizens rüle the gods.\n" + LINES[2] + "\n"  # two 2-byte characters: bytes differ from characters
    tokenizer = CharTokenizer.from_text(TEXT + text) if kind == "char" else BPETokenizer.from_text(TEXT, 280)
    torch.manual_seed(1)
    model = zoo.create("gpt-tiny", depth=1, embed_dim=32, num_heads=2, context_length=16,
                       vocab_size=tokenizer.vocab_size, tokenizer=tokenizer.to_dict())
    file = tmp_path / "other.txt"
    file.write_text(text, encoding="utf-8")
    got = evaluate_text(model, file, context_length=16, batch_size=3)
    ids = tokenizer.encode(text)
    nats = reference_loss(model, ids, 16)
    assert got["tokens"] == len(ids) - 1
    assert got["loss"] == pytest.approx(nats / (len(ids) - 1), rel=1e-5)
    assert got["perplexity"] == pytest.approx(math.exp(nats / (len(ids) - 1)), rel=1e-5)
    first = tokenizer.decode(ids[:1])
    assert got["bytes"] == len(text.encode("utf-8")) - len(first.encode("utf-8"))
    assert got["bits_per_byte"] == pytest.approx(nats / math.log(2) / got["bytes"], rel=1e-5)


def test_evaluate_text_splits_as_char_text_does(tmp_path):
    file = tmp_path / "t.txt"
    file.write_text(TEXT)
    whole = evaluate_text("gpt-tiny.shakespeare", file, context_length=64)
    tail = evaluate_text("gpt-tiny.shakespeare", file, context_length=64, split="validation")
    cut = int(len(TEXT) * 0.9)
    assert whole["tokens"] == len(TEXT) - 1 and tail["tokens"] == len(TEXT) - cut - 1
    assert whole["bits_per_byte"] == pytest.approx(whole["loss"] / math.log(2) * whole["tokens"] / whole["bytes"])


def test_evaluate_refuses_what_it_cannot_score(tmp_path):
    file = tmp_path / "t.txt"
    file.write_text("naïve café — ÿ\n" + TEXT)
    with pytest.raises(ValueError, match=r"characters not in the model's tokenizer \(character-level, 65 tokens\): "
                                         r"\['é', 'ï', 'ÿ', '—'\].*byte-level BPE.*new_tokenizer"):
        evaluate_text("gpt-tiny.shakespeare", file)
    (tmp_path / "ok.txt").write_text(TEXT)
    with pytest.raises(ValueError, match="is not a language model"):
        evaluate_text("micro-vit-tiny.mnist", tmp_path / "ok.txt")
    with pytest.raises(ValueError, match="split must be one of"):
        evaluate_text("gpt-tiny.shakespeare", tmp_path / "ok.txt", split="test")
    with pytest.raises(ValueError, match=r"context_length .*at most 64, got 65"):
        evaluate_text("gpt-tiny.shakespeare", tmp_path / "ok.txt", context_length=65)
    with pytest.raises(FileNotFoundError, match="no text file"):
        evaluate_text("gpt-tiny.shakespeare", tmp_path / "none.txt")
    with pytest.raises(IsADirectoryError):
        evaluate_text("gpt-tiny.shakespeare", tmp_path)
    (tmp_path / "bin.txt").write_bytes(b"abc\xff\xfe")
    with pytest.raises(ValueError, match="not UTF-8 text: byte 3"):
        evaluate_text("gpt-tiny.shakespeare", tmp_path / "bin.txt")
    (tmp_path / "one.txt").write_text("a")
    with pytest.raises(ValueError, match="at least 2"):
        evaluate_text("gpt-tiny.shakespeare", tmp_path / "one.txt")


def test_evaluate_json_never_replaces_what_it_did_not_write(tmp_path):
    """--json is refused, before the model is read, inside a release folder and over another file."""
    release = tmp_path / "rel"
    zoo.create("gpt-tiny", vocab_size=8, context_length=8, embed_dim=8, depth=1, num_heads=1).save_pretrained(release)
    config = (release / "config.json").read_bytes()
    text = tmp_path / "t.txt"
    text.write_text("abc" * 10)
    for target, message in ((release / "config.json", "lies inside the release folder"),
                            (tmp_path / "notes.json", "exists and is not a zoo evaluate result")):
        if not target.exists():
            target.write_text('{"mine": 1}')
        before = target.read_bytes()
        with pytest.raises(FileExistsError, match=message):
            evaluate_command([str(release), str(text), "--json", str(target)])
        assert target.read_bytes() == before
    assert (release / "config.json").read_bytes() == config


def test_evaluate_command_prints_and_writes_json(tmp_path, capsys):
    file = tmp_path / "t.txt"
    file.write_text(TEXT)
    evaluate_command(["gpt-tiny.shakespeare", str(file), "--json", str(tmp_path / "out.json")])
    written = json.loads((tmp_path / "out.json").read_text())
    assert written == pytest.approx(evaluate_text("gpt-tiny.shakespeare", file))
    assert f"perplexity {written['perplexity']:.2f}" in capsys.readouterr().out
    with pytest.raises(IsADirectoryError):
        evaluate_command(["gpt-tiny.shakespeare", str(file), "--json", str(tmp_path)])


def test_char_text_takes_a_checkpoint_tokenizer_and_names_what_it_cannot_encode(tmp_path):
    file = tmp_path / "t.txt"
    file.write_text(TEXT)
    dm = CharText(path=str(file), context_length=16, tokenizer="gpt-tiny.shakespeare")
    assert dm.tokenizer.to_dict() == zoo.load("gpt-tiny.shakespeare").tokenizer.to_dict() and dm.vocab_size == 65
    file.write_text(TEXT + "ñ€")
    with pytest.raises(ValueError, match=r"\['ñ', '€'\].*use a byte-level BPE model"):
        CharText(path=str(file), context_length=16, tokenizer="gpt-tiny.shakespeare")
    with pytest.raises(ValueError, match="test_split must be one of"):
        CharText(path=str(file), test_split="test")


def test_zoo_test_scores_the_whole_file_with_the_checkpoint_tokenizer(tmp_path):
    """The issue's case: the data module trains its own tokenizer on the test file; the task hands it the
    model's, and `test_split: all` scores every window of the file, as evaluate_text does."""
    file = tmp_path / "other.txt"
    file.write_text(TEXT[: 20 * 32 + 1])  # 20 whole windows: no tail, so the two scores cover the same tokens
    dm = CharText(path=str(file), context_length=32, batch_size=4, test_split="all")
    assert dm.vocab_size < 65  # its own tokenizer, of this file's characters
    task = LanguageModelTask("gpt-tiny.shakespeare", data_info=dm.data_info, sample_tokens=0)
    result = quick_trainer(tmp_path).test(task, dm, verbose=False)[0]
    assert dm.vocab_size == 65
    assert result["test/loss"] == pytest.approx(evaluate_text("gpt-tiny.shakespeare", file, 32)["loss"], rel=1e-5)


def test_a_lightning_checkpoint_is_scored_with_its_own_tokenizer_whatever_the_data_trained(tmp_path):
    """Trained from scratch on one file, tested on another whose data module trained another tokenizer (the
    case of the issue's 2370 perplexity): the checkpoint's model and tokenizer are what is scored."""
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text(TEXT)
    second.write_text("\n".join(reversed(LINES)) * 2 + "\nQ")
    dm = CharText(path=str(first), context_length=16, batch_size=4, train_samples=8)
    task = LanguageModelTask("gpt-tiny", {"depth": 1, "embed_dim": 32, "context_length": 16}, dm.data_info,
                             sample_tokens=0, warmup_steps=0)
    trainer = quick_trainer(tmp_path, max_steps=2, limit_val_batches=0)
    trainer.fit(task, dm)
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    other = CharText(path=str(second), context_length=16, batch_size=4, test_split="all", tokenizer="char")
    assert other.tokenizer.to_dict() != task.model.tokenizer.to_dict()
    fresh = LanguageModelTask("gpt-tiny", {"depth": 1, "embed_dim": 32, "context_length": 16}, other.data_info,
                              sample_tokens=0)
    with pytest.raises(ValueError, match=r"\['Q'\]"):  # 'Q' is not in the first file: named, not misread
        quick_trainer(tmp_path).test(fresh, other, ckpt_path=tmp_path / "a.ckpt", verbose=False)
    second.write_text(("\n".join(reversed(LINES)) * 2)[: 10 * 16 + 1])
    other = CharText(path=str(second), context_length=16, batch_size=4, test_split="all")
    fresh = LanguageModelTask("gpt-tiny", {"depth": 1, "embed_dim": 32, "context_length": 16}, other.data_info,
                              sample_tokens=0)
    result = quick_trainer(tmp_path).test(fresh, other, ckpt_path=tmp_path / "a.ckpt", verbose=False)[0]
    expected = evaluate_text(task.model, second, 16)
    assert result["test/loss"] == pytest.approx(expected["loss"], rel=1e-5)


def test_fine_tuning_with_a_new_tokenizer_starts_the_embedding_afresh(tmp_path, caplog):
    file = tmp_path / "t.txt"
    file.write_text(TEXT + "ñ")
    dm = CharText(path=str(file), context_length=16)
    with pytest.raises(ValueError, match=r"\['ñ'\]"):
        quick_trainer(tmp_path).test(LanguageModelTask("gpt-tiny.shakespeare", data_info=dm.data_info,
                                                       sample_tokens=0), dm, verbose=False)
    with caplog.at_level(logging.WARNING):
        task = LanguageModelTask("gpt-tiny.shakespeare", data_info=dm.data_info, new_tokenizer=True)
    base = zoo.load("gpt-tiny.shakespeare")
    assert task.model.tokenizer.to_dict() == dm.tokenizer.to_dict() and task.model.vocab_size == dm.vocab_size
    assert torch.equal(task.model.blocks[0].mlp[0].weight, base.blocks[0].mlp[0].weight)
    assert "token embedding (tied to the output layer) re-initialized" in warnings_of(caplog)


def test_a_python_fine_tune_takes_its_data_modules_data_info(tmp_path):
    """A task built without data_info and trained with L.Trainer.fit (no command line to link the two) is
    fitted to the data module: its release says the data's normalization and classes, and the card's accuracy
    is what `classify` gives on the same test images. Exported before it is fitted, it is refused."""
    from zoo.data import Digits
    from zoo.release.export import export

    data = Digits(batch_size=64)
    task = ClassificationTask(model_name="micro-vit-tiny", model_overrides={"depth": 1}, warmup_steps=1)
    assert task.model.config["img_size"] == 28 and task.model.config["mean"] != data.data_info["mean"]
    with pytest.raises(ValueError, match=r"the model was built with .*data_info=datamodule\.data_info"):
        export(task, data, tmp_path / "too-early")
    assert not (tmp_path / "too-early").exists()
    quick_trainer(tmp_path, max_steps=3, limit_val_batches=1).fit(task, datamodule=data)
    info = data.data_info
    for key, built in (("img_size", 8), ("mean", info["mean"]), ("std", info["std"]),
                       ("label_names", info["label_names"]), ("num_classes", info["num_classes"])):
        assert task.model.config[key] == built, key
    folder, metrics = export(task, data, tmp_path / "release")
    model = zoo.load(folder).eval()
    assert model.config["mean"] == info["mean"] and model.config["std"] == info["std"]
    images, labels = Digits(batch_size=64).load("test")  # raw pixels in [0, 1]: classify normalizes them
    predicted = [top[0][0] for top in model.classify(images.numpy(), top_k=1)]
    accuracy = sum(p == info["label_names"][y] for p, y in zip(predicted, labels.tolist())) / len(labels)
    assert metrics["test/acc"] == pytest.approx(accuracy, abs=5e-6)


def test_a_python_language_model_takes_its_data_modules_tokenizer(tmp_path):
    """The language-model counterpart: gpt-tiny built without data_info, trained with L.Trainer.fit on a text
    whose characters are not gpt-tiny's default 65, is built again with the data's tokenizer, and keeps it."""
    file = tmp_path / "small.txt"
    file.write_text("abc cab bac\n" * 40)
    data = CharText(path=str(file), context_length=16, batch_size=4)
    task = LanguageModelTask(model_name="gpt-tiny", model_overrides={"depth": 1}, warmup_steps=1, sample_tokens=2)
    assert task.model.tokenizer is None and task.model.vocab_size == 65
    quick_trainer(tmp_path, max_steps=2, limit_val_batches=1).fit(task, datamodule=data)
    assert task.model.vocab_size == 5 and task.model.tokenizer.to_dict() == data.tokenizer.to_dict()
    assert task.model.config["depth"] == 1  # the user's overrides kept
    assert task.model.generate("ab", 3, temperature=0)[:2] == "ab"


@pytest.mark.parametrize("overrides, said", [
    ({"depth": 6}, r"blocks\.4, blocks\.5 start from fresh weights \(the checkpoint has none\)"),
    ({"num_heads": 8}, r"changed num_heads 4 -> 8, which no weight adaptation covers"),
    ({"attention": "quiet"}, r"changed attention 'softmax' -> 'quiet', which no weight adaptation covers"),
])
def test_a_change_no_adaptation_covers_is_said_in_one_warning(overrides, said, caplog):
    """Fine-tuning from a 4-block, 4-head checkpoint with more blocks, other heads or another attention keeps
    what weights it can, and says in one warning what is new or now computes something else."""
    with caplog.at_level(logging.WARNING, logger="zoo.training.source"):
        model = start_from("gpt-tiny.shakespeare", overrides)
    assert model.config[next(iter(overrides))] == next(iter(overrides.values()))
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and re.search(said, warned[0]), warned


def test_a_change_of_dropout_alone_warns_of_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="zoo.training.source"):
        start_from("gpt-tiny.shakespeare", {"drop_rate": 0.1})
    assert not warnings_of(caplog)
