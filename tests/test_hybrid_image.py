"""ImageTransformer with one attention per block, attention_options, and the in-context attention (issue 25).

A hybrid's blocks are checked by type against names written here, and its forward against one composed
in this file (patch embedding, positions, each block applied by hand with the softmax block's attention
written from its formula, the final norm and the head). Options are checked where they land (a
parameter's shape, a stored attribute), the JSON config by a save/load round trip, bad input by the
messages that name the block, and the registered models by timm's factory, a compiled forward and a
short training run.
"""

import json
import math

import pytest
import timm
import torch

import zoo
from zoo.attention import (
    ClippedSoftmaxAttention,
    FeedForward2,
    GatedAttention,
    InContextAttention,
    MicroAttention,
    QuietAttention,
    SoftmaxAttention,
)
from zoo.models.image_transformer import HYBRID_SOFTMAX_BLOCK, ImageTransformer
from zoo.models.layers import Mlp

CLASSES = {"softmax": SoftmaxAttention, "quiet": QuietAttention, "clipped": ClippedSoftmaxAttention,
           "gated": GatedAttention, "micro": MicroAttention, "incontext": InContextAttention}
SMALL = dict(img_size=8, patch_size=4, embed_dim=16, num_heads=2, mlp_ratio=2.0)


def images(batch=3, size=8, seed=0):
    return torch.randn(batch, 1, size, size, generator=torch.Generator().manual_seed(seed))


def softmax_attention(layer, x):
    """Bidirectional multi-head softmax attention from its formula: softmax(q k^T / sqrt(d)) v, then W_o."""
    b, n, dim = x.shape
    h, d = layer.heads, dim // layer.heads
    q, k, v = (x @ layer.qkv.weight.T + layer.qkv.bias).split(dim, dim=-1)
    q, k, v = (t.view(b, n, h, d).transpose(1, 2) for t in (q, k, v))
    weights = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
    out = (weights @ v).transpose(1, 2).reshape(b, n, dim)
    return out @ layer.proj.weight.T + layer.proj.bias


def composed_forward(model, x):
    """The model's forward written out: patches, class token, positions, the blocks one by one, norm, head."""
    tokens = model.patch_embed(x).flatten(2).transpose(1, 2)
    tokens = torch.cat([model.cls_token.expand(len(x), -1, -1), tokens], dim=1) + model.pos_embed
    for block in model.blocks:
        normed = block.norm1(tokens)
        mixed = softmax_attention(block.attn, normed) if type(block.attn) is SoftmaxAttention else block.attn(normed)
        tokens = tokens + mixed
        tokens = tokens + block.mlp(block.norm2(tokens))
    return model.head(model.norm(tokens)[:, 0])


@pytest.mark.parametrize("names", [
    ["micro", "micro", "softmax", "micro"],
    ["incontext", "clipped", "gated", "quiet"],
    ["softmax", "micro", "incontext", "softmax"],
])
def test_each_block_is_its_named_mechanism(names):
    mlps = ["ffn2", "mlp", "mlp", "ffn2"]
    model = ImageTransformer(depth=4, attention=names, mlp=mlps, **SMALL)
    assert [type(block.attn) for block in model.blocks] == [CLASSES[name] for name in names]
    assert [type(block.mlp) for block in model.blocks] == [FeedForward2 if m == "ffn2" else Mlp for m in mlps]
    assert model.config["attention"] == names and model.config["mlp"] == mlps


def test_registered_hybrid_and_incontext_models():
    hybrid = zoo.create("hybrid-micro-vit-tiny")
    kinds = [type(block.attn) for block in hybrid.blocks]
    assert len(kinds) == 4 and kinds.count(SoftmaxAttention) == 1 and kinds.count(MicroAttention) == 3
    assert kinds[HYBRID_SOFTMAX_BLOCK] is SoftmaxAttention
    assert (hybrid.embed_dim, hybrid.config["num_heads"]) == (128, 4)  # TINY's dims
    assert all(type(block.attn) is InContextAttention for block in zoo.create("incontext-vit-tiny").blocks)
    assert zoo.models.registry.pretrained_tags("hybrid-micro-vit-tiny") == ["mnist"]  # the leaderboard's seed 0
    assert zoo.models.registry.entry("incontext-vit-tiny").default_tag is None


def test_hybrid_forward_equals_the_blocks_composed_by_hand():
    torch.manual_seed(0)
    model = ImageTransformer(depth=4, attention=["micro", "micro", "softmax", "micro"], **SMALL).eval()
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(model(x), composed_forward(model, x), rtol=1e-5, atol=1e-5)
        # and the blocks really differ: the same weights with every block softmax give another answer
        every_softmax = ImageTransformer(depth=4, attention="softmax", **SMALL).eval()
        assert not torch.allclose(every_softmax(x), model(x))


def test_options_reach_each_blocks_mechanism():
    model = ImageTransformer(depth=4, attention=["micro", "micro", "softmax", "incontext"], **SMALL,
                             attention_options=[{"num_queries": 2}, None, {"dropout": 0.25}, {"num_positions": 5}])
    heads, dim = SMALL["num_heads"], SMALL["embed_dim"]
    assert model.blocks[0].attn.queries.shape == (heads * 2, dim)
    assert model.blocks[1].attn.queries.shape == (heads * 4, dim)  # MicroAttention's default num_queries
    assert model.blocks[2].attn.dropout == 0.25
    assert model.blocks[3].attn.table.out_features == heads * 5
    clipped = ImageTransformer(depth=2, attention="clipped", attention_options={"alpha": 2.5, "dropout": 0.1}, **SMALL)
    assert [(b.attn.alpha, b.attn.dropout) for b in clipped.blocks] == [(2.5, 0.1), (2.5, 0.1)]
    # through zoo.create and timm's factory alike
    assert zoo.create("micro-vit-tiny", attention_options={"num_queries": 8}).blocks[3].attn.queries.shape == (32, 128)
    timm_model = timm.create_model("micro_vit_tiny", attention_options={"num_queries": 8}, num_classes=3)
    assert timm_model.blocks[0].attn.queries.shape == (32, 128)
    assert timm_model(torch.randn(1, 1, 28, 28)).shape == (1, 3)


def test_hybrid_save_and_load_round_trip(tmp_path):
    torch.manual_seed(0)
    names, options = ["micro", "softmax", "incontext", "micro"], [{"num_queries": 3}, None, {"num_positions": 7}, {}]
    model = ImageTransformer(depth=4, attention=names, mlp=["mlp", "ffn2", "mlp", "mlp"], attention_options=options,
                             **SMALL).eval()
    with torch.no_grad():  # W_b starts at zero: give the in-context bias something to carry
        model.blocks[2].attn.table.weight.normal_()
    model.save_pretrained(tmp_path / "hybrid")
    args = json.loads((tmp_path / "hybrid" / "config.json").read_text())["args"]
    assert args["attention"] == names and args["attention_options"] == options  # JSON lists, as given
    loaded = zoo.load(tmp_path / "hybrid")
    assert loaded.config == model.config
    assert [type(b.attn) for b in loaded.blocks] == [CLASSES[n] for n in names]
    x = images()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    # a single-name model's config.json gains no key: older zoo versions load what this one saves
    zoo.create("vit-tiny").save_pretrained(tmp_path / "single")
    assert "attention_options" not in json.loads((tmp_path / "single" / "config.json").read_text())["args"]


def test_registered_hybrid_round_trips_with_its_name(tmp_path):
    model = zoo.create("hybrid-micro-vit-tiny").eval()
    model.save_pretrained(tmp_path / "h")
    loaded = zoo.load(tmp_path / "h")
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    assert loaded.model_name == "hybrid-micro-vit-tiny"


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(attention=["micro", "softmax", "micro"]), ValueError,
     r"ImageTransformer attention lists 3 names, but depth=4"),
    (dict(attention=["micro", "micro", "sofmax", "micro"]), ValueError,
     r"attention\[2\] \(block 2\) must be one of .*got 'sofmax' \(closest: softmax"),
    (dict(attention=["micro", "elita", "micro", "micro"]), ValueError, r"attention\[1\] \(block 1\) must be one of"),
    (dict(attention="sofmax"), ValueError, r"ImageTransformer attention must be one of .*got 'sofmax'"),
    (dict(mlp=["mlp", "ffn3", "mlp", "mlp"]), ValueError, r"mlp\[1\] \(block 1\) must be one of \['mlp', 'ffn2'\]"),
    (dict(attention=["micro", "micro", "softmax", "micro"], attention_options=[None, None, {"num_queries": 8}, None]),
     ValueError, r"block 2: attention_options 'num_queries' is not an option of the softmax attention; it takes"),
    (dict(attention="micro", attention_options={"alpha": 1.0}), ValueError,
     r"block 0: attention_options 'alpha' is not an option of the micro attention; it takes num_queries"),
    (dict(attention_options={"dim": 8}), ValueError, r"'dim' is not an option"),  # the block sets it
    (dict(attention_options=[{}, {}]), ValueError, r"attention_options must be a dict, or a list of 4 dicts"),
    (dict(attention_options=[{}, {}, 5, {}]), TypeError, r"attention_options\[2\] \(block 2\) must be a dict"),
    (dict(attention=["micro", "micro", "micro", "micro"], attention_options=[{}, {}, {}, {"num_queries": 0}]),
     ValueError, r"ImageTransformer block 3 \(micro attention\): MicroAttention num_queries must be"),
    (dict(attention=["softmax", "micro", "softmax", "softmax"], learned_bias=True), ValueError,
     r"learned_bias needs one of .* in every block; block 1 has attention 'micro'"),
    (dict(attention="micro", attention_options={"num_queries": torch.int64}), TypeError,
     r"attention_options must hold JSON values"),
])
def test_bad_per_block_input_is_refused_naming_the_block(kwargs, error, message):
    with pytest.raises(error, match=message):
        ImageTransformer(depth=4, **{**SMALL, **kwargs})


def test_timm_creates_the_hybrid_and_incontext_models():
    hybrid = timm.create_model("hybrid_micro_vit_tiny", num_classes=5, in_chans=3)
    assert type(hybrid.blocks[HYBRID_SOFTMAX_BLOCK].attn) is SoftmaxAttention
    assert hybrid(torch.randn(2, 3, 28, 28)).shape == (2, 5)
    incontext = timm.create_model("incontext_vit_tiny", features_only=True, out_indices=(1, 3))
    assert [f.shape for f in incontext(torch.randn(1, 1, 28, 28))] == [(1, 128, 7, 7)] * 2
    for name in ("hybrid_micro_vit_tiny", "incontext_vit_tiny"):  # neither block kind is tied to one image size
        assert timm.create_model(name, dynamic_img_size=True)(torch.randn(1, 1, 32, 24)).shape == (1, 10)


@pytest.mark.slow
def test_compiled_hybrid_equals_eager():
    torch.manual_seed(0)
    model = zoo.create("hybrid-micro-vit-tiny").eval()
    x = torch.randn(4, 1, 28, 28)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


def test_incontext_vit_trains():
    """16 fixed images with random labels: 30 Adam steps memorize them, and the in-context bias, zero at the
    start, is learnt. At 12 x 12 pixels (9 patches) to keep it quick; the blocks are the registered ones."""
    torch.manual_seed(0)
    model = zoo.create("incontext-vit-tiny", img_size=12).train()
    x, y = torch.randn(16, 1, 12, 12), torch.randint(0, 10, (16,))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0], losses
    assert all(block.attn.table.weight.abs().max() > 0 for block in model.blocks)
