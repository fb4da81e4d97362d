"""The pictures tell the truth: every number drawn is checked against an independent float64 computation."""

import itertools
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import zoo
from tests.conftest import data_root

pytest.importorskip("matplotlib")
from zoo.viz import capture, measures, pictures  # noqa: E402


def image(model):
    return torch.rand(1, *getattr(model, "expected_shape", model.input_shape))


@pytest.mark.parametrize("name", ["vit-tiny", "quiet-vit-tiny", "micro-vit-tiny", "fused-3d-tiny", "elita-gpt-tiny",
                                  "micro-gpt-tiny", "quiet-gpt-tiny"])
def test_capture_changes_nothing_and_leaves_nothing(name):
    model = zoo.create(name).eval()
    shape = getattr(model, "expected_shape", getattr(model, "input_shape", None))
    x = torch.randint(0, 65, (2, 20)) if hasattr(model, "vocab_size") else torch.rand(2, *shape)
    before = model(x)
    with capture(model) as maps:
        during = model(x)
    assert torch.equal(before, during)  # bitwise
    assert maps and all(not m._forward_hooks for m in model.modules())  # nothing stays registered


def reference_weights(module, x, quiet: bool, causal: bool):
    """softmax / softmax_one of q k^T / sqrt(d) with q, k from the layer's own weights, all in float64."""
    w, b = module.qkv.weight.double(), module.qkv.bias.double()
    qkv = x.double() @ w.T + b
    bsz, n, _ = x.shape
    q, k, _ = qkv.view(bsz, n, 3, module.heads, module.head_dim).permute(2, 0, 3, 1, 4)
    logits = q @ k.transpose(-1, -2) / math.sqrt(module.head_dim)
    if causal:
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    e = logits.exp()
    return e / (e.sum(-1, keepdim=True) + (1.0 if quiet else 0.0))


@pytest.mark.parametrize("name,quiet,causal", [("vit-tiny", False, False), ("quiet-vit-tiny", True, False),
                                               ("gpt-tiny", False, True), ("quiet-gpt-tiny", True, True)])
def test_softmax_and_quiet_maps_are_the_reference_weights(name, quiet, causal):
    model = zoo.create(name).eval()
    seen = []
    layer = model.blocks[1].attn
    layer.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    x = torch.randint(0, 65, (2, 12)) if causal else torch.rand(2, 1, 28, 28)
    with capture(model) as maps:
        model(x)
    got = maps[1].weights
    want = reference_weights(layer, seen[0], quiet, causal)
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-6)
    sums = got.sum(-1)
    if quiet:
        assert (sums <= 1 + 1e-6).all() and (sums < 1).any()
        torch.testing.assert_close(maps[1].extra["nothing"], 1 - sums)
    else:
        torch.testing.assert_close(sums, torch.ones_like(sums))


def per_head(x, heads):
    return x.view(*x.shape[:2], heads, -1).transpose(1, 2).double()  # (B, H, L, D)


@pytest.mark.parametrize("name", ["micro-vit-tiny", "micro-gpt-tiny"])
def test_micro_weights_rebuild_the_layers_output(name):
    """The output is proj(x_i - sum_j W_ij x_j): the captured weights rebuild it exactly; rows sum to 1."""
    model = zoo.create(name).eval()
    layer = model.blocks[0].attn
    seen = []
    layer.register_forward_hook(lambda m, args, out: seen.append((args[0], out)))
    x = torch.randint(0, 65, (2, 30)) if hasattr(model, "vocab_size") else torch.rand(2, 1, 28, 28)
    with capture(model) as maps:
        model(x)
    (tokens, out), w = seen[0], maps[0].weights.double()
    xh = per_head(tokens, layer.heads)
    rebuilt = (xh - w @ xh).transpose(1, 2).reshape(tokens.shape).float() @ layer.proj.weight.T
    torch.testing.assert_close(rebuilt, out, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))
    scores = maps[0].extra["scores"]
    torch.testing.assert_close(w[..., -1, :], (scores / scores.sum(-1, keepdim=True)).double())  # the last query


def test_elita_weights_rebuild_the_layers_output():
    model = zoo.create("elita-gpt-tiny").eval()
    layer = model.blocks[2].attn
    seen = []
    layer.register_forward_hook(lambda m, args, out: seen.append((args[0], out)))
    with capture(model) as maps:
        model(torch.randint(0, 65, (2, 70)))
    (tokens, out), w = seen[0], maps[2].weights.double()
    values = per_head(tokens @ layer.value.weight.T, layer.heads)
    rebuilt = (w @ values).transpose(1, 2).reshape(out.shape)
    torch.testing.assert_close(rebuilt.float(), out, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)), rtol=0, atol=1e-6)  # a convex mix (float32)
    assert (w.triu(1) == 0).all()  # causal


@pytest.mark.parametrize("name", ["fused-1d-tiny", "fused-3d-tiny", "fused-pool-vit-tiny"])
def test_fused_alpha_sums_to_one_and_is_the_mechanisms_own(name):
    model = zoo.create(name).eval()
    pool_inputs = []
    model.pool.register_forward_hook(lambda m, args, out: pool_inputs.append(args[0]))
    x = image(model)
    with capture(model) as maps:
        model(x)
    alpha = maps[-1].extra["alpha"]
    _, own = model.pool(pool_inputs[0], return_alpha=True)
    torch.testing.assert_close(alpha, own)
    torch.testing.assert_close(alpha.sum(-1), torch.ones_like(alpha.sum(-1)))


def test_rollout_against_a_plain_implementation():
    rng = np.random.default_rng(0)
    layers = [rng.random((1, 3, 5, 5)) for _ in range(4)]
    layers = [w / w.sum(-1, keepdims=True) for w in layers]
    want = np.eye(5)
    for w in layers:  # the paper's recipe, one matrix at a time
        a = 0.5 * w[0].mean(0) + 0.5 * np.eye(5)
        a = a / a.sum(-1, keepdims=True)
        want = a @ want
    got = measures.rollout([torch.as_tensor(w) for w in layers])[0]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


def test_mean_attention_distance_known_values():
    grid, patch = (4, 3), 4
    n = 12
    identity = torch.eye(n)[None, None].expand(2, 3, n, n)
    assert torch.equal(measures.mean_attention_distance(identity, grid, patch), torch.zeros(3))
    uniform = torch.full((1, 2, n, n), 1.0 / n)
    cells = list(itertools.product(range(4), range(3)))
    mean = sum(math.dist(a, b) for a in cells for b in cells) / n**2 * patch  # every pair, by hand
    torch.testing.assert_close(measures.mean_attention_distance(uniform, grid, patch), torch.full((2,), mean))
    with_cls = torch.zeros(1, 1, n + 1, n + 1)
    with_cls[..., 1:, 1:] = torch.eye(n)
    with_cls[..., 1:, 0] = 5.0  # weight on the class token is left out
    assert measures.mean_attention_distance(with_cls, grid, patch, prefix=1).item() == 0.0


def test_position_similarity_against_float64():
    model = zoo.load("vit-tiny.mnist")
    table = model.pos_embed[0, 1:].double()
    want = torch.stack([torch.stack([torch.dot(a, b) / (a.norm() * b.norm()) for b in table]) for a in table])
    got = measures.position_similarity(measures.position_table(model))
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.diagonal(), torch.ones(len(table), dtype=got.dtype))


def test_filters_and_principal_components():
    model = zoo.create("fused-2d-tiny")
    filters = measures.patch_filters(model)
    assert filters.shape == (64, 1, 4, 4)
    torch.testing.assert_close(filters.flatten(1), model.patch_embed.weight)  # the same numbers, unflattened
    components = measures.principal_filters(filters).flatten(1).double()
    torch.testing.assert_close(components @ components.T, torch.eye(16, dtype=torch.float64), atol=1e-5, rtol=0)


@pytest.mark.parametrize("name,expected", [
    ("vit-tiny.mnist", {"patch_filters", "patch_filters_pca", "position_similarity", "attention", "rollout",
                        "attention_distance"}),
    ("quiet-vit-tiny.mnist", {"quiet_nothing"}), ("micro-vit-tiny.mnist", {"micro_saliency"}),
    ("fused-1d-tiny.mnist1d", {"fused_alpha", "patch_filters"}),
    ("micro-gpt-tiny.shakespeare", {"attention", "attention_tokens"}),
])
def test_pictures_draw_what_applies(name, expected, tmp_path):
    model = zoo.load(name)
    x = torch.as_tensor([model.tokenizer.encode("ROMEO:")]) if hasattr(model, "vocab_size") else image(model)
    model.train()
    drawn = pictures(model, x)
    assert model.training  # pictures leave the model's mode as they found it
    assert expected <= set(drawn)
    for key, (figure, numbers) in drawn.items():
        figure.savefig(tmp_path / f"{key}.png")
        assert (tmp_path / f"{key}.png").stat().st_size > 1000 and numbers
    if model.config.get("pos_embed") != "learned":
        assert "position_similarity" not in drawn


CALLERS_MATPLOTLIB = textwrap.dedent("""
    import matplotlib
    matplotlib.use("svg")
    import matplotlib.pyplot as plt
    mine = plt.figure()
    import numpy as np
    import torch
    from zoo.viz import figures
    drawn = figures.per_head_figure(torch.rand(3, 2), "value", "title")
    drawn.canvas.draw()  # what loggers do to take the pixels (zoo.training.pictures.figure_to_array)
    print(matplotlib.get_backend(), plt.get_fignums() == [mine.number], np.asarray(drawn.canvas.buffer_rgba()).shape[2])
""")


def test_drawing_leaves_the_callers_matplotlib_alone():
    """A picture is a value: importing zoo.viz keeps the caller's backend and their open figures, pyplot does
    not keep what zoo draws alive, and the figure still renders to pixels through its own canvas."""
    run = subprocess.run([sys.executable, "-c", CALLERS_MATPLOTLIB], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["svg", "True", "4"]


def test_line_panels_put_each_series_in_its_own_panel():
    from zoo.viz import figures

    drawn = figures.line_panels_figure({"accuracy": {"run a": ([0, 100], [0.1, 0.9])},
                                        "gate": {"run a": ([0, 100], [0.0, 0.7]), "run b": ([0], [0.2])}},
                                       "step", "title")
    assert [ax.get_ylabel() for ax in drawn.axes] == ["accuracy", "gate"]
    assert [[(list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()] for ax in drawn.axes] == [
        [([0, 100], [0.1, 0.9])], [([0, 100], [0.0, 0.7]), ([0], [0.2])]]


def test_learned_mask_pictures_are_the_parameters(monkeypatch):
    model = zoo.create("quiet-vit-tiny", learned_bias=True)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.attn_bias.normal_()
    drawn = pictures(model)
    bias = np.stack([b.attn.attn_bias.detach().numpy() for b in model.blocks])
    np.testing.assert_array_equal(drawn["learned_mask"][1]["bias"], bias)
    centre = 1 + 3 * 7 + 3  # the class token, then row 3, column 3 of the 7 x 7 grid
    np.testing.assert_array_equal(drawn["learned_mask_query"][1]["bias"], bias[:, :, centre, 1:])
    corner = pictures(model, query=48)["learned_mask_query"][1]["bias"]
    np.testing.assert_array_equal(corner, bias[:, :, 1 + 48, 1:])
    from zoo.viz import figures

    def drawn_first(*args, **kwargs):
        raise AssertionError("a picture was drawn before the bad query was refused")

    for name in ("filters_figure", "similarity_figure", "heatmaps_figure"):
        monkeypatch.setattr(figures, name, drawn_first)
    with pytest.raises(ValueError, match=r"query must be a patch index in \[0, 49\)"):
        pictures(model, query=49)
    for bad in (-1, True, 3.0, "3", float("nan")):
        with pytest.raises(ValueError, match=r"query must be a patch index in \[0, 49\) on the 7 x 7 grid, got "
                                             + re.escape(repr(bad))):
            pictures(model, query=bad)


def test_pictures_refuse_what_is_not_there():
    with pytest.raises(ValueError, match=r"one input of shape \(1, 1, 28, 28\)"):
        pictures(zoo.create("vit-tiny"), torch.rand(1, 3, 28, 28))
    with pytest.raises(ValueError, match=r"token ids of shape \(1, length\)"):
        pictures(zoo.create("gpt-tiny"), torch.rand(1, 5))
    with pytest.raises(ValueError, match="has 'sincos' positions, not learned ones"):
        measures.position_table(zoo.create("vit-tiny", pos_embed="sincos"))
    with pytest.raises(ValueError, match="no learned attention mask: build it with learned_bias=True"):
        measures.learned_bias(zoo.create("micro-vit-tiny"))
    with pytest.raises(ValueError, match="token embeddings"):
        measures.patch_filters(zoo.create("gpt-tiny"))


# ---- zoo viz ------------------------------------------------------------------------------------


def viz(*args):
    from zoo.cli import main

    main(["viz", *map(str, args)])


def test_zoo_viz_writes_pictures_and_their_numbers(tmp_path):
    from PIL import Image

    digit = tmp_path / "digit.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8), mode="L").save(digit)
    viz("quiet-vit-tiny.mnist", "--out", tmp_path / "out", "--input", digit)
    out = tmp_path / "out"
    assert {"patch_filters.png", "position_similarity.npz", "viz.json"} <= {p.name for p in out.iterdir()}
    sample = {p.name for p in (out / "sample-0").iterdir()}
    assert {"quiet_nothing.png", "rollout.png", "attention_distance.npz"} <= sample
    model = zoo.load("quiet-vit-tiny.mnist")
    with capture(model) as maps:
        model(model.preprocess(Image.open(digit)))
    saved = np.load(out / "sample-0" / "quiet_nothing.npz")["nothing"]
    np.testing.assert_allclose(saved, torch.stack([m.extra["nothing"][0] for m in maps]).numpy(), rtol=1e-6)
    with pytest.raises(SystemExit, match="--overwrite"):
        viz("gpt-tiny.shakespeare", "--out", out, "--input", "ROMEO: to be")
    assert (out / "sample-0" / "quiet_nothing.png").exists()
    viz("gpt-tiny.shakespeare", "--out", out, "--input", "ROMEO: to be", "--overwrite")  # the image's pictures go
    assert (out / "sample-0" / "attention_tokens.png").stat().st_size > 1000
    assert not (out / "patch_filters.png").exists()
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]


def test_zoo_viz_with_samples_of_its_data(tmp_path):
    root = data_root()
    if root is None:
        pytest.skip("shared data folder not found")
    viz("fused-1d-tiny.mnist1d", "--out", tmp_path / "out", "--samples", 2, "--data-root", root)
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_dir()) == ["sample-0", "sample-1"]


def test_zoo_viz_never_downloads_into_the_data_root(tmp_path):
    (tmp_path / "data").mkdir()
    with pytest.raises(SystemExit, match="MNIST not found under .* and download=False; .*give an input with --input"):
        viz("vit-tiny.mnist", "--out", tmp_path / "out", "--data-root", tmp_path / "data")
    assert list((tmp_path / "data").iterdir()) == [] and not (tmp_path / "out").exists()


def test_zoo_viz_refusals(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(SystemExit, match="holds files that are not a zoo viz folder"):
        viz("vit-tiny.mnist", "--out", tmp_path / "mine", "--input", tmp_path / "x.npy")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    with pytest.raises(SystemExit, match=r"no such file; ImageTransformer takes an image file or a \.npy array"):
        viz("vit-tiny.mnist", "--out", tmp_path / "a", "--input", tmp_path / "missing.png")
    np.save(tmp_path / "wrong.npy", np.zeros((5, 5, 5), dtype=np.float32))
    with pytest.raises(SystemExit, match=r"takes inputs of shape \(1, 28, 28\)"):
        viz("vit-tiny.mnist", "--out", tmp_path / "a", "--input", tmp_path / "wrong.npy")
    np.save(tmp_path / "ok.npy", np.zeros((28, 28), dtype=np.uint8))  # a uint8 image without its channel
    viz("vit-tiny.mnist", "--out", tmp_path / "a", "--input", tmp_path / "ok.npy")
    assert (tmp_path / "a" / "sample-0" / "rollout.png").exists()
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]


# ---- during training ------------------------------------------------------------------------------


def test_callback_logs_to_tensorboard_wandb_and_csv(tmp_path):
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from zoo.data.arrays import Digits
    from zoo.training.classification import ClassificationTask
    from zoo.training.pictures import DrawPictures

    class FakeWandb(Logger):  # the one method DrawPictures calls on a W&B logger
        name, version, experiment = "wandb", "0", None
        images: list = []

        def log_image(self, key, images, step=None):
            self.images.append((key, images[0].shape, step))

        def log_metrics(self, metrics, step=None):
            pass

        def log_hyperparams(self, params, *args, **kwargs):
            pass

    data = Digits(batch_size=64)
    task = ClassificationTask("quiet-vit-tiny", {"patch_size": 2, "embed_dim": 32, "depth": 2, "num_heads": 2},
                              data.data_info)
    tensorboard, csv, wandb = TensorBoardLogger(tmp_path, name="tb"), CSVLogger(tmp_path, name="csv"), FakeWandb()
    trainer = L.Trainer(max_epochs=2, limit_train_batches=2, limit_val_batches=1, logger=[tensorboard, csv, wandb],
                        callbacks=[DrawPictures(every_n_epochs=2)], enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(task, data)
    events = EventAccumulator(tensorboard.log_dir, size_guidance={"images": 0})
    events.Reload()
    tags = set(events.Tags()["images"])
    assert {"pictures/attention", "pictures/quiet_nothing", "pictures/rollout", "pictures/patch_filters"} <= tags
    assert all(len(events.Images(t)) == 1 for t in tags)  # epoch 2 only: every_n_epochs=2
    pngs = sorted(p.name for p in (Path(csv.log_dir) / "pictures" / "epoch-1").iterdir())
    assert "quiet_nothing.png" in pngs and not [p for p in pngs if "partial" in p]
    assert {key for key, _, _ in wandb.images} == tags and all(len(shape) == 3 for _, shape, _ in wandb.images)
    with pytest.raises(ValueError, match="every_n_epochs must be an integer >= 1"):
        DrawPictures(every_n_epochs=0)


@pytest.mark.slow  # 9 s: a fit from a recipe; test_callback_logs_to_tensorboard_wandb_and_csv covers the callback
def test_callback_switched_on_from_a_recipe(tmp_path):
    """The recipe's trainer.callbacks turns it on; with a CSV logger the pictures are PNG files of the run."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    recipe = (repo / "recipes" / "quickstart.yaml").read_text().replace("max_epochs: 30", "max_epochs: 1")
    recipe = recipe.replace("  log_every_n_steps: 10\n", """  log_every_n_steps: 10
  limit_train_batches: 2
  limit_val_batches: 1
  logger: {class_path: lightning.pytorch.loggers.CSVLogger, init_args: {save_dir: logs}}
  callbacks:
    - class_path: zoo.training.pictures.DrawPictures
      init_args: {every_n_epochs: 1}
""").replace("runs/quickstart/micro-vit-tiny.digits", str(tmp_path / "release"))
    (tmp_path / "r.yaml").write_text(recipe)
    out = subprocess.run([sys.executable, "-m", "zoo.cli", "fit", "--config", "r.yaml", "--trainer.enable_progress_bar",
                          "false"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    drawn = {p.name for p in tmp_path.glob("logs/lightning_logs/version_0/pictures/epoch-0/*.png")}
    assert {"micro_saliency.png", "rollout.png", "attention_distance.png", "patch_filters.png"} <= drawn


def test_pictures_refuse_non_finite_inputs(tmp_path):
    model = zoo.create("vit-tiny")
    x = torch.rand(1, 1, 28, 28)
    x[0, 0, 3, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN or infinite"):
        pictures(model, x)
    with pytest.raises(ValueError, match="finite floating-point input, got torch.uint8"):
        pictures(model, torch.zeros(1, 1, 28, 28, dtype=torch.uint8))
    np.save(tmp_path / "nan.npy", np.full((28, 28), np.nan, dtype=np.float32))
    with pytest.raises(SystemExit, match="NaN or infinite"):
        viz("vit-tiny.mnist", "--out", tmp_path / "out", "--input", tmp_path / "nan.npy")
    assert not (tmp_path / "out").exists()
