"""Zoo attention in other people's models (zoo.attention.swap, issue 23): timm ViTs, nn.Transformer's layers.

Swapping to softmax keeps the weights, and the outputs are held against the untouched model; quiet is held
against nn.MultiheadAttention(add_zero_attn=True), cross-attention and attn_mask against float64 loops
written from the formula. Bad input is refused before the model is touched.
"""

import copy
import logging
import math

import pytest
import timm
import torch
from torch import nn

from zoo.attention import MultiheadAdapter, SoftmaxAttention, TimmAttention, build, swap
from zoo.models.image_transformer import ImageTransformer

CAUSAL = "causal"


def tiny_vit() -> nn.Module:
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, num_classes=5,
                             depth=2).eval()


def cross_attention_reference(layer, x, context, key_padding_mask=None, quiet=False):
    """softmax(q k^T / sqrt(d)) v per (batch, head, query), q from x and k, v from the context, in float64."""
    d, hd = layer.dim, layer.head_dim
    w, b = layer.qkv.weight.double(), layer.qkv.bias.double()
    q = x.double() @ w[:d].T + b[:d]
    k = context.double() @ w[d : 2 * d].T + b[d : 2 * d]
    v = context.double() @ w[2 * d :].T + b[2 * d :]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for bi in range(x.shape[0]):
        keys = [j for j in range(context.shape[1]) if key_padding_mask is None or key_padding_mask[bi, j]]
        for h in range(layer.heads):
            sl = slice(h * hd, (h + 1) * hd)
            for i in range(x.shape[1]):
                logits = torch.stack([q[bi, i, sl] @ k[bi, j, sl] / math.sqrt(hd) for j in keys])
                weights = logits.exp() / (logits.exp().sum() + (1.0 if quiet else 0.0))
                out[bi, i, sl] = sum(wj * v[bi, j, sl] for wj, j in zip(weights, keys))
    return out @ layer.proj.weight.double().T + layer.proj.bias.double()


def test_swap_to_softmax_leaves_a_timm_vit_unchanged(caplog):
    vit = tiny_vit()
    images = torch.randn(2, 3, 32, 32)
    tokens = 1 + (32 // 8) ** 2
    allowed = torch.rand(2, 1, tokens, tokens) > 0.3
    allowed[..., 0] = True  # every row keeps a key (the class token's); the masks forbid some rows their own
    assert not allowed.diagonal(dim1=-2, dim2=-1).all()
    with caplog.at_level(logging.INFO, logger="zoo.attention.swapping"):
        swapped = swap(copy.deepcopy(vit), "softmax")
    assert all(isinstance(block.attn, TimmAttention) and type(block.attn.attn) is SoftmaxAttention
               for block in swapped.blocks)
    assert "blocks.0.attn: Attention -> softmax, kept q, k, v and the output projection" in caplog.text
    with torch.no_grad():
        torch.testing.assert_close(swapped(images), vit(images), rtol=0, atol=1e-5)
        torch.testing.assert_close(swapped(images, attn_mask=allowed), vit(images, attn_mask=allowed),
                                   rtol=0, atol=1e-5)
        torch.testing.assert_close(swapped(images, is_causal=True), vit(images, is_causal=True), rtol=0, atol=1e-5)
        # and the swap changed something: quiet attention is another function of the same weights
        assert (swap(copy.deepcopy(vit), "quiet")(images) - vit(images)).abs().max() > 1e-4


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("masks", [(), ("padding",), (CAUSAL,), (CAUSAL, "padding")])
def test_swap_to_softmax_leaves_a_transformer_encoder_unchanged(batch_first, masks):
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=batch_first), 2,
                                    enable_nested_tensor=batch_first).eval()
    swapped = swap(copy.deepcopy(encoder), "softmax")
    assert all(isinstance(layer.self_attn, MultiheadAdapter) for layer in swapped.layers)
    tokens = torch.randn(3, 7, 32)
    padding = torch.zeros(3, 7, dtype=torch.bool)
    padding[1, 5:], padding[2, 3:] = True, True  # PyTorch's meaning: True = padding
    kwargs = {}
    if "padding" in masks:
        kwargs["src_key_padding_mask"] = padding
    if CAUSAL in masks:
        kwargs["mask"] = nn.Transformer.generate_square_subsequent_mask(7)
    src = tokens if batch_first else tokens.transpose(0, 1)
    with torch.no_grad():  # (the reference takes PyTorch's fused fast path where it can)
        expected, got = encoder(src, **kwargs), swapped(src, **kwargs)
    if not batch_first:
        expected, got = expected.transpose(0, 1), got.transpose(0, 1)
    real = ~padding if "padding" in masks else torch.ones(3, 7, dtype=torch.bool)
    torch.testing.assert_close(got[real], expected[real], rtol=0, atol=1e-5)
    # trains: the ordinary (slow) path runs the adapter with gradients
    swapped.train()
    swapped(src, **kwargs).sum().backward()
    assert swapped.layers[0].self_attn.attn.qkv.weight.grad.abs().sum() > 0


def test_swap_to_softmax_leaves_a_transformer_decoder_unchanged():
    decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True), 2).eval()
    swapped = swap(copy.deepcopy(decoder), "softmax")
    target, memory = torch.randn(2, 5, 16), torch.randn(2, 9, 16)
    memory_padding = torch.zeros(2, 9, dtype=torch.bool)
    memory_padding[0, 6:] = True
    kwargs = {"tgt_mask": nn.Transformer.generate_square_subsequent_mask(5), "tgt_is_causal": True,
              "memory_key_padding_mask": memory_padding}
    with torch.no_grad():
        torch.testing.assert_close(swapped(target, memory, **kwargs), decoder(target, memory, **kwargs),
                                   rtol=0, atol=1e-5)


@pytest.mark.parametrize("cross", [False, True])
def test_quiet_equals_multihead_attention_with_add_zero_attn(cross):
    mha = nn.MultiheadAttention(16, 4, add_zero_attn=True, batch_first=True).eval()
    with torch.no_grad():
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    quiet = swap(copy.deepcopy(mha), "quiet")
    x = torch.randn(2, 5, 16) * 3
    keys = torch.randn(2, 9, 16) * 3 if cross else x
    padding = torch.zeros(2, keys.shape[1], dtype=torch.bool)
    padding[1, -3:] = True
    bias = torch.randn(5, keys.shape[1])
    for kwargs in ({}, {"key_padding_mask": padding}, {"attn_mask": bias}):
        expected = mha(x, keys, keys, need_weights=False, **kwargs)[0]
        got, weights = quiet(x, keys, keys, **kwargs)
        assert weights is None
        # self-attention with padding: zoo's padded positions are zero, PyTorch's are computed; compare the rest
        real = ~padding if "key_padding_mask" in kwargs and not cross else torch.ones(2, 5, dtype=torch.bool)
        torch.testing.assert_close(got[real], expected[real], rtol=0, atol=1e-5)
    # plain softmax with the same weights is another function: the zero key is what makes the two equal, so a
    # swap to softmax would drop it, and is refused unless asked for, then said in a warning
    with pytest.raises(ValueError, match=r"add_zero_attn=True, which is quiet attention.*strict=False"):
        swap(copy.deepcopy(mha), "softmax")
    with pytest.warns(UserWarning, match="swap to softmax dropped the model: its key and value of zeros"):
        softmax = swap(copy.deepcopy(mha), "softmax", strict=False)
    assert (softmax(x, keys, keys)[0] - mha(x, keys, keys)[0]).abs().max() > 1e-3


@pytest.mark.parametrize("mechanism", ["softmax", "quiet"])
def test_cross_attention_matches_the_formula(mechanism):
    layer = build(mechanism, 12, heads=3)
    with torch.no_grad():
        layer.qkv.bias.normal_()
    x, context = torch.randn(2, 4, 12), torch.randn(2, 6, 12)
    real = torch.ones(2, 6, dtype=torch.bool)
    real[0, 4:] = False  # zoo's meaning: True = real token
    for mask in (None, real):
        expected = cross_attention_reference(layer, x, context, mask, quiet=mechanism == "quiet")
        torch.testing.assert_close(layer(x, mask, context=context).double(), expected, rtol=1e-5, atol=1e-5)
    # what sits at padded context positions never reaches an output
    garbage = context.clone()
    garbage[0, 4:] = float("nan")
    torch.testing.assert_close(layer(x, real, context=garbage), layer(x, real, context=context))


def test_attn_mask_and_is_causal_match_the_formula():
    layer = build("softmax", 8, heads=2)
    causal_twin = build("softmax", 8, heads=2, causal=True)
    causal_twin.load_state_dict(layer.state_dict())
    x = torch.randn(2, 5, 8)
    allowed = torch.rand(2, 2, 5, 5) > 0.4
    allowed[..., 0] = True  # every row keeps a key; some are forbidden their own (no diagonal crutch)
    assert not allowed.diagonal(dim1=-2, dim2=-1).all()
    additive = torch.zeros(2, 2, 5, 5).masked_fill(~allowed, float("-inf"))
    # the float64 formula: logits + mask, softmax, through the same projections
    d, hd = 8, 4
    w, b = layer.qkv.weight.double(), layer.qkv.bias.double()
    q, k, v = (x.double() @ w.T + b).split(d, -1)
    heads = [t.view(2, 5, 2, hd).transpose(1, 2) for t in (q, k, v)]
    logits = heads[0] @ heads[1].transpose(-1, -2) / math.sqrt(hd) + additive.double()
    out = (logits.softmax(-1) @ heads[2]).transpose(1, 2).reshape(2, 5, d)
    expected = out @ layer.proj.weight.double().T + layer.proj.bias.double()
    torch.testing.assert_close(layer(x, attn_mask=allowed).double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer(x, attn_mask=additive).double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer(x, is_causal=True), causal_twin(x))


@pytest.mark.parametrize("mechanism, options", [("micro", {}), ("elita", {"causal": True})])
def test_micro_and_elita_swaps_train_and_report_fresh_weights(mechanism, options, caplog):
    vit = tiny_vit().train()
    with caplog.at_level(logging.INFO, logger="zoo.attention.swapping"):
        swapped = swap(vit, mechanism, **options)
    assert "2 attention module(s) start from fresh weights" in caplog.text
    assert "blocks.0.attn, blocks.1.attn" in caplog.text
    assert [r.levelname for r in caplog.records if "fresh weights (" in r.getMessage()] == ["WARNING"]
    # every token's features (under elita's causality the class token, first, sees only itself)
    swapped.forward_features(torch.randn(2, 3, 32, 32)).sum().backward()
    new = swapped.blocks[0].attn.attn
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in new.parameters())
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 1)
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[0, 4:] = True
    swap(encoder, mechanism, **options)(torch.randn(2, 6, 16), src_key_padding_mask=padding).sum().backward()


def test_swapping_zoo_layers_keeps_their_weights():
    model = ImageTransformer(img_size=8, patch_size=4, embed_dim=16, depth=2, num_heads=2).eval()
    images = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        before = model(images)
        quiet = swap(model, "quiet")
        assert type(quiet.blocks[0].attn).__name__ == "QuietAttention"
        assert (quiet(images) - before).abs().max() > 1e-5
        torch.testing.assert_close(swap(quiet, "softmax")(images), before)
    layer = build("softmax", 8, heads=2, causal=True)
    clipped = swap(copy.deepcopy(layer), "clipped", alpha=0.5)  # the layer itself comes back replaced
    assert clipped.causal and clipped.alpha == 0.5
    torch.testing.assert_close(clipped.qkv.weight, layer.qkv.weight)


def test_bad_input_is_refused_before_the_model_changes():
    vit = tiny_vit()
    with pytest.raises(ValueError, match=r"unknown attention 'softmx' \(closest: softmax\)"):
        swap(vit, "softmx")
    with pytest.raises(ValueError, match="fused pools a sequence into one vector"):
        swap(vit, "fused")
    with pytest.raises(ValueError, match="found no attention module in Sequential"):
        swap(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), "softmax")
    with pytest.raises(TypeError, match="expects a torch.nn.Module, got str"):
        swap("vit", "softmax")
    with pytest.raises(ValueError, match="elita is causal only and blocks.0.attn attends both ways"):
        swap(vit, "elita")
    with pytest.raises(TypeError, match="num_queries"):
        swap(vit, "softmax", num_queries=4)
    assert all(type(block.attn).__name__ == "Attention" for block in vit.blocks)  # untouched by the refusals
    decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(16, 2, 32, batch_first=True), 1)
    with pytest.raises(ValueError, match="micro cannot attend to another sequence, and layers.0.multihead_attn"):
        swap(decoder, "micro")
    with pytest.raises(ValueError, match="kdim=8, vdim=8 other than embed_dim=16"):
        swap(nn.MultiheadAttention(16, 2, kdim=8, vdim=8), "softmax")


def test_layers_refuse_calls_they_cannot_honour():
    x = torch.randn(2, 5, 8)
    allowed = torch.ones(5, 5, dtype=torch.bool)
    for name in ("micro", "elita"):
        with pytest.raises(ValueError, match="cannot apply an attn_mask"):
            build(name, 8, causal=True)(x, attn_mask=allowed)
    with pytest.raises(ValueError, match="takes no attn_mask"):
        build("clipped", 8)(x, attn_mask=allowed)
    softmax = build("softmax", 8, heads=2)
    with pytest.raises(ValueError, match=r"attn_mask of shape \(5, 5\) or \(batch 2 or 1, heads 2 or 1, 5, 5\), "
                                         r"got \(2, 5, 5\)"):
        softmax(x, attn_mask=torch.ones(2, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="bool .* or float .*, got dtype torch.int64"):
        softmax(x, attn_mask=torch.ones(5, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="bidirectional layer"):
        softmax(x, context=torch.randn(2, 3, 8), is_causal=True)
    with pytest.raises(ValueError, match=r"context expects input of shape \(batch, length, 8\)"):
        softmax(x, context=torch.randn(2, 3, 4))
    adapter = swap(nn.MultiheadAttention(8, 2, batch_first=True), "softmax")
    with pytest.raises(ValueError, match="key is value"):
        adapter(x, x, x.clone())
    context = x[:, :3]
    with pytest.raises(ValueError, match=r"MultiheadAdapter\(MicroAttention\) cannot attend to another sequence"):
        swap(nn.MultiheadAttention(8, 2, batch_first=True), "micro")(x, context, context)


@pytest.mark.parametrize("make, dropped", [
    (lambda: timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1,
                               qk_norm=True), r"its q_norm, its k_norm"),
    (lambda: nn.MultiheadAttention(16, 4, add_bias_kv=True, batch_first=True), r"its bias_k and bias_v"),
    (lambda: nn.MultiheadAttention(16, 4, add_zero_attn=True, batch_first=True), r"its key and value of zeros"),
])
def test_a_swap_that_would_drop_parts_is_refused_unless_asked(make, dropped):
    model = make().eval()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=f"swap to softmax would drop .*{dropped}.*pass strict=False"):
        swap(model, "softmax")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the model is as it was
    with pytest.warns(UserWarning, match=f"swap to softmax dropped .*{dropped}"):
        swap(model, "softmax", strict=False)


def test_an_attention_module_shared_by_two_layers_is_swapped_at_both():
    shared = nn.MultiheadAttention(16, 4, batch_first=True)

    class TwoLayers(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = shared, shared

        def forward(self, x):
            x = x + self.first(x, x, x, need_weights=False)[0]
            return x + self.second(x, x, x, need_weights=False)[0]

    model = swap(TwoLayers().eval(), "quiet")
    assert isinstance(model.first, MultiheadAdapter) and model.first is model.second  # still one shared module
    assert sum(1 for m in model.modules() if isinstance(m, MultiheadAdapter)) == 1


def test_bad_strict_or_a_nan_option_is_refused_before_the_model_changes():
    model = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, batch_first=True), 1).eval()
    with pytest.raises(TypeError, match="swap strict must be true or false, got 'no'"):
        swap(model, "quiet", strict="no")
    with pytest.raises(ValueError, match="alpha must be a finite number"):
        swap(model, "clipped", alpha=float("nan"))
    assert isinstance(model.layers[0].self_attn, nn.MultiheadAttention)  # untouched
