"""The registry, the three families, release folders and timm interop."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import zoo
from zoo.models import FusedAttentionNetwork, TextTransformer

ROOT = Path(__file__).resolve().parents[1]


def example_input(model):
    if isinstance(model, TextTransformer):
        return torch.randint(0, model.vocab_size, (2, 16))
    if isinstance(model, FusedAttentionNetwork):
        return torch.randn(2, *model.expected_shape)
    c = model.config
    return torch.randn(2, c["in_chans"], c["img_size"], c["img_size"])


@pytest.mark.parametrize("name", zoo.list_models())
def test_every_model_trains_a_step(name):
    model = zoo.create(name)
    x = example_input(model)
    out = model(x)
    out.float().square().mean().backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not no_grad, f"parameters without a finite gradient: {no_grad}"
    if name.endswith("-tiny"):
        assert sum(p.numel() for p in model.parameters()) * 4 < 10e6  # a float32 checkpoint under 10 MB


def test_import_zoo_is_light():
    """`import zoo`, `zoo --help` and `zoo recipes` import none of the heavy libraries (Lightning alone takes ~9 s)."""
    code = "import sys, zoo; from zoo.cli import main; main(['--help']); main(['recipes']); " \
           "print(sorted(m for m in ('torch', 'lightning', 'timm', 'huggingface_hub') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "quickstart" in out.stdout and out.stdout.strip().splitlines()[-1] == "[]"


def test_evaluate_and_viz_of_a_prompt_leave_the_training_libraries_alone(tmp_path):
    """`zoo evaluate` scores a file and `zoo viz` draws a prompt without Lightning: the zoo.data and zoo.training
    packages load their modules on first use (evaluate took 14 s on a 2-core machine, half of it Lightning's
    import), and `zoo viz` reached zoo.data through the module that checks releases again."""
    (tmp_path / "romeo.txt").write_text("ROMEO:\nBut soft, what light through yonder window breaks?\n")
    code = ("import sys; from zoo.cli import main; main(['evaluate', sys.argv[1], sys.argv[2]]); "
            "main(['viz', sys.argv[1], '--input', 'ROMEO:', '--out', sys.argv[3]]); "
            "print(sorted(m for m in ('lightning', 'torchmetrics', 'timm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT / "checkpoints" / "gpt-tiny.shakespeare"),
                          str(tmp_path / "romeo.txt"), str(tmp_path / "pictures")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert "perplexity" in lines[-3] and lines[-2].startswith("wrote ") and lines[-1] == "[]", out.stdout


def test_list_models_and_unknown_name():
    assert {"vit-tiny", "quiet-vit-tiny", "micro-vit-tiny", "fused-1d-tiny", "fused-2d-tiny", "fused-3d-tiny",
            "gpt-tiny", "quiet-gpt-tiny", "micro-gpt-tiny", "elita-gpt-tiny"} <= set(zoo.list_models())
    assert zoo.list_models("micro-*") == ["micro-gpt-small", "micro-gpt-tiny", "micro-vit-small", "micro-vit-tiny"]
    with pytest.raises(ValueError, match="unknown model 'micro-vit-tiy'.*closest: micro-vit-tiny"):
        zoo.create("micro-vit-tiy")
    with pytest.raises(ValueError, match="no pretrained weights are shipped for 'vit-small'"):
        zoo.load("vit-small")


def test_the_mini_models_are_the_tiny_forms_at_width_256_and_6_blocks():
    """The mini study's architectures: each family in the form named in docs/models.md, at width 256, 6 blocks and
    a context of 2,048, a few million parameters (the tiny ones have under one); the hybrid keeps the tiny
    hybrid's plan at the larger depth (its softmax block last, its convolution in the first block)."""
    tiny = sum(p.numel() for p in zoo.create("gpt-tiny").parameters())
    for name in ("gpt-mini", "elita-gpt-mini", "incontext-gpt-mini", "hybrid-elita-conv1-gpt-mini", "ssd-gpt-mini"):
        model = zoo.create(name)
        c = model.config
        assert (c["embed_dim"], c["depth"], c["num_heads"], c["context_length"]) == (256, 6, 4, 2048), name
        assert 3.5e6 < sum(p.numel() for p in model.parameters()) < 6e6 and tiny < 1e6
    assert zoo.create("gpt-mini").config["pos_embed"] == "rope"
    assert zoo.create("elita-gpt-mini").config["attention_options"] == {"pos_dim": 0, "positions": "alibi"}
    hybrid, small = zoo.create("hybrid-elita-conv1-gpt-mini").config, zoo.create("hybrid-elita-conv1-gpt-tiny").config
    assert hybrid["attention"] == ["elita"] * 5 + ["softmax"] and small["attention"] == ["elita"] * 3 + ["softmax"]
    assert hybrid["short_conv"] == [4, 0, 0, 0, 0, 0] and small["short_conv"] == [4, 0, 0, 0]


# ---- release folders -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["micro-vit-tiny", "fused-3d-tiny", "elita-gpt-tiny", "gpt-tiny"])
def test_release_round_trip_is_bit_exact(name, tmp_path):
    model = zoo.create(name).eval()
    for p in model.parameters():  # not the init values: something a loader could not guess
        p.data.add_(torch.randn_like(p) * 0.01)
    folder = model.save_pretrained(tmp_path / name)
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    config = json.loads((folder / "config.json").read_text())
    assert config["model_name"] == name and config["class"] == type(model).__name__
    loaded = zoo.load(folder)
    assert not loaded.training
    for (k, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), k
    x = example_input(model)
    assert torch.equal(model(x), loaded(x))
    if isinstance(loaded, TextTransformer):
        assert loaded.head.weight.data_ptr() == loaded.tok_embed.weight.data_ptr()  # still tied


def test_card_is_written_from_config_alone(tmp_path):
    from zoo.models.pretrained import rewrite_card

    folder = zoo.create("fused-1d-tiny").save_pretrained(
        tmp_path / "m", extra={"metrics": {"test/acc": 0.95}, "training": {
            "command": "zoo fit --config recipes/x.yaml", "seconds": 90, "threads": 1, "machine": "x86_64",
            "target": "test/acc >= 0.94 (a paper)", "data": {"name": "MNIST-1D", "hub_id": None, "splits": "s"}}})
    card = (folder / "README.md").read_text()
    assert "| test/acc | 0.95 |" in card and "**Target**: test/acc >= 0.94 (a paper): met (0.95)." in card
    assert "Took 1.5 minutes of wall-clock time on a x86_64 CPU with 1 thread." in card
    (folder / "README.md").write_text("stale")
    rewrite_card(folder)
    assert (folder / "README.md").read_text() == card
    # a resumed run: the exporter's record of the step says the time before the resume is in; without it (an
    # older export), the card says the time counts from the resume only
    for training, said in (({"resumed_at_step": 1500, "seconds_before_resume": 60.0},
                             "1 thread, resumed from a checkpoint at step 1,500, the time before it included."),
                            ({"resumed_at_step": 1500, "seconds_before_resume": None},  # a checkpoint without it
                             "1 thread, counted from the resume at step 1,500 only: the time before it was not "
                             "recorded."),
                            ({"command": "zoo fit --config recipes/x.yaml --ckpt_path last"},
                             "1 thread, counted from the resume only: the time before it was not recorded.")):
        config = json.loads((folder / "config.json").read_text())
        config["training"] = {**{k: v for k, v in config["training"].items()
                                 if k not in ("resumed_at_step", "seconds_before_resume")}, **training}
        (folder / "config.json").write_text(json.dumps(config))
        rewrite_card(folder)
        assert said in (folder / "README.md").read_text()
    from zoo.models.card import _target

    assert _target("test/auroc >= 0.83", {"test/auroc": 0.824}).endswith("**missed** by 0.60 points (0.824).")
    assert _target("val/loss <= 1.88 (x)", {"val/loss": 1.9}).endswith("**missed** by 0.02 (1.9).")


def test_card_says_how_many_seeds_met_the_target(tmp_path):
    """Seed 0 meeting the target says nothing of the other seeds: the card counts them."""
    board = {"group": "fashion", "metric": "test/acc", "seeds": [0, 1, 2], "values": [0.9065, 0.8993, 0.9061],
             "mean": 0.9040, "std": 0.004, "command": "python bench/leaderboard.py", "results": "r.json"}
    folder = zoo.create("vit-tiny").save_pretrained(tmp_path / "m", extra={
        "metrics": {"test/acc": 0.9065}, "leaderboard": board,
        "training": {"target": "test/acc >= 0.90 (issue 13)", "data": {"name": "F", "hub_id": None, "splits": "s"}}})
    card = (folder / "README.md").read_text()
    assert "**Target**: test/acc >= 0.9 (issue 13): met (0.9065)." in card
    assert ("2 of 3 seeds meet the target (test/acc >= 0.9); seed 1 (0.8993) does not, and the mean meets it."
            in card)
    board.update(values=[0.89, 0.88, 0.93], mean=0.9, std=0.02)  # the mean exactly on the target meets it
    folder = zoo.create("vit-tiny").save_pretrained(tmp_path / "n", extra={
        "metrics": {"test/acc": 0.89}, "leaderboard": board,
        "training": {"target": "test/acc >= 0.90", "data": {"name": "F", "hub_id": None, "splits": "s"}}})
    card = (folder / "README.md").read_text()
    assert "1 of 3 seeds meets the target (test/acc >= 0.9); seed 0 (0.8900) and seed 1 (0.8800) do not" in card
    assert "and the mean meets it." in card
    board.update(metric="val/loss", values=[1.7, 1.8, 1.9], mean=1.8)  # a lower-is-better metric, all within
    folder = zoo.create("gpt-tiny").save_pretrained(tmp_path / "t", extra={
        "metrics": {"val/loss": 1.7}, "leaderboard": board,
        "training": {"target": "val/loss <= 1.95", "data": {"name": "T", "hub_id": None, "splits": "s"}}})
    assert "Every seed meets the target (val/loss <= 1.95)." in (folder / "README.md").read_text()
    from zoo.models.card import _seeds_against

    assert _seeds_against(dict(board, values=[], seeds=[]), "val/loss <= 1.95") == ""  # nothing to count


def test_strict_load_lists_every_problem(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = zoo.create("vit-tiny").save_pretrained(tmp_path / "m")
    state = load_file(str(folder / "model.safetensors"))
    del state["norm.weight"]
    state["extra.weight"] = torch.zeros(3)
    state["head.bias"] = torch.zeros(7)
    save_file(state, str(folder / "model.safetensors"))
    with pytest.raises(ValueError) as err:
        zoo.load(folder)
    msg = str(err.value)
    assert "missing (1): norm.weight" in msg and "unexpected (1): extra.weight" in msg
    assert "head.bias: checkpoint (7,), model (10,)" in msg


def test_num_classes_override_drops_the_head(tmp_path):
    model = zoo.create("vit-tiny")
    folder = model.save_pretrained(tmp_path / "m")
    loaded = zoo.load(folder, num_classes=3)
    assert loaded(torch.randn(1, 1, 28, 28)).shape == (1, 3)
    assert torch.equal(loaded.patch_embed.weight, model.patch_embed.weight)


def test_save_is_atomic(tmp_path, monkeypatch):
    import safetensors.torch

    model = zoo.create("vit-tiny")
    good = model.save_pretrained(tmp_path / "m")
    before = (good / "model.safetensors").read_bytes()

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_model", crash)
    with pytest.raises(OSError, match="disk full"):
        zoo.create("vit-tiny").save_pretrained(tmp_path / "m")
    assert (good / "model.safetensors").read_bytes() == before  # the old folder is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # and no half-written staging folder is left
    with pytest.raises(FileNotFoundError, match="needs config.json"):
        zoo.load(tmp_path)


# ---- ImageTransformer and timm --------------------------------------------------------------


def test_timm_api_and_registry():
    import timm

    model = timm.create_model("micro_vit_tiny", num_classes=4)
    x = torch.randn(3, 1, 28, 28)
    feats = model.forward_features(x)
    assert feats.shape == (3, 50, 128)
    assert model.forward_head(feats, pre_logits=True).shape == (3, model.num_features)
    assert model.forward_head(feats).shape == (3, 4) and model.num_classes == 4
    model.reset_classifier(7)
    assert model(x).shape == (3, 7)
    assert {"pos_embed", "cls_token"} <= model.no_weight_decay()
    assert model.pretrained_cfg["input_size"] == (1, 28, 28)
    model.set_grad_checkpointing()
    model.train()
    model(x).sum().backward()
    assert "micro_vit_tiny" in timm.list_models("micro_vit*")


@pytest.mark.parametrize("kwargs", [
    dict(pos_embed="sincos", global_pool="avg"),
    dict(pos_embed="none", global_pool="fused", mlp="ffn2"),
    dict(learned_bias=True, attention="quiet", in_chans=3, img_size=32),
])
def test_image_transformer_options(kwargs):
    model = zoo.create("vit-tiny", **kwargs)
    c = model.config
    x = torch.randn(2, c["in_chans"], c["img_size"], c["img_size"])
    assert model(x).shape == (2, 10)


def test_image_bad_input():
    model = zoo.create("vit-tiny")
    with pytest.raises(ValueError, match=r"images of shape \(batch, 1, 28, 28\), got \(2, 3, 28, 28\)"):
        model(torch.randn(2, 3, 28, 28))
    with pytest.raises(ValueError, match="attention must be one of"):
        zoo.create("vit-tiny", attention="elita")


# ---- FusedAttention network ---------------------------------------------------------------


@pytest.mark.parametrize("dims", [(12,), (8, 12), (4, 8, 4), (4, 4, 4, 8)])
def test_fused_network_any_rank(dims):
    model = FusedAttentionNetwork(input_size=dims, patch_size=(2,) * len(dims), in_chans=3, num_classes=5,
                                  embed_dim=32, depth=1, num_heads=2)
    x = torch.randn(2, 3, *dims)
    assert model(x).shape == (2, 5)
    alpha = model.attention_map(x)
    assert alpha.shape == (2, 2, *(d // 2 for d in dims))
    torch.testing.assert_close(alpha.flatten(2).sum(-1), torch.ones(2, 2))


def test_patchify_equals_a_convolution_with_kernel_equal_stride():
    model = FusedAttentionNetwork(input_size=(8, 12), patch_size=(2, 3), in_chans=3, embed_dim=16, depth=0,
                                  num_heads=2, pos_embed="none")
    conv = torch.nn.Conv2d(3, 16, (2, 3), stride=(2, 3))
    conv.weight.data = model.patch_embed.weight.data.view(16, 3, 2, 3)
    conv.bias.data = model.patch_embed.bias.data
    x = torch.randn(2, 3, 8, 12)
    want = conv(x).flatten(2).transpose(1, 2)
    torch.testing.assert_close(model.patch_embed(model.patchify(x)), want, atol=1e-5, rtol=1e-5)


def test_fused_network_collection_and_patch_output():
    model = FusedAttentionNetwork(input_size=(6, 6), patch_size=(6, 6), in_chans=2, collection=5, num_classes=3,
                                  embed_dim=32, depth=1, num_heads=2, patch_output=True)
    x = torch.randn(4, 5, 2, 6, 6)
    assert model(x).shape == (4, 3)
    y, alpha = model.pooled(x, return_alpha=True)
    assert y.shape == (4, 2, 6, 6) and alpha.shape == (4, 2, 5)
    # the collection is a set once positions are off: permuting items leaves the output unchanged
    model = FusedAttentionNetwork(input_size=(6,), patch_size=(6,), collection=5, pos_embed="none",
                                  embed_dim=16, depth=1, num_heads=2).eval()
    x = torch.randn(2, 5, 1, 6)
    torch.testing.assert_close(model(x), model(x[:, torch.randperm(5)]), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"\(batch, 5, 1, 6\), got \(2, 4, 1, 6\)"):
        model(torch.randn(2, 4, 1, 6))


# ---- TextTransformer ----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpt-tiny", "quiet-gpt-tiny", "micro-gpt-tiny", "elita-gpt-tiny"])
def test_cached_decoding_equals_recompute(name):
    model = zoo.create(name, depth=2).eval()
    idx = torch.randint(0, 65, (2, 40))
    full = model(idx)
    logits, states = model.forward_step(idx[:, :25])
    steps = [logits]
    for t in range(25, 40):
        logits, states = model.forward_step(idx[:, t : t + 1], states, t)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-4, rtol=1e-4)
    # greedy generation picks the argmax of a full recompute at every step
    out = model.generate(idx[:, :10], max_new_tokens=8, temperature=0)
    for t in range(10, 18):
        assert torch.equal(out[:, t], model(out[:, :t])[:, -1].argmax(-1))


@pytest.mark.parametrize("name", ["micro-gpt-tiny", "elita-gpt-tiny"])
def test_recurrent_state_does_not_grow(name):
    model = zoo.create(name, depth=1).eval()

    def numel(states):
        return sum(t.numel() for s in states for t in vars(s).values() if torch.is_tensor(t))

    _, short = model.forward_step(torch.randint(0, 65, (1, 5)))
    _, long = model.forward_step(torch.randint(0, 65, (1, 500)))
    assert numel(short) == numel(long)


def test_generate_sampling_is_seeded_and_text_round_trips():
    text = "to be or not to be, that is the question\n"
    tok = zoo.CharTokenizer.from_text(text)
    assert tok.decode(tok.encode(text)) == text
    model = zoo.create("micro-gpt-tiny", vocab_size=tok.vocab_size, tokenizer=tok.to_dict(), depth=1).eval()
    a = model.generate("to be", 20, temperature=0.8, top_k=5, top_p=0.9, seed=3)
    b = model.generate("to be", 20, temperature=0.8, top_k=5, top_p=0.9, seed=3)
    assert a == b and a.startswith("to be") and len(a) == 25
    with pytest.raises(ValueError, match="not in the tokenizer"):
        model.generate("XYZ", 3)


def test_bpe_tokenizer_round_trips_and_travels_with_the_model(tmp_path):
    pytest.importorskip("tokenizers", reason="the BPE option needs the tokenizers library (zoo[bpe])")
    from zoo.models.tokenizer import BPETokenizer

    corpus = "to be or not to be, that is the question\n" * 50
    tok = BPETokenizer.from_text(corpus, vocab_size=300)
    assert 256 < tok.vocab_size <= 300  # every byte, plus merges
    assert len(tok.encode("to be or not to be")) < len("to be or not to be")  # merges were learned
    for text in ["to be", "unseen: Ωμέγα ✓ 日本\n\t", ""]:  # byte level: any text, not only the corpus
        assert tok.decode(tok.encode(text)) == text
    model = zoo.create("gpt-tiny", vocab_size=tok.vocab_size, tokenizer=tok.to_dict(), depth=1).eval()
    loaded = zoo.load(model.save_pretrained(tmp_path / "bpe"))
    assert isinstance(loaded.tokenizer, BPETokenizer) and loaded.tokenizer.encode(corpus) == tok.encode(corpus)
    assert loaded.generate("to be", 10, seed=1) == model.generate("to be", 10, seed=1)


@pytest.mark.parametrize("name", ["gpt-tiny", "quiet-gpt-tiny"])
def test_generation_slides_past_learned_positions(name):
    """Past context_length, a learned-position model sees the last context_length tokens, like nanoGPT."""
    model = zoo.create(name, context_length=16, depth=2).eval()
    prompt = torch.randint(0, 65, (1, 20))  # longer than the window already
    got = model.generate(prompt, 30, temperature=0)
    want = prompt
    with torch.no_grad():
        for _ in range(30):
            want = torch.cat([want, model(want[:, -16:])[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(got, want)


def test_top_k_and_top_p_restrict_the_support():
    from zoo.models.text_transformer import sample

    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    draws = {int(sample(logits, 1.0, 2, None, g)) for _ in range(200)}
    assert draws == {0, 1}
    # softmax of these logits: 0.64, 0.24, 0.09, ...: top_p 0.8 keeps the first two
    draws = {int(sample(logits, 1.0, None, 0.8, g)) for _ in range(200)}
    assert draws == {0, 1}


def test_text_bad_input():
    model = zoo.create("gpt-tiny")
    with pytest.raises(ValueError, match=r"integer token ids of shape \(batch, length\)"):
        model(torch.randn(2, 3))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 65\)"):
        model(torch.tensor([[70]]))
    with pytest.raises(ValueError, match="learned positions for 256 tokens, got 300"):
        model(torch.zeros(1, 300, dtype=torch.long))


def test_classifiers_carry_their_preprocessing():
    from PIL import Image

    model = zoo.create("micro-vit-tiny", label_names=list("abcdefghij"), mean=[0.25], std=[0.5]).eval()
    pixels = torch.randint(0, 256, (28, 28), dtype=torch.uint8)
    expected = ((pixels.float() / 255 - 0.25) / 0.5)[None, None]  # 0..255 pixels, then the model's mean and std
    assert torch.allclose(model.preprocess(pixels), expected)
    assert torch.allclose(model.preprocess(Image.fromarray(pixels.numpy())), expected)
    assert torch.allclose(model.preprocess(pixels.numpy()), expected)
    assert model.preprocess(Image.fromarray(pixels.numpy()).resize((56, 56))).shape == (1, 1, 28, 28)
    top = model.classify(pixels, top_k=3)
    probs = model(expected).detach().softmax(-1)[0]
    assert [label for label, _ in top] == [model.config["label_names"][i] for i in probs.topk(3).indices]
    assert abs(top[0][1] - float(probs.max())) < 1e-4
    assert len(model.classify(torch.rand(5, 1, 28, 28))) == 5  # a batch gives one list per item
    with pytest.raises(ValueError, match=r"takes inputs of shape \(1, 28, 28\).*got \(1, 3, 28, 28\)"):
        model.classify(torch.rand(3, 28, 28))
    signal = zoo.create("fused-1d-tiny").eval()
    assert signal.preprocess(torch.randn(40)).shape == (1, 1, 40)
    with pytest.raises(ValueError, match=r"only images are resized"):
        signal.preprocess(torch.randn(1, 41))


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_a_tokenizer_round_trips_through_a_release_folder(kind, tmp_path):
    """What a model reads and writes survives saving: the same ids for the same text, the same text for the
    same ids, the same logits. The character vocabulary is in no sorted order, as a tokenizer built from a
    list of symbols may be: a save that reorders it would give every id another meaning."""
    from zoo.models.tokenizer import BPETokenizer, CharTokenizer

    text = "zebra yak xylophone, a cab!\n" * 8
    tokenizer = CharTokenizer("zyx ,!\nabcehklnopr") if kind == "char" else BPETokenizer.from_text(text, vocab_size=300)
    model = zoo.create("gpt-tiny", depth=1, vocab_size=tokenizer.vocab_size, tokenizer=tokenizer.to_dict()).eval()
    loaded = zoo.load(str(model.save_pretrained(tmp_path / "model"))).eval()
    ids = tokenizer.encode(text)
    assert loaded.tokenizer.encode(text) == ids and loaded.tokenizer.decode(ids) == text
    batch = torch.tensor([ids[:32]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(batch), model(batch), rtol=0, atol=0)
