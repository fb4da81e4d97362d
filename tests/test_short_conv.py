"""The short causal convolution of a block (TextTransformer's short_conv, Based's local mixing; issue 25):
the sum written out by hand in float64, causality and padding, decoding with its tail of w - 1 inputs (token
by token, generate, left-padded prompts, the exported and ONNX programs), the release folder, and refusals.
References are independent of the code under test: a loop over the taps, a full forward pass recomputed for
every new token, and each prompt decoded alone."""

import json

import pytest
import torch

import zoo
from zoo.models import TextTransformer, decoding
from zoo.models.layers import Block
from zoo.models.pretrained import save_pretrained
from zoo.models.short_conv import ConvState, ShortConv

from .conftest import onnx_decoding
from .reference import greedy_by_recompute

HYBRID = ["micro", "softmax", "elita", "incontext"]
WIDTHS = [3, 0, 2, 4]  # one block without: its state stays the attention's own
SMALL = dict(vocab_size=50, context_length=64, embed_dim=32, depth=4, num_heads=2, pos_embed="none")


def sharp(**kwargs) -> TextTransformer:
    """A small hybrid with convolutions whose logits are far apart (greedy choices not decided by rounding)."""
    torch.manual_seed(0)
    model = TextTransformer(**{**SMALL, "attention": HYBRID, "short_conv": WIDTHS, **kwargs}).eval()
    with torch.no_grad():
        model.tok_embed.weight.mul_(50)
        for block in model.blocks:
            if block.short_conv is not None:
                block.short_conv.conv.weight.mul_(5)
    return model


def test_the_convolution_is_the_sum_over_the_last_w_tokens_written_out():
    torch.manual_seed(0)
    layer = ShortConv(5, 3).double()
    with torch.no_grad():
        layer.norm.weight.normal_()
        layer.norm.bias.normal_()
    x = torch.randn(2, 7, 5, dtype=torch.float64)
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    h = (x - mean) / torch.sqrt(var + 1e-5) * layer.norm.weight + layer.norm.bias
    c, b = layer.conv.weight[:, 0], layer.conv.bias  # c (dim, w): tap w - 1 is the token itself
    want = x.clone()
    for t in range(7):
        want[:, t] += b
        for k in range(3):  # the token k before t
            if t - k >= 0:
                want[:, t] += c[:, 2 - k] * h[:, t - k]
    out, tail = layer(x)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tail, h[:, -2:], rtol=1e-12, atol=1e-12)
    tail, steps = None, []
    for t in range(7):  # one token at a time, as decoding runs it (its own route: the window times the taps)
        out, tail = layer(x[:, t:t + 1], tail=tail)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 1), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tail, h[:, -2:], rtol=1e-12, atol=1e-12)


def test_a_decoding_step_takes_the_dtypes_the_parallel_forward_takes():
    # bfloat16 tokens into a float32 layer: the parallel route promotes; the one-token route must too, not crash
    torch.manual_seed(0)
    layer = ShortConv(8, 4)
    x = torch.randn(2, 5, 8).bfloat16()
    want, _ = layer(x)
    tail, steps = None, []
    for t in range(5):
        out, tail = layer(x[:, t:t + 1], tail=tail)
        steps.append(out)
    assert want.dtype == torch.float32
    torch.testing.assert_close(torch.cat(steps, 1), want)


def test_no_output_depends_on_a_later_token_and_padding_is_neither_read_nor_written():
    torch.manual_seed(0)
    layer = ShortConv(8, 4)
    x = torch.randn(1, 10, 8)
    changed = x.clone()
    changed[:, 6] += torch.randn(8)  # (a constant would vanish in the norm)
    diff = (layer(changed)[0] - layer(x)[0]).abs().amax(-1)[0]
    assert diff[:6].max() == 0 and diff[6:].min() > 0  # tokens 6..9 see token 6 (width 4), none before it
    # left padding with NaN: the real tokens get what they get alone; the padded ones get nothing added
    padded = torch.cat([torch.full((1, 3, 8), float("nan")), x], 1)
    mask = torch.arange(13)[None] >= 3
    out, _ = layer(padded, mask)
    torch.testing.assert_close(out[:, 3:], layer(x)[0])
    assert out[:, :3].isnan().all()  # x + 0 at a padded token: what it held


def test_token_by_token_decoding_keeps_the_last_inputs_and_equals_the_parallel_forward():
    model = sharp()
    ids = torch.randint(0, 50, (2, 24))
    with torch.no_grad():
        full = model(ids)
        states, steps = None, []
        for t in range(0, 24, 5):  # chunks of 5, then 4: a tail longer than a chunk and shorter
            logits, states = model.forward_step(ids[:, t:t + 5], states, t)
            steps.append(logits)
    assert (torch.cat(steps, 1) - full).abs().max() < 1e-4
    assert [type(s).__name__ for s in states] == ["ConvState", "KVCache", "ConvState", "ConvState"]
    assert [tuple(states[i].tail.shape) for i in (0, 2, 3)] == [(2, 2, 32), (2, 1, 32), (2, 3, 32)]
    assert type(states[0].attention).__name__ == "MicroState"


def test_generate_and_left_padded_prompts_give_the_tokens_of_recomputing_each_prompt_alone():
    model = sharp()
    prompt = [5, 17, 3, 9]
    assert model.generate(torch.tensor([prompt]), 12, temperature=0)[0].tolist() == \
        greedy_by_recompute(model, prompt, 12)
    prompts = [[5, 17, 3, 9, 22, 40, 1], [7], [11, 12, 13]]
    assert model.generate(prompts, 8, temperature=0) == [greedy_by_recompute(model, p, 8) for p in prompts]


def test_a_state_without_the_convolutions_tail_is_refused_naming_what_it_expects():
    model = sharp()
    _, states = model.forward_step(torch.randint(0, 50, (1, 3)))
    with pytest.raises(ValueError, match=r"ConvState it returned \(a tail of shape \(1, 2, 32\)\), got MicroState"):
        model.forward_step(torch.randint(0, 50, (1, 1)), [states[0].attention, *states[1:]], 3)
    with pytest.raises(ValueError, match=r"got a tail of shape \(2, 2, 32\)"):
        model.forward_step(torch.randint(0, 50, (1, 1)),
                           [ConvState(torch.zeros(2, 2, 32), states[0].attention), *states[1:]], 3)


def test_decoding_programs_carry_the_tail_first_in_each_blocks_state():
    model = sharp()
    assert decoding.state_names(model) == [
        "block0.conv", "block0.weighted_sum", "block0.score_sum", "block1.keys", "block1.values",
        "block2.conv", "block2.log_norm", "block2.mean",
        "block3.conv", "block3.keys", "block3.values", "block3.starts", "block3.total"]
    prompt = torch.tensor([[5, 17, 3, 9], [7, 1, 2, 30]])
    with torch.no_grad():  # the programs' modules, eager: states flattened to tensors and back every step
        got = decoding.greedy(decoding.Prefill(model), decoding.Step(model), prompt, 10)
    assert got.tolist() == [greedy_by_recompute(model, p, 10) for p in prompt.tolist()]


@pytest.mark.slow  # about 40 s: two programs traced, three exported to ONNX and checked
def test_exported_and_onnx_decoding_with_convolutions_decode_greedily(tmp_path):
    model = sharp()
    prompt = torch.tensor([[5, 17, 3, 9], [7, 1, 2, 30]])
    want = [greedy_by_recompute(model, p, 10) for p in prompt.tolist()]
    prefill, step = decoding.export(model)
    assert decoding.greedy(prefill.module(), step.module(), prompt, 10).tolist() == want
    pytest.importorskip("onnxruntime")
    from zoo.release.onnx import export_onnx

    folder, diffs = export_onnx(model, tmp_path / "out")
    assert all(d <= 1e-4 for d in diffs.values())
    assert decoding.greedy(*onnx_decoding(folder), prompt, 10).tolist() == want


def test_the_release_folder_keeps_the_widths_and_loads_the_same_model(tmp_path):
    model = sharp()
    save_pretrained(model, tmp_path / "m")
    assert json.loads((tmp_path / "m" / "config.json").read_text())["args"]["short_conv"] == WIDTHS
    loaded = zoo.load(tmp_path / "m").eval()
    ids = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)
    assert "short_conv" not in TextTransformer(**SMALL).config  # a model without keeps the config it had
    one = TextTransformer(**{**SMALL, "attention": "micro"}, short_conv=4)
    assert one.config["short_conv"] == 4 and all(b.short_conv.width == 4 for b in one.blocks)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"short_conv": 1}, ValueError, r"short_conv must be 0 \(none\) or a width between 2 and 64, got 1"),
    ({"short_conv": 65}, ValueError, r"short_conv must be between 0 and 64, got 65"),
    ({"short_conv": [4, 4]}, ValueError, r"short_conv lists 2 widths, but depth=4"),
    ({"short_conv": [4, 0, 2.5, 4]}, TypeError, r"short_conv\[2\] \(block 2\) must be an integer, got 2.5"),
    ({"short_conv": True}, TypeError, r"short_conv must be an integer, got True"),
])
def test_bad_widths_are_refused_naming_the_argument_and_the_range(kwargs, error, message):
    with pytest.raises(error, match=message):
        TextTransformer(**{**SMALL, "attention": "micro", **kwargs})


def test_a_bidirectional_block_refuses_a_causal_convolution():
    with pytest.raises(ValueError, match=r"short_conv=4 is a causal convolution; it needs causal=True"):
        Block(16, 2, "micro", causal=False, short_conv=4)


@pytest.mark.slow  # a cold inductor compile: 20 s and more
def test_compile_fullgraph_with_convolutions_equals_eager():
    torch._dynamo.reset()
    model = sharp()
    ids = torch.randint(0, 50, (3, 16))
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), model(ids), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name, blocks", [("hybrid-micro-conv-gpt-tiny", range(4)),
                                         ("hybrid-elita-conv-gpt-tiny", range(4)),
                                         ("hybrid-elita-conv1-gpt-tiny", [0])])
def test_the_registered_conv_hybrids_are_the_hybrids_with_a_convolution_in_the_blocks_they_name(name, blocks):
    plain, conv = zoo.create(name.replace("-conv1", "").replace("-conv", "")), zoo.create(name)
    assert [type(b.attn) for b in conv.blocks] == [type(b.attn) for b in plain.blocks]
    assert conv.short_convs == [4 if i in blocks else 0 for i in range(4)] and plain.short_convs == [0] * 4
    extra = {k for k in conv.state_dict()} - {k for k in plain.state_dict()}
    assert extra == {f"blocks.{i}.short_conv.{p}" for i in blocks
                     for p in ("norm.weight", "norm.bias", "conv.weight", "conv.bias")}


def test_a_folder_zoo_did_not_write_is_refused_naming_its_file(tmp_path):
    model = TextTransformer(**{**SMALL, "attention": "micro", "depth": 2})
    save_pretrained(model, tmp_path / "m")
    config_file = tmp_path / "m" / "config.json"
    config = json.loads(config_file.read_text())
    config["args"]["short_conv"] = 1  # an edited config: refused by the argument's own check, naming the file
    config_file.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config.json: TextTransformer short_conv must be 0 \(none\)"):
        zoo.load(tmp_path / "m")
    config["args"]["short_conv"] = 4  # weights without the convolutions: every missing tensor is named
    config_file.write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"missing \(8\): blocks.0.short_conv.norm.weight"):
        zoo.load(tmp_path / "m")


@pytest.mark.parametrize("build, call, error, message", [
    ((8, 1), None, ValueError, r"ShortConv width must be between 2 and 64, got 1"),
    ((0, 4), None, ValueError, r"ShortConv dim must be between 1"),
    ((8, 4), lambda c: c(torch.randn(2, 8)), ValueError, r"ShortConv expects input of shape \(batch, length, 8\)"),
    ((8, 4), lambda c: c(torch.randint(0, 3, (2, 5, 8))), ValueError, r"floating-point input"),
    ((8, 4), lambda c: c(torch.randn(2, 5, 8), torch.ones(2, 4, dtype=torch.bool)), ValueError, r"ShortConv"),
    ((8, 4), lambda c: c(torch.randn(2, 5, 8), None, torch.zeros(2, 2, 8)), ValueError,
     r"tail of shape \(2, 3, 8\) it returned for these tokens, got a tail of shape \(2, 2, 8\)"),
])
def test_the_layer_alone_refuses_what_it_cannot_compute(build, call, error, message):
    with pytest.raises(error, match=message):
        layer = ShortConv(*build)
        call(layer)
