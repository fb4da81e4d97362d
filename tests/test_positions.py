"""Rotary (RoPE) and ALiBi positions in the softmax family (issue 25 part 3), against float64 references.

The references here are written the slow, obvious way: RoPE as one 2x2 rotation matrix per
channel pair, ALiBi's slopes by the paper's own recipe, attention with loops over batch, head,
query and key. Decoding step by step must give the parallel forward's numbers; bad options are
refused with a message that names them.
"""

import math

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import zoo.attention as A
from tests.reference import multi_head_attention
from zoo.attention.positions import alibi_bias, alibi_slopes, rotate

POSITIONS = ["rope", "alibi"]
FAMILY = ["softmax", "quiet", "clipped", "gated"]


# ---- references ----------------------------------------------------------------------------------


def rope_reference(vector: torch.Tensor, position: int, base: float = 10000.0) -> torch.Tensor:
    """One vector (d,) rotated pair by pair: channels (f, f + d/2) by the matrix of angle position * theta_f."""
    d = vector.shape[-1]
    out = torch.empty(d, dtype=torch.float64)
    for f in range(d // 2):
        angle = position * base ** (-2 * f / d)
        rotation = torch.tensor([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]],
                                dtype=torch.float64)
        out[[f, f + d // 2]] = rotation @ vector[[f, f + d // 2]].double()
    return out


def paper_slopes(n: int) -> list[float]:
    """ALiBi's get_slopes, as Press et al. publish it (github.com/ofirpress/attention_with_linear_biases)."""
    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_slopes(2 * closest)[0::2][: n - closest]


def attention_reference(layer, x, mask=None):
    """The layer's output in float64, one (batch, head, query) at a time, with its positions and normalizer."""
    x = x.double()
    if mask is not None:
        x = x * mask[..., None]
    b, n, d = x.shape
    hd = layer.head_dim
    qkv = x @ layer.qkv.weight.double().T + layer.qkv.bias.double()
    q, k, v = qkv[..., :d], qkv[..., d: 2 * d], qkv[..., 2 * d:]
    slopes = [m ** (layer.alibi_bias_max / 8) for m in paper_slopes(layer.heads)]  # 2^(-8k/n) -> 2^(-bias_max k/n)
    out = torch.zeros(b, n, d, dtype=torch.float64)
    for bi in range(b):
        for h in range(layer.heads):
            sl = slice(h * hd, (h + 1) * hd)
            for i in range(n):
                if mask is not None and not mask[bi, i]:
                    continue  # padded queries: zero
                keys = [j for j in range(n) if (not layer.causal or j <= i) and (mask is None or mask[bi, j])]
                logits = []
                for j in keys:
                    qi, kj = q[bi, i, sl], k[bi, j, sl]
                    if layer.positions == "rope":
                        qi, kj = rope_reference(qi, i, layer.rope_base), rope_reference(kj, j, layer.rope_base)
                    logit = qi @ kj / math.sqrt(hd)
                    if layer.positions == "alibi":
                        logit = logit - slopes[h] * abs(i - j)
                    logits.append(logit)
                e = torch.exp(torch.stack(logits))
                weights = e / ((1 if layer.quiet else 0) + e.sum())  # quiet: the zero key's exp(0) = 1
                out[bi, i, sl] = sum(w * v[bi, j, sl] for w, j in zip(weights, keys, strict=True))
    out = out @ layer.proj.weight.double().T + layer.proj.bias.double()
    return out if mask is None else out * mask[..., None]


def make(name, positions, causal=True, dim=16, heads=2, **kw):
    return A.build(name, dim, heads=heads, causal=causal, positions=positions, **kw)


# ---- the functions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_rotate_is_a_rotation_matrix_per_channel_pair(base):
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    shared = torch.tensor([0, 1, 2, 37, 1000])
    batched = torch.tensor([[4, 5, 6, 7, 8], [0, 0, 3, 9, 123456]])
    for positions in (shared, batched):
        got = rotate(x, positions, base)
        for bi in range(2):
            for h in range(3):
                for t in range(5):
                    p = int(positions[t] if positions.dim() == 1 else positions[bi, t])
                    torch.testing.assert_close(got[bi, h, t], rope_reference(x[bi, h, t], p, base),
                                               atol=1e-9, rtol=1e-9)


def test_rotate_float32_and_bf16_keep_dtype_and_norm():
    x = torch.randn(1, 2, 6, 16)
    positions = torch.arange(6) * 1000
    for dtype in (torch.float32, torch.bfloat16):
        got = rotate(x.to(dtype), positions)
        assert got.dtype == dtype
        torch.testing.assert_close(got.double().norm(dim=-1), x.to(dtype).double().norm(dim=-1), atol=0.05, rtol=0.01)
    torch.testing.assert_close(rotate(x, positions).double(), rotate(x.double(), positions), atol=1e-5, rtol=1e-5)


def test_rotated_logits_depend_only_on_the_distance():
    q, k = torch.randn(1, 2, 9, 8, dtype=torch.float64), torch.randn(1, 2, 9, 8, dtype=torch.float64)
    positions = torch.arange(9)

    def logits(shift):
        return rotate(q, positions + shift) @ rotate(k, positions + shift).transpose(-1, -2)

    torch.testing.assert_close(logits(7), logits(0), atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(logits(100003), logits(0), atol=1e-8, rtol=1e-8)
    # and they do depend on it: rotating the queries alone changes them
    assert (rotate(q, positions + 7) @ rotate(k, positions).transpose(-1, -2) - logits(0)).abs().max() > 0.1


def test_rotate_gradients():
    x = torch.randn(1, 1, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: rotate(t, torch.tensor([0, 3, 11])), (x,))


def test_alibi_slopes_known_values_and_the_papers_rule():
    assert alibi_slopes(8).tolist() == [2.0**-i for i in range(1, 9)]
    assert alibi_slopes(6).tolist() == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    for heads in range(1, 33):
        torch.testing.assert_close(alibi_slopes(heads), torch.tensor(paper_slopes(heads), dtype=torch.float64),
                                   atol=0, rtol=1e-14)
    assert alibi_slopes(4, dtype=torch.float32).dtype == torch.float32
    # MPT's alibi_bias_max in place of the paper's 8: 2^(-12 (i + 1) / n)
    assert alibi_slopes(4, bias_max=12).tolist() == [2.0**-3, 2.0**-6, 2.0**-9, 2.0**-12]
    assert alibi_slopes(2, bias_max=16.0).tolist() == [2.0**-8, 2.0**-16]
    assert alibi_slopes(3, bias_max=12).tolist() == [2.0**-6, 2.0**-12, 2.0**-3]


def test_alibi_bias_values():
    slopes = torch.tensor([0.5, 0.25])
    causal = alibi_bias(slopes, torch.arange(2, 4), torch.arange(4))
    assert causal.shape == (2, 2, 4)
    assert causal[0].tolist() == [[-1.0, -0.5, 0.0, 0.5], [-1.5, -1.0, -0.5, 0.0]]
    both = alibi_bias(slopes, torch.arange(3), torch.arange(3), causal=False)
    assert both[1].tolist() == [[0.0, -0.25, -0.5], [-0.25, 0.0, -0.25], [-0.5, -0.25, 0.0]]
    batched = alibi_bias(slopes, torch.tensor([[0, 1], [5, 6]]), torch.tensor([[0, 1], [4, 5]]))
    assert batched.shape == (2, 2, 2, 2) and batched[1, 0, 0].tolist() == [-0.5, 0.0]


# ---- the layers -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["softmax", "quiet"])
@pytest.mark.parametrize("positions", POSITIONS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads", [1, 2, 4])
def test_layer_matches_float64_reference(name, positions, causal, heads):
    layer = make(name, positions, causal, dim=16, heads=heads).double()
    x = torch.randn(2, 9, 16)
    torch.testing.assert_close(layer(x.double()), attention_reference(layer, x), atol=1e-10, rtol=1e-10)
    if positions == "alibi":  # slower slopes (alibi_bias_max 12: the slowest 2^-12) change it as the reference says
        slower = make(name, positions, causal, dim=16, heads=heads, alibi_bias_max=12).double()
        slower.load_state_dict(layer.state_dict())
        torch.testing.assert_close(slower(x.double()), attention_reference(slower, x), atol=1e-10, rtol=1e-10)
        assert (slower(x.double()) - layer(x.double())).abs().max() > 1e-3
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[0, :3] = False  # left padding
    mask[1, 4] = mask[1, 7:] = False  # a hole and right padding
    torch.testing.assert_close(layer(x.double(), mask), attention_reference(layer, x, mask), atol=1e-10, rtol=1e-10)
    layer = layer.float()  # and in float32
    torch.testing.assert_close(layer(x, mask).double(), attention_reference(layer, x, mask), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", FAMILY)
@pytest.mark.parametrize("positions", POSITIONS)
def test_step_equals_the_parallel_forward(name, positions):
    layer = make(name, positions)
    x = torch.randn(2, 20, 16)
    full = layer(x)
    state, outs = None, []
    for t in range(20):
        y, state = layer.step(x[:, t: t + 1], state)
        outs.append(y)
    assert (torch.cat(outs, 1) - full).abs().max() < 1e-5
    head, state = layer.step(x[:, :7])  # a multi-token first step, then one token at a time
    outs = [head]
    for t in range(7, 20):
        y, state = layer.step(x[:, t: t + 1], state)
        outs.append(y)
    assert (torch.cat(outs, 1) - full).abs().max() < 1e-5
    middle, state = layer.step(x[:, :5])  # several tokens in a later step too
    tail, state = layer.step(x[:, 5:12], state)
    assert (torch.cat([middle, tail], 1) - full[:, :12]).abs().max() < 1e-5


@pytest.mark.parametrize("name", ["softmax", "quiet"])
@pytest.mark.parametrize("positions", POSITIONS)
def test_left_padded_decoding_equals_each_sequence_alone(name, positions):
    # relative positions: left padding shifts no distance between real tokens (the learned bias refuses this)
    layer = make(name, positions)
    prompts = [torch.randn(1, 5, 16), torch.randn(1, 8, 16)]
    batch = torch.zeros(2, 8, 16)
    batch[0, 3:], batch[1] = prompts[0][0], prompts[1][0]
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[0, :3] = False
    new = torch.randn(2, 4, 16)
    out, state = layer.step(batch, None, mask)
    outs = [out]
    for t in range(4):
        y, state = layer.step(new[:, t: t + 1], state)
        outs.append(y)
    together = torch.cat(outs, 1)
    for row, prompt in enumerate(prompts):
        alone = layer(torch.cat([prompt, new[row: row + 1]], 1))[0]
        torch.testing.assert_close(together[row, 8 - prompt.shape[1]:], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["softmax", "quiet"])
@pytest.mark.parametrize("positions", POSITIONS)
def test_runs_at_four_times_any_length_it_saw(name, positions):
    layer = make(name, positions, max_len=16).double()
    x = torch.randn(1, 64, 16, dtype=torch.float64)
    layer(x[:, :16])
    long = layer(x)
    torch.testing.assert_close(long, attention_reference(layer, x), atol=1e-10, rtol=1e-10)
    state = None
    for t in range(64):
        _, state = layer.step(x[:, t: t + 1], state)
    assert state.length == 64 + layer.quiet


def test_learned_bias_is_still_refused_beyond_max_len():
    layer = make("softmax", None, max_len=16, learned_bias=True)
    layer(torch.randn(1, 16, 16))
    with pytest.raises(ValueError, match="max_len=16"):
        layer(torch.randn(1, 64, 16))
    _, state = layer.step(torch.randn(1, 16, 16))
    with pytest.raises(ValueError, match="max_len=16"):
        layer.step(torch.randn(1, 1, 16), state)


def test_learned_bias_and_alibi_add_up():
    layer = make("softmax", "alibi", max_len=10, learned_bias=True).double()
    with torch.no_grad():
        layer.attn_bias.normal_()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    plain = make("softmax", None, max_len=10, learned_bias=True).double()
    plain.load_state_dict(layer.state_dict())  # positions add no parameter
    with torch.no_grad():
        plain.attn_bias += alibi_bias(torch.tensor(paper_slopes(2), dtype=torch.float64), torch.arange(10),
                                      torch.arange(10))
    torch.testing.assert_close(layer(x), plain(x), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("name", ["softmax", "quiet"])
@pytest.mark.parametrize("causal", [True, False])
def test_alibi_trains_on_the_flash_kernel(name, causal):
    """ALiBi's per-head bias (heads, L, L) must reach SDPA in a shape its CPU flash kernel takes: given 3-D, PyTorch
    falls back to the math kernel, which builds every batch x heads x L x L weight (a training step at 784 tokens
    1.95x gpt-tiny's there, against 1.27x on the flash kernel). With only the flash kernel allowed, SDPA refuses
    rather than falls back, so this fails on that path."""
    layer = make(name, "alibi", causal)
    x = torch.randn(2, 9, 16, requires_grad=True)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, :2] = False
    for padding in (None, mask):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = layer(x, padding)
            out.sum().backward()
        expected = attention_reference(layer, x.detach(), padding)
        torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-4)
        assert x.grad is not None and torch.isfinite(x.grad).all()


def test_a_learned_bias_at_inference_takes_the_flash_kernel():
    layer = make("softmax", None, max_len=9, learned_bias=True).eval()
    with torch.no_grad():
        layer.attn_bias.normal_()
    x = torch.randn(2, 9, 16)
    with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        got = layer(x)
    torch.testing.assert_close(got.double(), multi_head_attention(layer, x), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["softmax", "quiet"])
@pytest.mark.parametrize("positions", POSITIONS)
def test_bf16_runs_and_is_close(name, positions):
    layer = make(name, positions)
    x = torch.randn(2, 24, 16)
    expected = layer(x)
    half = layer.to(torch.bfloat16)
    got = half(x.bfloat16())
    assert got.dtype == torch.bfloat16 and torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), expected, atol=0.05, rtol=0.05)
    state, outs = None, []
    for t in range(24):
        y, state = half.step(x[:, t: t + 1].bfloat16(), state)
        outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 1).float(), got.float(), atol=0.05, rtol=0.05)


@pytest.mark.parametrize("positions", POSITIONS)
def test_captured_weights_carry_the_positions(positions):
    from zoo.viz.capture import _softmax

    layer = make("softmax", positions, causal=False).double()
    x = torch.randn(1, 7, 16, dtype=torch.float64)
    weights = _softmax(layer, x, None).weights  # (1, heads, 7, 7)
    v = (x @ layer.qkv.weight.double().T + layer.qkv.bias.double())[..., 32:]
    heads = (weights @ v.view(1, 7, 2, 8).transpose(1, 2)).transpose(1, 2).reshape(1, 7, 16)
    torch.testing.assert_close(layer.proj(heads), attention_reference(layer, x), atol=1e-10, rtol=1e-10)


# ---- bad input --------------------------------------------------------------------------------------


def test_bad_options_are_refused_with_a_message():
    with pytest.raises(ValueError, match="positions must be one of .*'rotary'"):
        make("softmax", "rotary")
    with pytest.raises(ValueError, match="rope_base must be a finite number in \\(1.0, inf\\]"):
        make("softmax", "rope", rope_base=0)
    with pytest.raises(TypeError, match="rope_base must be a number"):
        make("quiet", "rope", rope_base="10000")
    with pytest.raises(ValueError, match="even head width.*6 / 2 = 3"):
        make("gated", "rope", dim=6, heads=2)
    make("softmax", "alibi", dim=6, heads=2)  # ALiBi has no pairs: an odd head width is fine
    layer = make("softmax", "rope", causal=False)
    with pytest.raises(ValueError, match="without learned_bias and positions"):
        layer(torch.randn(1, 3, 16), context=torch.randn(1, 5, 16))


def test_bad_input_to_the_functions_is_refused():
    x = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="integer positions of shape \\(4,\\) or \\(1, 4\\)"):
        rotate(x, torch.arange(4.0))
    with pytest.raises(ValueError, match="integer positions"):
        rotate(x, torch.arange(5))
    with pytest.raises(ValueError, match="even head_dim"):
        rotate(torch.randn(1, 1, 4, 7), torch.arange(4))
    with pytest.raises(ValueError, match="base must be"):
        rotate(x, torch.arange(4), base=-1.0)
    with pytest.raises(ValueError, match="heads as an int >= 1, got 0"):
        alibi_slopes(0)
    with pytest.raises(ValueError, match=r"SoftmaxAttention alibi_bias_max sets ALiBi's slopes and needs "
                                         r"positions='alibi', got alibi_bias_max=12 with positions='rope'"):
        make("softmax", "rope", alibi_bias_max=12)
    for bad in (0, -8, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"alibi_slopes bias_max must be a finite number in \(0.0, inf\]"):
            alibi_slopes(4, bias_max=bad)
    with pytest.raises(TypeError, match="bias_max must be a number, got True"):
        alibi_slopes(4, bias_max=True)
    # 2^-126 is float32's smallest normal number; past it the slowest slope would round towards 0 (2^-150 is 0)
    assert alibi_slopes(2, bias_max=126, dtype=torch.float32).tolist() == [2.0**-63, 2.0**-126]
    for bad in (126.5, 150, 99999):
        with pytest.raises(ValueError, match=rf"alibi_slopes bias_max must be at most 126, got {bad:g}: the slowest "
                                             r"slope, 2\^-bias_max, would be below float32's smallest normal"):
            alibi_slopes(4, bias_max=bad)
        with pytest.raises(ValueError, match=rf"SoftmaxAttention alibi_bias_max must be at most 126, got {bad:g}"):
            make("softmax", "alibi", alibi_bias_max=bad)
    with pytest.raises(ValueError, match="slopes as a 1-D"):
        alibi_bias(torch.ones(2, 2), torch.arange(3), torch.arange(3))


def test_swap_keeps_rope_and_alibi_and_says_when_incontext_drops_them(caplog):
    import logging

    from zoo.attention import QuietAttention, SoftmaxAttention, swap

    torch.manual_seed(0)
    x = torch.randn(2, 9, 32)
    for positions, options in (("rope", {"rope_base": 500.0}), ("alibi", {"alibi_bias_max": 12})):
        model = nn.Sequential(SoftmaxAttention(32, heads=2, causal=True, positions=positions, **options))
        swap(model, "quiet")
        twin = QuietAttention(32, heads=2, causal=True, positions=positions, **options)  # by hand, the same weights
        twin.load_state_dict(model[0].state_dict())
        torch.testing.assert_close(model(x), twin(x))
        plain = QuietAttention(32, heads=2, causal=True)
        plain.load_state_dict(model[0].state_dict())
        assert not torch.allclose(model(x), plain(x))  # the positions matter here, so keeping them is seen
    model = nn.Sequential(SoftmaxAttention(32, heads=2, causal=True, positions="alibi"))
    with caplog.at_level(logging.INFO, logger="zoo.attention.swapping"):
        swap(model, "incontext")
    assert "its rope or alibi positions are dropped" in caplog.text


@pytest.mark.parametrize("positions", ["rope", "alibi"])
def test_text_models_take_rope_and_alibi_as_their_positions(positions, tmp_path):
    import zoo

    torch.manual_seed(0)
    model = zoo.create("gpt-tiny", pos_embed=positions, context_length=32, depth=2).eval()
    assert model.pos_embed is None and all(block.attn.positions == positions for block in model.blocks)
    hybrid = zoo.create("hybrid-micro-gpt-tiny", pos_embed=positions)
    assert [getattr(block.attn, "positions", None) for block in hybrid.blocks] == [None, None, None, positions]
    x = torch.randint(0, model.vocab_size, (2, 128))  # 4x the context: relative positions have no table to end
    with torch.no_grad():
        full = model(x)
        logits, state = model.forward_step(x[:, :100])
        steps = [logits]
        for i in range(100, 128):
            logits, state = model.forward_step(x[:, i:i + 1], state, i)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-4, rtol=1e-4)
    model.save_pretrained(tmp_path / "release")
    again = zoo.load(tmp_path / "release")
    torch.testing.assert_close(again(x), full)
    with pytest.raises(ValueError, match=f"pos_embed='{positions}' acts inside the softmax family's blocks"):
        zoo.create("micro-gpt-tiny", pos_embed=positions)


def test_a_text_model_with_alibi_takes_slower_slopes_and_keeps_them(tmp_path):
    import zoo

    torch.manual_seed(0)
    model = zoo.create("gpt-tiny", pos_embed="alibi", context_length=32, depth=2,
                       attention_options={"alibi_bias_max": 12}).eval()
    x = torch.randint(0, model.vocab_size, (2, 64))
    for block in model.blocks:  # each block's layer against the float64 reference with the slower slopes
        assert block.attn.alibi_bias_max == 12
        h = torch.randn(1, 9, block.attn.dim)
        torch.testing.assert_close(block.attn.double()(h.double()), attention_reference(block.attn, h),
                                   atol=1e-10, rtol=1e-10)
        block.attn.float()
    model.save_pretrained(tmp_path / "release")
    again = zoo.load(tmp_path / "release")
    assert all(block.attn.alibi_bias_max == 12 for block in again.blocks)
    torch.testing.assert_close(again(x), model(x))
    with pytest.raises(ValueError, match=r"block 0 \(softmax\): SoftmaxAttention alibi_bias_max sets ALiBi's "
                                         r"slopes and needs positions='alibi', got alibi_bias_max=12 with "
                                         r"positions=None"):
        zoo.create("gpt-tiny", attention_options={"alibi_bias_max": 12})


@pytest.mark.slow  # about 20 s each: three graphs exported and checked in ONNX Runtime
@pytest.mark.parametrize("positions", ["rope", "alibi"])
def test_onnx_logits_and_decoding_with_rope_and_alibi(positions, tmp_path):
    """The ONNX folder of a rope or alibi model: its logits at a length the export never traced (beyond the
    context: relative positions have no table to end), and greedy decoding through the exported prefill and
    step programs equal to the slow reference, one full forward pass per new token."""
    pytest.importorskip("onnxruntime")
    import zoo
    from zoo.models import decoding
    from zoo.release.onnx import export_onnx

    from .conftest import onnx_decoding, onnx_program

    torch.manual_seed(0)
    model = zoo.create("gpt-tiny", pos_embed=positions, vocab_size=40, context_length=32, embed_dim=32, depth=2,
                       num_heads=2).eval()
    with torch.no_grad():
        model.tok_embed.weight.mul_(20)  # logits far apart: greedy choices not decided by rounding
    folder, diffs = export_onnx(model, tmp_path / "out")
    assert all(d <= 1e-4 for d in diffs.values())
    x = torch.randint(0, 40, (3, 77))
    with torch.no_grad():
        torch.testing.assert_close(onnx_program(folder, "model")(x)[0], model(x), atol=1e-4, rtol=0)
    prompt = torch.tensor([[5, 17, 3, 9], [7, 1, 2, 30]])
    got = decoding.greedy(*onnx_decoding(folder), prompt, 40)  # past the context of 32
    with torch.no_grad():
        for row, ids in zip(got.tolist(), prompt.tolist()):
            for _ in range(40):
                ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
            assert row == ids
