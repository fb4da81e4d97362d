"""timm's model contract, checked by timm's own test suite and against timm's own data pipeline.

`bash .ci/timm-tests` puts the tests/ folder of the installed timm's source distribution in
$ZOO_TIMM_TESTS (default ~/.cache/zoo/timm-<version>-tests); CI runs it before the tests.
Its test functions run here on every zoo model registered with timm, so a timm release that
changes the contract fails here. timm sorts its own ViT-style models (patch tokens, no
feature map from forward_features) into the "non-standard" config test by name; zoo's
ViTs and FusedAttention networks are the same kind and take that test too.
"""

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
import timm
import torch

import zoo
from tests.conftest import data_root
from zoo.models.registry import in_timm
from zoo.release.timm_models import timm_name

TIMM_TESTS = Path(os.environ.get("ZOO_TIMM_TESTS", Path.home() / ".cache" / "zoo" / f"timm-{timm.__version__}-tests"))
ZOO_ENTRIES = [e for e in zoo.models.registry._entries().values() if in_timm(e)]
NAMES = [timm_name(e.name) for e in ZOO_ENTRIES]
TAGGED = [f"{timm_name(n)}.{t}" for n in (e.name for e in ZOO_ENTRIES) for t in zoo.models.registry.pretrained_tags(n)]


@pytest.fixture(scope="module")
def timm_tests():
    """timm's tests/test_models.py as a module (not collected here: only its functions are called)."""
    path = TIMM_TESTS / "test_models.py"
    if not path.is_file():
        pytest.skip(f"timm {timm.__version__}'s own tests are not in {TIMM_TESTS}: run `bash .ci/timm-tests`")
    spec = importlib.util.spec_from_file_location("timm_test_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_image_model_and_checkpoint_is_in_timms_registry():
    assert set(NAMES) <= set(timm.list_models())
    assert {"micro_vit_tiny", "vit_tiny", "fused_2d_tiny", "fused_pool_vit_tiny"} <= set(NAMES)
    assert "fused_1d_tiny" not in NAMES and "fused_3d_tiny" not in NAMES  # timm's pipeline makes 2-D images
    assert set(TAGGED) == set(timm.list_pretrained("*")) & {t for t in TAGGED}
    # 8 ViT checkpoints (4 attentions x MNIST/Fashion), fused-2d-tiny.mnist and issue 25's two MNIST ViTs
    assert len(TAGGED) == 11
    for name in NAMES:  # the default tag is timm's default: zoo.load(name) and create_model(name) agree
        default = zoo.models.registry.entry(name.replace("_", "-")).default_tag
        if zoo.models.registry.pretrained_tags(name.replace("_", "-")):
            assert timm.models.get_pretrained_cfg(name).tag == (default or zoo.models.registry.pretrained_tags(
                name.replace("_", "-"))[0])


@pytest.mark.parametrize("name", NAMES)
def test_timm_forward_backward_and_cfgs(timm_tests, name):
    timm_tests.test_model_forward(name, 1)
    timm_tests.test_model_backward(name, 2)
    timm_tests.test_model_default_cfgs_non_std(name, 1, "meta")


@pytest.mark.parametrize("name", NAMES)
def test_timm_forward_intermediates_and_features(timm_tests, name):
    timm_tests.test_model_forward_intermediates(name, 1)
    timm_tests.test_model_forward_intermediates_features(name, 1)
    timm_tests.test_model_forward_features(name, 1)


@pytest.mark.parametrize("name", NAMES)
def test_timm_forward_fx(timm_tests, name):
    """timm's symbolic tracing (torch.fx, as its feature extraction does) gives the model's own output."""
    timm_tests.test_model_forward_fx(name, 1)


@pytest.mark.parametrize("name", TAGGED)
def test_timm_pretrained(timm_tests, name):
    timm_tests.test_model_default_cfgs_non_std(name, 1, "meta")
    timm_tests.test_model_load_pretrained(name, 1)
    timm_tests.test_model_features_pretrained(name, 1)


@pytest.mark.parametrize("name", TAGGED)
def test_timm_pretrained_is_zoos_checkpoint(name):
    """The weights and the preprocessing timm gives are those of zoo.load, and the cfg says how it was trained."""
    model = timm.create_model(name, pretrained=True).eval()
    reference = zoo.load(name.replace("_", "-"))
    x = torch.randn(3, *reference.input_shape)
    torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)
    cfg = timm.data.resolve_model_data_config(model)
    assert cfg["crop_pct"] == 1.0 and cfg["input_size"] == reference.input_shape
    assert cfg["mean"] == tuple(reference.config["mean"]) and cfg["std"] == tuple(reference.config["std"])
    assert model.pretrained_cfg["label_names"] == tuple(reference.config["label_names"])
    assert model.config == reference.config  # preprocess, classify and save_pretrained see the checkpoint's config


def test_timm_eval_transform_equals_preprocess():
    """timm's eval pipeline from the model's own config gives model.preprocess's input, on PIL images of
    the model's size (the shipped data) and of other sizes (resized with the same interpolation)."""
    from PIL import Image

    model = timm.create_model("vit_tiny.mnist", pretrained=True)
    transform = timm.data.create_transform(**timm.data.resolve_model_data_config(model))
    rng = np.random.default_rng(0)
    for size in (28, 28, 56):
        image = Image.fromarray(rng.integers(0, 256, (size, size), dtype=np.uint8), mode="L")
        ours = model.preprocess(image)[0]
        theirs = transform(image)
        if size == 28:
            torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-6)
        else:  # PIL's and PyTorch's antialiased bilinear filters differ by a few levels of 255
            assert (theirs - ours).abs().mean() < 0.05 / model.config["std"][0]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["vit_tiny.mnist", "micro_vit_tiny.fashion", "fused_2d_tiny.mnist"])
def test_timm_pipeline_accuracy_equals_preprocess(name):
    """On the whole test set, timm's data pipeline scores exactly what model.preprocess scores."""
    from PIL import Image

    root = data_root()
    if root is None:
        pytest.skip("shared data folder not found")
    import torchvision

    dataset = torchvision.datasets.FashionMNIST if "fashion" in name else torchvision.datasets.MNIST
    test_set = dataset(str(root), train=False, download=False)
    images, labels = test_set.data.numpy(), test_set.targets
    model = timm.create_model(name, pretrained=True).eval()
    transform = timm.data.create_transform(**timm.data.resolve_model_data_config(model))
    with torch.no_grad():
        ours = model(model.preprocess(images[:, None])).argmax(-1)
        theirs = model(torch.stack([transform(Image.fromarray(i, mode="L")) for i in images])).argmax(-1)
    assert (ours == labels).float().mean() == (theirs == labels).float().mean()
    assert (ours == theirs).all()  # not only as many right: the same answer for every image


# ---- zoo's side of the contract, against independent references -------------------------------


@pytest.mark.parametrize("indices", [None, 1, 3, [0, 2], [-1], (1, -2)])
def test_take_indices_follow_timm(indices):
    from timm.models._features import feature_take_indices

    from zoo.models.layers import take_indices

    assert take_indices(4, indices, "m") == tuple(feature_take_indices(4, indices))


@pytest.mark.parametrize("name", ["micro-vit-tiny", "fused-2d-tiny"])
def test_forward_intermediates_are_the_blocks_outputs(name):
    """Each level is what a forward hook on that block sees, laid out as asked; stop_early changes nothing
    before the last level; pruning keeps the levels and survives a save and load."""
    model = zoo.create(name).eval()
    x = torch.randn(2, 1, 28, 28)
    seen = []
    hooks = [b.register_forward_hook(lambda m, i, o: seen.append(o)) for b in model.blocks]
    final = model.forward_features(x)
    for h in hooks:
        h.remove()
    levels = ([model.embed_tokens(x)] if model.embedding_level else []) + seen
    prefix, grid = model.num_prefix_tokens, model.grid
    final2, inter = model.forward_intermediates(x, indices=[0, -1], output_fmt="NLC")
    torch.testing.assert_close(final2, final)
    for got, want in zip(inter, (levels[0], levels[-1])):
        torch.testing.assert_close(got, want[:, prefix:])
    nchw = model.forward_intermediates(x, indices=1, norm=True, intermediates_only=True, stop_early=True)[0]
    want = model.norm(levels[-1])[:, prefix:]
    torch.testing.assert_close(nchw, want.reshape(2, *grid, -1).permute(0, 3, 1, 2))
    model.prune_intermediate_layers([1], prune_norm=True)
    assert len(model.feature_info) == 2
    pruned = model.forward_intermediates(x, indices=[1], intermediates_only=True, output_fmt="NLC")[0]
    torch.testing.assert_close(pruned, levels[1][:, prefix:])
    assert model(x).shape == (2, model.head_hidden_size)  # no classifier left


def test_pruned_model_saves_and_loads(tmp_path):
    model = zoo.create("vit-tiny").eval()
    model.prune_intermediate_layers(2, prune_norm=True)
    x = torch.randn(2, 1, 28, 28)
    again = zoo.load(model.save_pretrained(tmp_path / "pruned"))
    assert len(again.blocks) == 4 and isinstance(again.norm, torch.nn.Identity) and again.num_classes == 0
    torch.testing.assert_close(again(x), model(x))


@pytest.mark.parametrize("name", ["quiet-vit-tiny", "fused-2d-tiny"])
def test_grad_checkpointing_recomputes_and_changes_nothing(name):
    """With checkpointing each block runs again in the backward pass (so its activations were not kept),
    and the gradients are the same."""
    model = zoo.create(name).train()
    calls = []
    for block in model.blocks:
        block.register_forward_pre_hook(lambda m, i: calls.append(m))  # a recomputation may stop early
    x = torch.randn(4, 1, 28, 28)
    grads = []
    for enable in (False, True):
        model.set_grad_checkpointing(enable)
        model.zero_grad()
        calls.clear()
        model(x).square().mean().backward()
        assert len(calls) == len(model.blocks) * (2 if enable else 1)
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_drop_path_rate_as_timm(tmp_path):
    from timm.layers import calculate_drop_path_rates

    model = timm.create_model("vit_tiny", drop_path_rate=0.3)
    rates = [getattr(b.drop_path, "drop_prob", 0.0) for b in model.blocks]
    assert rates == pytest.approx(calculate_drop_path_rates(0.3, 4))
    plain = timm.create_model("vit_tiny")
    plain.load_state_dict(model.state_dict())  # stochastic depth adds no weights
    x = torch.randn(8, 1, 28, 28)
    torch.testing.assert_close(model.eval()(x), plain.eval()(x))  # and does nothing in eval
    model.train()
    assert not torch.allclose(model(x), model(x))  # but drops residual branches in training
    assert zoo.load(model.save_pretrained(tmp_path / "m")).config["drop_path_rate"] == 0.3  # kept for fine-tuning


def test_factory_device_dtype_and_reset_classifier():
    model = timm.create_model("micro_vit_tiny", device="meta", dtype=torch.float64)
    assert {(p.device.type, p.dtype) for p in model.parameters()} == {("meta", torch.float64)}
    model.eval().reset_classifier(3)
    assert model.head.weight.device.type == "meta" and model.head.weight.dtype == torch.float64
    assert not model.head.training
    model = zoo.create("fused-2d-tiny", dtype=torch.bfloat16)
    assert model(torch.randn(2, 1, 28, 28, dtype=torch.bfloat16)).dtype == torch.bfloat16
    with pytest.raises(TypeError, match="floating-point torch.dtype"):
        zoo.create("vit-tiny", dtype=torch.int8)
    with pytest.raises(TypeError, match="not_an_argument"):
        timm.create_model("vit_tiny", not_an_argument=1)
    with pytest.raises(ValueError, match="no pretrained weights"):
        timm.create_model("vit_small", pretrained=True)


@pytest.mark.parametrize("name", ["quiet_vit_tiny.mnist", "fused_2d_tiny.mnist"])
def test_pretrained_first_layer_adapted_to_three_channels(name):
    """timm spreads the gray checkpoint's first layer over 3 channels: a gray image given as RGB (three
    equal channels) then scores as it does on the original model."""
    gray = timm.create_model(name, pretrained=True).eval()
    rgb = timm.create_model(name, pretrained=True, in_chans=3).eval()
    x = torch.rand(2, 1, 28, 28)
    torch.testing.assert_close(rgb(x.expand(-1, 3, -1, -1)), gray(x), rtol=1e-4, atol=1e-5)


def test_pretrained_cfg_overlay_takes_another_file():
    """timm's pretrained_cfg_overlay points the default config at other weights: the Fashion checkpoint's,
    whose own config.json then gives the model its preprocessing and label names."""
    fashion = zoo.models.registry.checkpoint_folder("vit-tiny.fashion") / "model.safetensors"
    model = timm.create_model("vit_tiny", pretrained=True, pretrained_cfg_overlay={"file": str(fashion)}).eval()
    reference = zoo.load("vit-tiny.fashion")
    x = torch.rand(2, 1, 28, 28)
    torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)
    assert model.config["label_names"] == reference.config["label_names"]


def test_pretrained_weights_only_safetensors_and_finite(tmp_path):
    from safetensors.torch import save_file

    with pytest.raises(ValueError, match="safetensors files only"):
        timm.create_model("vit_tiny", pretrained=True, pretrained_cfg_overlay={"file": str(tmp_path / "w.pth")})
    state = {k: v.clone() for k, v in zoo.load("vit-tiny.mnist").state_dict().items()}
    state["blocks.0.attn.qkv.weight"][0, 0] = float("inf")
    save_file(state, tmp_path / "bad.safetensors")
    with pytest.raises(ValueError, match="'blocks.0.attn.qkv.weight' holds NaN or infinite values"):
        timm.create_model("vit_tiny", pretrained=True,
                          pretrained_cfg_overlay={"file": str(tmp_path / "bad.safetensors")})


def test_bad_device_indices_and_formats_are_named():
    with pytest.raises(ValueError, match="device must name a torch device"):
        zoo.create("vit-tiny", device="gpu7")
    model = zoo.create("vit-tiny")
    x = torch.rand(1, 1, 28, 28)
    with pytest.raises(ValueError, match="has 4 blocks; indices=5"):
        model.forward_intermediates(x, indices=5)
    with pytest.raises(ValueError, match=r"indices 0..3 or -4..-1\), got indices=\[0, 9\]"):
        model.forward_intermediates(x, indices=[0, 9])
    with pytest.raises(ValueError, match="output_fmt must be 'NCHW' or 'NLC', got 'NHWC'"):
        model.forward_intermediates(x, output_fmt="NHWC")
    collection = zoo.create("fused-2d-tiny", collection=5, input_size=(8, 8), patch_size=(8, 8))
    with pytest.raises(ValueError, match="tokens have no grid: use output_fmt='NLC'"):
        collection.forward_intermediates(torch.rand(1, 5, 1, 8, 8))
