"""timm's transfer-learning contract, whole (issue 23): img_size, dynamic_img_size, group_matcher, grad checkpointing.

Each test holds zoo to an independent reference: timm's own VisionTransformer (layer decay), the bicubic
resampling formula written out with torch (position embeddings), a model built at the new size, or the
same computation without the feature (checkpointing); and each refusal names what to change.
"""

import logging

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer
from timm.optim import create_optimizer_v2

import zoo


def lr_scales(model) -> dict[str, float]:
    """timm's layer-wise learning-rate scale of each parameter, by name."""
    names = {id(p): n for n, p in model.named_parameters()}
    groups = create_optimizer_v2(model, lr=1e-3, layer_decay=0.75).param_groups
    return {names[id(p)]: g["lr_scale"] for g in groups for p in g["params"]}


def part(name: str) -> str:
    """cls_token, patch_embed, blocks.3, norm, head: the unit that layer decay scales as one."""
    first, rest = name.split(".")[0], name.split(".")[1:]
    return {"cls_token": "stem", "pos_embed": "stem", "patch_embed": "stem", "tok_embed": "stem"}.get(
        first, f"blocks.{rest[0]}" if first == "blocks" else first)


@pytest.mark.parametrize("depth", [4, 12])
def test_layer_decay_groups_as_timms_vit(depth):
    """timm's layer decay gives each zoo image model's parts the scales it gives its own ViT of the same depth:
    depth + 2 of them (embedding, each block with the final norm on the last, head), and as many groups."""
    theirs = VisionTransformer(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=64, depth=depth,
                               num_heads=4)
    want = {part(n): s for n, s in lr_scales(theirs).items()}
    assert len(set(want.values())) == depth + 2
    for model in (zoo.create("vit-tiny", embed_dim=64, depth=depth), zoo.create("micro-vit-tiny", depth=depth)):
        got = {part(n): s for n, s in lr_scales(model).items()}
        assert got == want
        groups = len(create_optimizer_v2(model, lr=1e-3, layer_decay=0.75).param_groups)
        assert groups == len(create_optimizer_v2(theirs, lr=1e-3, layer_decay=0.75).param_groups)
    if depth == 12:
        assert groups == 28  # the count: 10 before group_matcher


def test_layer_decay_groups_fused_and_text():
    fused = {part(n): s for n, s in lr_scales(zoo.create("fused-2d-tiny")).items()}  # 2 blocks
    assert fused == {"stem": 0.75 ** 3, "blocks.0": 0.75 ** 2, "blocks.1": 0.75, "norm": 0.75, "pool": 1.0,
                     "head": 1.0}
    text = {part(n): s for n, s in lr_scales(zoo.create("gpt-tiny")).items()}  # the head is the tied embedding
    assert text == {"stem": 0.75 ** 4, "blocks.0": 0.75 ** 3, "blocks.1": 0.75 ** 2, "blocks.2": 0.75,
                    "blocks.3": 1.0, "norm": 1.0}


def bicubic_resample(pos_embed, old, new, prefix):
    """The formula timm applies (resample_abs_pos_embed), written out: prefix rows kept, the grid resized."""
    grid = pos_embed[:, prefix:].reshape(1, old, old, -1).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=(new, new), mode="bicubic", align_corners=False, antialias=True)
    return torch.cat([pos_embed[:, :prefix], grid.permute(0, 2, 3, 1).reshape(1, new * new, -1)], dim=1)


@pytest.mark.parametrize("img_size", [35, 21])  # a 4x4 grid of 7-pixel patches to 5x5 and 3x3
def test_load_at_another_img_size_resamples_positions(img_size, caplog):
    stored = zoo.load("vit-tiny.mnist")
    with caplog.at_level(logging.INFO, logger="zoo.models.pretrained"):
        model = zoo.load("vit-tiny.mnist", img_size=img_size)
    grid = img_size // 7
    assert f"pos_embed resampled from a 4x4 grid of patches to {grid}x{grid}" in caplog.text
    want = bicubic_resample(stored.pos_embed, 4, grid, prefix=1)
    torch.testing.assert_close(model.pos_embed, want)
    torch.testing.assert_close(model.pos_embed[:, 0], stored.pos_embed[:, 0], rtol=0, atol=0)  # the class token's
    others = {k: v for k, v in model.state_dict().items() if k != "pos_embed"}
    assert all(torch.equal(v, stored.state_dict()[k]) for k, v in others.items())
    assert model(torch.rand(2, 1, img_size, img_size)).shape == (2, 10)
    theirs = timm.create_model("vit_tiny.mnist", pretrained=True, img_size=img_size)  # timm's loading path
    torch.testing.assert_close(theirs.pos_embed, model.pos_embed, rtol=0, atol=0)
    assert timm.data.resolve_model_data_config(theirs)["input_size"] == (1, img_size, img_size)


def test_img_size_on_fused_networks_and_sincos_positions(tmp_path):
    stored = zoo.load("fused-2d-tiny.mnist")  # learned positions on a 7x7 grid, no prefix token
    model = zoo.load("fused-2d-tiny.mnist", input_size=(32, 32))
    torch.testing.assert_close(model.pos_embed, bicubic_resample(stored.pos_embed, 7, 8, prefix=0))
    theirs = timm.create_model("fused_2d_tiny.mnist", pretrained=True, img_size=32)  # timm's keyword
    torch.testing.assert_close(theirs.pos_embed, model.pos_embed, rtol=0, atol=0)
    sincos = zoo.create("vit-tiny", pos_embed="sincos").eval()  # positions are computed, not stored
    again = zoo.load(sincos.save_pretrained(tmp_path / "s"), img_size=32)
    fresh = zoo.create("vit-tiny", pos_embed="sincos", img_size=32)
    torch.testing.assert_close(again.pos_embed, fresh.pos_embed, rtol=0, atol=0)


def test_img_size_refusals(tmp_path):
    with pytest.raises(ValueError, match=r"divisible by patch_size, got 30 and 7 \(the nearest are 28 and 35\)"):
        zoo.load("vit-tiny.mnist", img_size=30)
    biased = zoo.create("vit-tiny", learned_bias=True)  # a bias per token pair cannot be resampled: strict says so
    with pytest.raises(ValueError, match=r"shape mismatch.*attn_bias"):
        zoo.load(biased.save_pretrained(tmp_path / "b"), img_size=32)
    oblong = zoo.create("fused-2d-tiny", input_size=(28, 32))  # a 7x8 grid: not square, its layout not stored
    with pytest.raises(ValueError, match=r"model.safetensors: .*square grid of patches to its own \(8, 8\); "
                                         r"got \(1, 56, 64\)"):
        zoo.load(oblong.save_pretrained(tmp_path / "o"), input_size=(32, 32))


def test_dynamic_img_size_resamples_on_the_fly(tmp_path):
    plain, dynamic = zoo.load("vit-tiny.mnist"), zoo.load("vit-tiny.mnist", dynamic_img_size=True)
    x = torch.rand(2, 1, 28, 28)
    torch.testing.assert_close(dynamic(x), plain(x), rtol=0, atol=0)  # at its own size, nothing changes
    x35 = torch.rand(2, 1, 35, 35)  # the same resampling as loading at that size
    torch.testing.assert_close(dynamic(x35), zoo.load("vit-tiny.mnist", img_size=35)(x35))
    wide = torch.rand(1, 1, 21, 42)
    assert dynamic(wide).shape == (1, 10)
    levels = dynamic.forward_intermediates(wide, indices=[-1], intermediates_only=True)
    assert levels[0].shape == (1, 128, 3, 6)
    again = zoo.load(dynamic.save_pretrained(tmp_path / "d"))
    assert again.config["dynamic_img_size"] is True
    torch.testing.assert_close(again(wide), dynamic(wide), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"\(batch, 1, H, W\) with H and W multiples of the patch size 7, "
                                         r"got \(1, 1, 30, 35\)"):
        dynamic(torch.rand(1, 1, 30, 35))
    with pytest.raises(ValueError, match=r"expects images of shape \(batch, 1, 28, 28\), got \(1, 1, 35, 35\)"):
        plain(torch.rand(1, 1, 35, 35))
    with pytest.raises(ValueError, match="dynamic_img_size needs learned_bias=False"):
        zoo.create("vit-tiny", dynamic_img_size=True, learned_bias=True)
    with pytest.raises(TypeError, match="dynamic_img_size must be true or false"):
        zoo.create("vit-tiny", dynamic_img_size="yes")


def test_dynamic_img_size_fused_network():
    dynamic = timm.create_model("fused_2d_tiny.mnist", pretrained=True, dynamic_img_size=True).eval()
    x = torch.rand(2, 1, 32, 32)
    torch.testing.assert_close(dynamic(x), zoo.load("fused-2d-tiny.mnist", input_size=(32, 32))(x))
    assert dynamic.attention_map(torch.rand(1, 1, 32, 36)).shape == (1, 4, 8, 9)
    sincos = zoo.create("fused-1d-tiny", pos_embed="sincos", dynamic_img_size=True).eval()
    seq = torch.rand(1, 1, 48)  # sin-cos positions computed for 12 tokens: as a model built for 48
    fresh = zoo.create("fused-1d-tiny", pos_embed="sincos", input_size=(48,))
    fresh.load_state_dict(sincos.state_dict())
    torch.testing.assert_close(sincos(seq), fresh.eval()(seq))
    with pytest.raises(ValueError, match=r"multiples of the patch size \(4, 4\), got \(1, 1, 30, 32\)"):
        dynamic(torch.rand(1, 1, 30, 32))
    with pytest.raises(ValueError, match="dynamic_img_size needs a 2-D input"):
        zoo.create("fused-3d-tiny", dynamic_img_size=True)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("name", ["vit-tiny.mnist", "fused-2d-tiny.mnist"])
def test_fx_traced_models_keep_their_checks(name, dynamic):
    """Symbolic tracing (timm's feature extraction) keeps the input checks and the resampling in the graph:
    they run on the real input, as in the model."""
    from timm.models._features_fx import create_feature_extractor, get_graph_node_names

    model = zoo.load(name, dynamic_img_size=dynamic)
    last = get_graph_node_names(model)[1][-1]
    traced = create_feature_extractor(model, return_nodes=[last])
    size = 28 + 7 * dynamic
    x = torch.rand(2, 1, size, size + 7 * dynamic)
    if "fused" in name:  # 4-pixel patches
        x = x[..., : size // 4 * 4, : x.shape[-1] // 4 * 4]
    torch.testing.assert_close(traced(x)[last], model(x))
    with pytest.raises(ValueError, match=f"{type(model).__name__} expects"):
        traced(torch.rand(2, 1, 27, 27))


@pytest.mark.parametrize("name", ["gpt-tiny", "micro-gpt-tiny"])
def test_text_grad_checkpointing_recomputes_and_changes_nothing(name):
    """Each block runs again in the backward pass with checkpointing, and the gradients are the same."""
    model = zoo.create(name, depth=2).train()
    calls = []
    for block in model.blocks:
        block.register_forward_pre_hook(lambda m, i: calls.append(m))
    idx = torch.randint(0, model.vocab_size, (2, 16))
    grads = []
    for enable in (False, True):
        model.set_grad_checkpointing(enable)
        model.zero_grad()
        calls.clear()
        model(idx).logsumexp(-1).mean().backward()
        assert len(calls) == len(model.blocks) * (2 if enable else 1)
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
    with torch.no_grad():  # nothing to recompute for
        calls.clear()
        model(idx)
        assert len(calls) == len(model.blocks)
    with pytest.raises(TypeError, match="set_grad_checkpointing enable must be true or false"):
        model.set_grad_checkpointing("yes")
