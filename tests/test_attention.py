"""Every mechanism against its float64 reference, plus the properties the contract promises."""

import os
import shutil
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import zoo.attention as A

from . import reference as ref

CAUSAL = ["softmax", "quiet", "micro", "elita"]
TOKEN_MIXERS = ["softmax", "quiet", "micro", "elita"]


def make(name, dim=16, heads=2, causal=True, **kw):
    layer = A.build(name, dim, heads=heads, causal=causal, **kw)
    if name == "elita":
        with torch.no_grad():  # reach beyond the tiny init so the test sees real mixing
            layer.keys.mul_(20)
            layer.pos_weight.mul_(10)
    return layer


def reference(name, layer, x, mask=None):
    if name in ("softmax", "quiet"):
        return ref.multi_head_attention(layer, x, mask, quiet=name == "quiet")
    if name == "micro":
        return ref.micro_attention(layer, x, mask)
    return ref.elita_attention(layer, x)


shapes = st.tuples(st.integers(1, 2), st.integers(1, 12), st.sampled_from([1, 2, 4]))


# ---- agreement with the formulas -------------------------------------------------------


# elita is causal only (a bidirectional one is refused), and fused pools, so it is never causal
MIXER_DIRECTIONS = [(name, causal) for name in TOKEN_MIXERS for causal in (True, False)
                    if not (name == "elita" and not causal)]


@pytest.mark.parametrize("name, causal", MIXER_DIRECTIONS)
@given(shape=shapes)
def test_matches_float64_reference(name, causal, shape):
    b, n, heads = shape
    layer = make(name, dim=8, heads=heads, causal=causal)
    x = torch.randn(b, n, 8)
    torch.testing.assert_close(layer(x).double(), reference(name, layer, x), atol=2e-5, rtol=1e-4)


def test_learned_bias_matches_reference():
    layer = make("softmax", dim=8, heads=2, causal=True, max_len=10, learned_bias=True)
    with torch.no_grad():
        layer.attn_bias.normal_()
    x = torch.randn(2, 7, 8)
    torch.testing.assert_close(layer(x).double(), ref.multi_head_attention(layer, x), atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="max_len=10"):
        layer(torch.randn(1, 11, 8))


@given(shape=shapes)
def test_feed_forward2_matches_reference(shape):
    b, n, _ = shape
    layer = A.FeedForward2(8, rank=3)
    x = torch.randn(b, n, 8)
    torch.testing.assert_close(layer(x).double(), ref.feed_forward2(layer, x), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("norm", ["softmax", "softmax_one"])
@pytest.mark.parametrize("fuse", ["mean", "max"])
@given(shape=shapes)
def test_fused_matches_reference(norm, fuse, shape):
    b, n, heads = shape
    layer = A.FusedAttention(8, heads=heads, norm=norm, fuse=fuse)
    x = torch.randn(b, n, 8)
    want, want_alpha = ref.fused_attention(layer, x, norm=norm, fuse=fuse)
    got, alpha = layer(x, return_alpha=True)
    torch.testing.assert_close(got.double(), want, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(alpha.double(), want_alpha, atol=2e-6, rtol=1e-4)
    # the O(L)-memory path (no alpha) gives the same pooled vector
    torch.testing.assert_close(layer(x).double(), want, atol=2e-5, rtol=1e-4)


def test_fused_mean_alpha_sums_to_one_and_learned_fuse_runs():
    layer = A.FusedAttention(8, heads=2, fuse="learned")
    x = torch.randn(3, 9, 8)
    y, alpha = layer(x, return_alpha=True)
    torch.testing.assert_close(alpha.sum(-1), torch.ones(3, 2))
    torch.testing.assert_close(layer(x), y, atol=1e-5, rtol=1e-5)


def test_fused_custom_norm_and_fuse():
    def sharp(scores, dim):
        return torch.softmax(2 * scores, dim)

    def first_query(weights, query_weights):
        return weights[..., 0, :]

    layer = A.FusedAttention(8, heads=1, norm=sharp, fuse=first_query)
    x = torch.randn(2, 5, 8)
    q, k = layer.f_q(x), layer.f_k(x)
    want_alpha = torch.softmax(2 * (q[:, :1] @ k.transpose(1, 2)) / 8**0.5, -1)[:, 0]
    y, alpha = layer(x, return_alpha=True)
    torch.testing.assert_close(alpha[:, 0], want_alpha)
    torch.testing.assert_close(y, torch.einsum("bl,bld->bd", want_alpha, layer.f_v(x)))


# ---- softmax_one ----------------------------------------------------------------------


@pytest.fixture(params=["kernel", "eager"])
def route(request, monkeypatch):
    """Run a test through the compiled CPU kernel, then through the eager PyTorch route."""
    from zoo.attention import native

    if request.param == "eager":
        monkeypatch.setattr(native, "load", lambda: None)
    elif native.load() is None:
        # A machine with a compiler must build the kernel; only one without may skip.
        assert shutil.which(os.environ.get("CXX", "c++")) is None, "a C++ compiler is here, yet the kernel failed"
        pytest.skip("no C++ compiler: only the eager routes run here")
    return request.param


def test_softmax_one_known_values(route):
    # the seed's max-subtracted version returns 1/3 each here
    got = A.softmax_one(torch.tensor([10.0, 10.0]))
    e = torch.exp(torch.tensor(10.0, dtype=torch.float64))
    torch.testing.assert_close(got.double(), torch.stack([e, e]) / (1 + 2 * e))
    torch.testing.assert_close(A.softmax_one(torch.tensor([0.0])), torch.tensor([0.5]))
    torch.testing.assert_close(A.softmax_one(torch.tensor([1e4, 1e4])), torch.tensor([0.5, 0.5]))
    assert A.softmax_one(torch.full((5,), -1e4)).abs().max() == 0  # quiet: attends to nothing
    torch.testing.assert_close(A.softmax_one(torch.tensor([-1e4, 1e4])), torch.tensor([0.0, 1.0]))
    masked = A.softmax_one(torch.tensor([float("-inf"), 0.0, 0.0]))
    torch.testing.assert_close(masked, torch.tensor([0.0, 1 / 3, 1 / 3]))
    # a fully masked row attends to nothing: zeros, not NaN
    torch.testing.assert_close(A.softmax_one(torch.full((2, 20), float("-inf"))), torch.zeros(2, 20))
    assert A.softmax_one(torch.tensor([0.0, float("nan")])).isnan().all()


@given(
    rows=st.integers(1, 5),
    cols=st.integers(1, 40),
    scale=st.sampled_from([0.1, 1.0, 10.0, 30.0]),
    dim=st.sampled_from([0, 1, -1]),
)
def test_softmax_one_matches_formula(rows, cols, scale, dim):
    x = torch.randn(rows, cols) * scale
    torch.testing.assert_close(A.softmax_one(x, dim).double(), ref.softmax_one(x, dim), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("shape, dim", [((3, 1000), -1), ((2, 3, 1037), 2), ((517, 3), 0), ((4, 33, 5), 1)])
@pytest.mark.parametrize("scale", [1.0, 30.0, 1e4])
def test_softmax_one_routes_match_formula(route, shape, dim, scale):
    # long rows with ragged vector tails, other dims, and logits far past exp's range
    x = torch.randn(shape) * scale
    torch.testing.assert_close(A.softmax_one(x, dim).double(), ref.softmax_one(x, dim), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_softmax_one_half_precision(route, dtype):
    y = torch.randn(64, 301) * 5
    got = A.softmax_one(y.to(dtype))
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), ref.softmax_one(y.to(dtype)), atol=1e-2, rtol=2e-2)


def test_softmax_one_gradcheck():
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)  # float64 always takes the eager route
    assert torch.autograd.gradcheck(lambda t: A.softmax_one(t, -1), (x,))
    assert torch.autograd.gradcheck(lambda t: A.softmax_one(t, 0), (x,))


def test_softmax_one_gradients(route):
    # float32 through the route under test, against the float64 gradient of the formula
    for dim in (-1, 0):
        x32 = (torch.randn(40, 50) * 3).requires_grad_()
        g = torch.randn(40, 50)
        (A.softmax_one(x32, dim) * g).sum().backward()
        x64 = x32.detach().double().requires_grad_()
        (ref.softmax_one(x64, dim) * g.double()).sum().backward()
        torch.testing.assert_close(x32.grad.double(), x64.grad, atol=1e-6, rtol=1e-5)


def test_kernel_build_failure_warns_and_stays_eager(monkeypatch):
    from torch.utils import cpp_extension

    from zoo.attention import native

    def no_compiler(**kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(cpp_extension, "load", no_compiler)
    with pytest.warns(RuntimeWarning, match="could not build.*Ninja is required"):
        assert native.load.__wrapped__() is None
    monkeypatch.setenv("ZOO_NATIVE", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # asked for: no warning
        assert native.load.__wrapped__() is None


def test_softmax_one_bad_input():
    with pytest.raises(ValueError, match="floating-point.*int64"):
        A.softmax_one(torch.arange(3))
    with pytest.raises(ValueError, match="dim=2"):
        A.softmax_one(torch.randn(3, 3), dim=2)


def test_quiet_attention_can_attend_to_nothing():
    # with every logit very negative softmax still sums to one; softmax_one goes silent
    layer = make("quiet", dim=8, heads=1, causal=False)
    with torch.no_grad():
        layer.qkv.weight.zero_()
        layer.qkv.bias.zero_()
        layer.qkv.bias[:8] = 30.0  # q = 30
        layer.qkv.bias[8:16] = -30.0  # k = -30: q.k / sqrt(8) far below zero
        layer.qkv.bias[16:] = 1.0
    y = layer(torch.randn(1, 4, 8))
    torch.testing.assert_close(y, layer.proj.bias.expand_as(y))


# ---- gradients --------------------------------------------------------------------------


@pytest.mark.parametrize("name", TOKEN_MIXERS + ["fused"])
def test_gradcheck(name):
    layer = (A.FusedAttention(4, heads=2) if name == "fused" else make(name, dim=4, heads=2)).double()
    x = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x,))


def test_feed_forward2_gradcheck():
    layer = A.FeedForward2(4, rank=2).double()
    assert torch.autograd.gradcheck(layer, (torch.randn(3, 4, dtype=torch.float64, requires_grad=True),))


# ---- causality and recurrence ------------------------------------------------------------


@pytest.mark.parametrize("name", CAUSAL)
def test_causal_outputs_ignore_the_future(name):
    layer = make(name, causal=True)
    x = torch.randn(2, 70, 16)
    changed = x.clone()
    changed[:, 40:] = torch.randn(2, 30, 16) * 5
    torch.testing.assert_close(layer(changed)[:, :40], layer(x)[:, :40], atol=0, rtol=0)


@pytest.mark.parametrize("name", CAUSAL)
def test_recurrent_step_equals_parallel(name):
    layer = make(name, causal=True)
    x = torch.randn(2, 150, 16)  # longer than one elita chunk
    full = layer(x)
    state, outs = None, []
    for t in range(x.shape[1]):
        y, state = layer.step(x[:, t : t + 1], state)
        outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-5, rtol=1e-5)
    head, state = layer.step(x[:, :67])
    tail, _ = layer.step(x[:, 67:], state)
    torch.testing.assert_close(torch.cat([head, tail], 1), full, atol=1e-5, rtol=1e-5)


def test_state_size_is_constant_for_micro_and_elita():
    for name in ("micro", "elita"):
        layer = make(name)
        _, short = layer.step(torch.randn(1, 10, 16))
        _, long = layer.step(torch.randn(1, 500, 16))
        sizes = [sum(t.numel() for t in vars(s).values() if torch.is_tensor(t)) for s in (short, long)]
        assert sizes[0] == sizes[1]


def test_step_needs_causal():
    for name in ("softmax", "micro"):
        with pytest.raises(RuntimeError, match="causal"):
            make(name, causal=False).step(torch.randn(1, 1, 16))


def test_elita_position_uses_max_len_not_input_length():
    # a token's output may not change when the sequence grows after it
    layer = make("elita", max_len=64)
    x = torch.randn(1, 50, 16)
    torch.testing.assert_close(layer(x[:, :20]), layer(x)[:, :20], atol=1e-6, rtol=1e-6)


def test_elita_without_its_position_term_is_the_equation_with_p_c_zero():
    """pos_dim=0 (the long-context variant of issue 24): the term-by-term equation with p . c = 0 in float64,
    the same at every offset (a window cut from a longer sequence sees only its own tokens' order), and
    token-by-token decoding equal to the parallel pass."""
    layer = make("elita", pos_dim=0).double()
    x = torch.randn(2, 24, 16, dtype=torch.float64)
    torch.testing.assert_close(layer(x), ref.elita_attention(layer, x), atol=1e-10, rtol=1e-10)
    state, steps = None, []
    for i in range(24):
        y, state = layer.step(x[:, i : i + 1], state)
        steps.append(y)
    torch.testing.assert_close(torch.cat(steps, 1), layer(x), atol=1e-10, rtol=1e-10)
    with pytest.raises(ValueError, match="pos_dim"):
        make("elita", pos_dim=-1)


@pytest.mark.parametrize("options", [{"pos_dim": 0}, {"pos_dim": 0, "positions": "alibi"}])
def test_elita_without_position_term_saves_and_loads(tmp_path, options):
    import zoo

    model = zoo.create("elita-gpt-tiny", vocab_size=32, context_length=16, embed_dim=32, depth=2, num_heads=2,
                       pos_embed="none", attention_options=options)
    zoo.save_pretrained(model, tmp_path / "m")
    back = zoo.load(str(tmp_path / "m"))  # its empty position tensors are no tied pair
    x = torch.randint(0, 32, (2, 16))
    torch.testing.assert_close(back(x), model(x))


@pytest.mark.parametrize("pos_dim, bias_max", [(16, 8), (0, 8), (0, 12)])
def test_elita_alibi_is_the_equation_with_a_history_fading_by_distance(route, pos_dim, bias_max):
    """positions="alibi": the term-by-term equation with each X_j of row i times e^{-m (i - j)} in float64
    (m from ALiBi's rule, or with alibi_bias_max=12 in place of its 8); decoding token by token (state and
    position carried), left-padded rows, and the kernel's float32 route all give it; and a token's output
    depends on how far back the others are, not on where they stand."""
    layer = make("elita", pos_dim=pos_dim, positions="alibi", alibi_bias_max=bias_max).double()
    assert layer.slopes.tolist() == [2.0 ** -(bias_max / 2), 2.0**-bias_max]
    x = torch.randn(2, 24, 16, dtype=torch.float64)
    full = layer(x)
    torch.testing.assert_close(full, ref.elita_attention(layer, x), atol=1e-10, rtol=1e-10)
    state, steps = None, []
    for i in range(0, 24, 5):
        y, state = layer.step(x[:, i : i + 5], state)
        steps.append(y)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-10, rtol=1e-10)
    padded = torch.cat([torch.zeros(2, 3, 16, dtype=torch.float64), x], 1)
    mask = torch.ones(2, 27, dtype=torch.bool)
    mask[:, :3] = False
    y, _ = layer.step(padded, None, key_padding_mask=mask)  # positions count from each row's first real token
    torch.testing.assert_close(y[:, 3:], full, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(layer.float()(x.float()), full.float(), atol=1e-4, rtol=1e-4)
    if pos_dim == 0:  # no absolute term: the same tokens 1,000 positions on give the same outputs
        from zoo.attention.elita import _PAD_LOGIT, ElitaState

        layer = layer.double()
        empty = ElitaState(torch.full((2, 2), _PAD_LOGIT, dtype=torch.float64),
                           torch.zeros(2, 2, 8, dtype=torch.float64), 1000)
        torch.testing.assert_close(layer.step(x, empty)[0], full, atol=1e-9, rtol=1e-9)
    with pytest.raises(ValueError, match=r"positions must be None \(the write-up's equation\) or 'alibi', got 'rope'"):
        make("elita", positions="rope")


def test_decayed_cumsum_is_the_recurrence_at_every_chunking():
    """micro's fading sums against y_t = e^{-m} y_{t-1} + v_t from y_{-1} = initial, token by token in float64:
    inside one chunk, across chunks, at a length no multiple of the chunk, and with m = 0 (a plain cumsum)."""
    from zoo.attention.micro import decayed_cumsum

    torch.manual_seed(0)
    slopes = torch.tensor([0.5, 1 / 16, 0.0], dtype=torch.float64)
    initial = torch.randn(2, 3, 4, dtype=torch.float64)
    for n, chunk in [(1, 64), (7, 64), (23, 5), (20, 5), (40, 3)]:
        values = torch.randn(2, n, 3, 4, dtype=torch.float64)
        y, expected = initial, []
        for t in range(n):
            y = torch.exp(-slopes)[:, None] * y + values[:, t]
            expected.append(y)
        torch.testing.assert_close(decayed_cumsum(values, slopes, initial, chunk), torch.stack(expected, 1),
                                   atol=1e-12, rtol=1e-12)


def test_decayed_cumsum_stays_finite_and_exact_over_long_float32_inputs():
    """20,000 tokens of large values in float32, against the float64 recurrence: the cumsum form would need
    e^{m j}, which overflows float32 past j = 88 / m (176 tokens at m = 1/2)."""
    from zoo.attention.micro import decayed_cumsum

    torch.manual_seed(0)
    slopes = torch.tensor([0.5, 1 / 256], dtype=torch.float64)
    values = torch.rand(1, 20_000, 2, 1, dtype=torch.float64) * 100
    y, expected, fade = torch.zeros(1, 2, 1, dtype=torch.float64), torch.empty_like(values), torch.exp(-slopes)[:, None]
    for t in range(values.shape[1]):
        y = fade * y + values[:, t]
        expected[:, t] = y
    got = decayed_cumsum(values.float(), slopes.float(), torch.zeros(1, 2, 1))
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), expected, atol=0, rtol=1e-4)


@pytest.mark.parametrize("heads, bias_max", [(1, 8), (2, 8), (2, 12)])
def test_micro_alibi_is_the_mean_with_a_history_fading_by_distance(heads, bias_max):
    """positions="alibi": the term-by-term mean with each s_j of row i times e^{-m (i - j)} in float64 (m from
    ALiBi's rule, or with alibi_bias_max=12 in place of its 8), over 100 tokens (two chunks) and with padding;
    decoding in pieces and token by token gives it, and so does the float32 layer."""
    torch.manual_seed(0)
    layer = make("micro", heads=heads, positions="alibi", alibi_bias_max=bias_max).double()
    x = torch.randn(2, 100, 16, dtype=torch.float64)
    full = layer(x)
    torch.testing.assert_close(full, ref.micro_attention(layer, x), atol=1e-10, rtol=1e-10)
    mask = torch.rand(2, 100) > 0.3
    torch.testing.assert_close(layer(x, key_padding_mask=mask)[mask], ref.micro_attention(layer, x, mask)[mask],
                               atol=1e-10, rtol=1e-10)
    for size in (7, 1):
        state, steps = None, []
        for i in range(0, 100, size):
            y, state = layer.step(x[:, i : i + size], state)
            steps.append(y)
        torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(layer.float()(x.float()), full.float(), atol=1e-4, rtol=1e-4)


def test_micro_alibi_passes_a_non_finite_token_on_and_never_hides_it():
    """A NaN or inf token makes every output from it on NaN, as the mean as written does: no later output is a
    finite number computed from it. (Inside its block the chunked sums also reach the outputs before it, 0 * NaN
    in the masked products; the token-by-token route does not.)"""
    torch.manual_seed(0)
    layer = make("micro", positions="alibi")
    for bad in (float("nan"), float("inf")):
        x = torch.randn(2, 150, 16)
        x[:, 100] = bad
        assert torch.isnan(layer(x)[:, 100:]).all()
        state, steps = None, []
        for i in range(150):
            y, state = layer.step(x[:, i : i + 1], state)
            steps.append(y)
        steps = torch.cat(steps, 1)
        assert torch.isfinite(steps[:, :100]).all() and torch.isnan(steps[:, 100:]).all()


def test_micro_positions_are_refused_where_they_cannot_work():
    with pytest.raises(ValueError, match=r"positions must be None \(the write-up's mean\) or 'alibi', got 'rope'"):
        make("micro", positions="rope")
    with pytest.raises(ValueError, match=r"positions='alibi' needs causal=True .*got causal=False"):
        make("micro", causal=False, positions="alibi")
    for name in ("micro", "elita"):  # a slope setting without the fading history would change nothing
        with pytest.raises(ValueError, match=r"alibi_bias_max sets ALiBi's slopes and needs positions='alibi', "
                                             r"got alibi_bias_max=12 with positions=None"):
            make(name, alibi_bias_max=12)
        with pytest.raises(ValueError, match=r"alibi_bias_max must be a finite number in \(0.0, inf\], got 0"):
            make(name, positions="alibi", alibi_bias_max=0)
        with pytest.raises(ValueError, match=r"alibi_bias_max must be at most 126, got 99999: the slowest slope"):
            make(name, positions="alibi", alibi_bias_max=99999)  # its slope, 2^-99999, would be a silent 0
    assert make("micro", alibi_bias_max=8).slopes is None  # the default, spelled out, is fine


@pytest.mark.parametrize("options", [{"positions": "alibi"}, {"positions": "alibi", "alibi_bias_max": 12}])
def test_micro_alibi_model_saves_loads_and_decodes_as_its_full_pass(tmp_path, options):
    import zoo

    from .reference import greedy_by_recompute

    torch.manual_seed(0)
    model = zoo.create("micro-gpt-tiny", vocab_size=32, context_length=16, embed_dim=32, depth=2, num_heads=2,
                       attention_options=options).eval()
    zoo.save_pretrained(model, tmp_path / "m")
    back = zoo.load(str(tmp_path / "m"))
    slowest = 2.0 ** -options.get("alibi_bias_max", 8)
    assert all(block.attn.positions == "alibi" and block.attn.slopes[-1] == slowest for block in back.blocks)
    x = torch.randint(0, 32, (2, 16))
    torch.testing.assert_close(back(x), model(x))
    with torch.no_grad():
        model.tok_embed.weight.mul_(50)  # logits far apart: greedy choices not decided by rounding
    assert model.generate([[3, 1, 4, 1, 5]], 10, temperature=0)[0] == greedy_by_recompute(model, [3, 1, 4, 1, 5], 10)


@pytest.mark.parametrize("options", [{}, {"positions": "alibi", "pos_dim": 0}])
def test_elita_one_token_steps_match_the_float64_equation(options):
    """A one-token step takes its own route (the running mean's update written out, not the scan kernel): token
    by token from the start, in float64, it gives the term-by-term equation."""
    torch.manual_seed(0)
    layer = make("elita", **options).double()
    x = torch.randn(2, 24, 16, dtype=torch.float64)
    state, steps = None, []
    for i in range(24):
        y, state = layer.step(x[:, i : i + 1], state)
        steps.append(y)
    torch.testing.assert_close(torch.cat(steps, 1), ref.elita_attention(layer, x), atol=1e-10, rtol=1e-10)
    assert state.position == 24


# ---- masks ------------------------------------------------------------------------------


@pytest.mark.parametrize("name, causal", [*MIXER_DIRECTIONS, ("fused", False)])
def test_padded_tokens_never_enter(name, causal):
    layer = A.FusedAttention(16, heads=2) if name == "fused" else make(name, causal=causal)
    x = torch.randn(2, 12, 16)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[0, 8:] = False  # right padding
    mask[1, :3] = False  # left padding
    noisy = x.clone()
    noisy[~mask] = torch.randn(int((~mask).sum()), 16) * 100
    a, b = layer(x, key_padding_mask=mask), layer(noisy, key_padding_mask=mask)
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    if name == "fused":
        torch.testing.assert_close(a, b)
        # and it equals the unpadded sequence alone
        torch.testing.assert_close(a[0], layer(x[:1, :8])[0], atol=1e-5, rtol=1e-5)
        return
    torch.testing.assert_close(a[mask], b[mask], atol=1e-5, rtol=1e-5)
    if name != "elita":  # right-padded row equals the reference on its real tokens only
        want = reference(name, layer, x[:1, :8])
        torch.testing.assert_close(a[0, :8].double(), want[0], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["micro", "elita"])
def test_scans_in_blocks_equal_the_formula_across_block_edges(name, monkeypatch):
    """Long sequences run in blocks that carry the state; shrink the block to see many edges."""
    from zoo.attention import blocks

    monkeypatch.setattr(blocks, "BLOCK", 7)
    layer = make(name)
    x = torch.randn(2, 40, 16)
    torch.testing.assert_close(layer(x).double(), reference(name, layer, x), atol=2e-5, rtol=1e-4)
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[0, 5:19] = False  # a gap across two block edges, and a whole padded block
    noisy = x.clone()
    noisy[~mask] = torch.randn(int((~mask).sum()), 16) * 100
    a, b = layer(x, key_padding_mask=mask), layer(noisy, key_padding_mask=mask)
    torch.testing.assert_close(a[mask], b[mask], atol=1e-5, rtol=1e-4)
    if name == "micro":  # the padded tokens are simply absent from the mean
        kept = torch.cat([x[:1, :5], x[:1, 19:]], 1)
        torch.testing.assert_close(a[0, 19:].double(), reference(name, layer, kept)[0, 5:], atol=2e-5, rtol=1e-4)
    x.requires_grad_(True)
    layer(x).sum().backward()
    assert torch.isfinite(x.grad).all() and (x.grad[:, 0] != 0).all()  # gradients flow back through the state


def test_masked_reference_agreement_for_attention():
    layer = make("softmax", causal=False)
    x = torch.randn(2, 9, 16)
    mask = torch.rand(2, 9) > 0.3
    mask[:, 0] = True
    got = layer(x, key_padding_mask=mask)
    want = ref.multi_head_attention(layer, x, mask)
    torch.testing.assert_close(got[mask].double(), want[mask], atol=2e-5, rtol=1e-4)


# ---- precision and extremes ---------------------------------------------------------------


@pytest.mark.parametrize("name", TOKEN_MIXERS + ["fused"])
def test_bf16_is_finite_and_close(name):
    layer = A.FusedAttention(16, heads=2) if name == "fused" else make(name, causal=name != "fused")
    x = torch.randn(2, 100, 16)
    want = layer(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = layer(x)
    assert torch.isfinite(got).all()
    assert (got.float() - want).abs().max() < 0.05 * want.abs().max() + 0.05


@pytest.mark.parametrize("name", TOKEN_MIXERS)
def test_bf16_autocast_gradients_are_close(name):
    """Backward under bf16 autocast, through the kernels where they run, stays close to float32's."""
    layer = make(name)
    x = torch.randn(2, 100, 16)
    grad = torch.randn(2, 100, 16)
    grads = []
    for enabled in (False, True):
        inputs = x.clone().requires_grad_(True)
        layer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            out = layer(inputs)
        (out.float() * grad).sum().backward()
        grads.append([inputs.grad] + [p.grad.clone() for p in layer.parameters()])
    for want, got in zip(*grads):
        assert torch.isfinite(got).all()
        assert (got - want).abs().max() < 0.05 * want.abs().max() + 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["micro", "elita"])
def test_scans_in_half_precision_models(name, dtype):
    """A whole model in bf16 or fp16: the scans still sum in float32 and hand back x's dtype."""
    import copy

    layer = make(name)
    x = torch.randn(2, 100, 16)
    want = layer(x)
    half = copy.deepcopy(layer).to(dtype)
    inputs = x.to(dtype).requires_grad_(True)
    got = half(inputs)
    got.float().pow(2).sum().backward()
    assert got.dtype == dtype and inputs.grad.dtype == dtype and torch.isfinite(inputs.grad).all()
    assert (got.float() - want).abs().max() < 0.05 * want.abs().max() + 0.05


@pytest.mark.parametrize("name", TOKEN_MIXERS)
def test_extreme_inputs_stay_finite(name):
    layer = make(name)
    for x in (torch.zeros(1, 20, 16), torch.full((1, 20, 16), 1e4), torch.full((1, 20, 16), -1e4)):
        assert torch.isfinite(layer(x)).all()


@pytest.mark.parametrize("block", [4096, 7])
def test_micro_routes_match_float64_values_and_gradients(route, block, monkeypatch):
    """The compiled scan (or the eager route) in float32 against the eager route in float64.

    Tokens that score zero from the start (z = 0) and padding are in; a 7-token block
    carries the state across edges, so the state's own gradient is checked too.
    """
    from zoo.attention import blocks

    monkeypatch.setattr(blocks, "BLOCK", block)
    layer = make("micro", dim=16, heads=2)
    x = torch.randn(3, 30, 16)
    x[1, :4] = 0.0  # scores of exactly zero: the running mean is 0 there
    mask = torch.ones(3, 30, dtype=torch.bool)
    mask[2, 9:20] = False
    for a, b in zip(*float32_and_float64(layer, x, mask)):
        torch.testing.assert_close(a.double(), b, atol=1e-4, rtol=1e-4)


def float32_and_float64(layer, x, mask):
    """[outputs at real tokens, x's gradient, each parameter's gradient] from the float32
    layer and from a float64 copy (which takes the eager route), for one output gradient."""
    import copy

    grad = torch.randn_like(x)
    results = []
    for model, inputs in ((layer, x.clone()), (copy.deepcopy(layer).double(), x.double())):
        inputs.requires_grad_(True)
        (model(inputs, key_padding_mask=mask) * grad.to(inputs.dtype)).sum().backward()
        results.append([model(inputs.detach(), key_padding_mask=mask)[mask], inputs.grad]
                       + [p.grad for p in model.parameters()])
    return results


def test_elita_logits_stay_float32_under_autocast():
    """exp of a logit in the hundreds: in bf16 (steps of 1 or 2 there) the weights would be off by e^1."""
    layer = make("elita")
    with torch.no_grad():
        layer.keys.normal_(0, 30)
    x = torch.randn(2, 300, 16)
    want = ref.elita_recurrent(layer, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = layer(x)
    # only the value projection runs in bf16: its rounding, not the logits', sets the error
    assert (got.double() - want).abs().max() < 0.02 * want.abs().max()


def test_micro_keeps_no_bf16_copy_of_its_input_under_autocast():
    """The score projection is 8 numbers wide per token: under autocast it reads x as it is,
    where a bf16 copy of x (2 bytes per channel) would be kept for the backward."""
    layer = make("micro", dim=16, heads=2)
    x = torch.randn(1, 64, 16, requires_grad=True)
    kept = {}

    def pack(t):
        kept[t.untyped_storage().data_ptr()] = t
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        layer(x)
    copies = [t for t in kept.values() if t.dtype == torch.bfloat16 and t.shape[-1] == 16 and t.numel() == x.numel()]
    assert len(copies) == 1  # the output projection's input, and no second copy for the scores


@pytest.mark.parametrize("block", [4096, 7])
@pytest.mark.parametrize("scale", [1, 10])
def test_elita_routes_match_float64_values_and_gradients(route, block, scale, monkeypatch):
    """The compiled scan (or the eager route) in float32 against the eager route in float64,
    with logits up to the tens, padding at the start and inside, and 7-token blocks whose
    carried state (log-normalizer and mean) needs its own gradient."""
    from zoo.attention import blocks

    monkeypatch.setattr(blocks, "BLOCK", block)
    layer = make("elita", dim=16, heads=2)
    with torch.no_grad():
        layer.keys.normal_(0, scale)
    x = torch.randn(3, 30, 16)
    mask = torch.ones(3, 30, dtype=torch.bool)
    mask[1, :5] = False
    mask[2, 9:20] = False
    # With logits in the tens the eager route's float32 gradients are off by about 1.4e-4 of
    # their largest value (a few elements by 3e-3); the kernel's recurrence by 2e-5.
    tol = 5e-3 if (route, scale) == ("eager", 10) else 1e-4
    for a, b in zip(*float32_and_float64(layer, x, mask)):
        torch.testing.assert_close(a.double(), b, atol=tol, rtol=tol)


def test_micro_all_zero_scores_have_no_nan_in_bf16():
    layer = make("micro")
    with torch.no_grad():
        layer.queries.abs_()
    x = -torch.rand(1, 16, 16)  # every score relu(q . x) is 0 at first
    x[:, 10:] = torch.rand(1, 6, 16)
    for dtype in (torch.float32, torch.bfloat16):
        y = layer.to(dtype)(x.to(dtype))
        assert torch.isfinite(y).all()
        # with nothing to average, the mean is zero and the output is the projection of x itself
        torch.testing.assert_close(y[:, :10], layer.proj(x[:, :10].to(dtype)))


def test_elita_large_logits_match_float64():
    layer = make("elita")
    with torch.no_grad():
        layer.keys.normal_(0, 30)  # logits in the hundreds: plain exp overflows float32
    x = torch.randn(2, 300, 16)
    torch.testing.assert_close(layer(x).double(), ref.elita_recurrent(layer, x), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ref.elita_recurrent(layer, x[:, :12] / 30), ref.elita_attention(layer, x[:, :12] / 30))


@pytest.mark.parametrize("name", ["micro", pytest.param("elita", marks=pytest.mark.slow)])  # elita: 10 s
def test_65536_tokens_stay_finite_and_match_float64(name):
    n = 65_536
    layer = make(name, dim=8, heads=1)
    x = torch.randn(1, n, 8) * 3
    with torch.no_grad():
        y = layer(x)
    assert torch.isfinite(y).all()
    # spot-check the tail against the float64 recurrence
    if name == "elita":
        want = ref.elita_recurrent(layer, x)[:, -64:]
    else:
        with torch.no_grad():
            xd = x.double()
            s = torch.relu(xd @ layer.queries.double().T).sum(-1, keepdim=True)
            mean = (s * xd).cumsum(1) / s.cumsum(1)
            want = ((xd - mean) @ layer.proj.weight.double().T)[:, -64:]
    torch.testing.assert_close(y[:, -64:].double(), want, atol=1e-4, rtol=1e-3)


# ---- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TOKEN_MIXERS + ["fused"])
def test_bad_input_names_expected_and_given(name):
    layer = A.FusedAttention(16, heads=2) if name == "fused" else make(name)
    with pytest.raises(ValueError, match=r"\(batch, length, 16\).*\(2, 16\)"):
        layer(torch.randn(2, 16))
    with pytest.raises(ValueError, match=r"\(batch, length, 16\).*\(2, 3, 8\)"):
        layer(torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match="floating-point.*int64"):
        layer(torch.ones(2, 3, 16, dtype=torch.long))
    with pytest.raises(ValueError, match=r"key_padding_mask of shape \(2, 3\).*\(2, 4\)"):
        layer(torch.randn(2, 3, 16), key_padding_mask=torch.ones(2, 4, dtype=torch.bool))


def test_build_errors():
    with pytest.raises(ValueError, match="unknown attention 'nope'.*micro"):
        A.build("nope", 16)
    with pytest.raises(ValueError, match="dim=10, heads=4"):
        A.build("softmax", 10, heads=4)
    with pytest.raises(ValueError, match="causal"):
        A.build("elita", 16, causal=False)
    with pytest.raises(ValueError, match="causal"):
        A.build("fused", 16, causal=True)


# ---- the controls of Bondarenko et al. 2023: clipped softmax and gated attention ----------------------


def test_clipped_softmax_is_its_formula():
    x = torch.randn(5, 9, dtype=torch.float64) * 4
    zeta, gamma = 1.1, -0.05
    e = x.exp()
    want = ((zeta - gamma) * e / e.sum(-1, keepdim=True) + gamma).clamp(0, 1)
    got = A.clipped_softmax(x, -1, zeta, gamma)
    torch.testing.assert_close(got, want)
    assert (got == 0).any() and (got == 1).any()  # exact zeros and ones at finite logits: the point of it
    x.requires_grad_()
    y = A.clipped_softmax(x, -1, zeta, gamma)
    y.sum().backward()
    soft = ((zeta - gamma) * x.softmax(-1) + gamma)
    clipped = (soft <= 0) | (soft >= 1)
    # rows whose every entry is clipped pass no gradient at all
    assert torch.equal(x.grad[clipped.all(-1)], torch.zeros_like(x.grad[clipped.all(-1)]))


@pytest.mark.parametrize("alpha, keys", [(4.0, 17), (1.5, 64), (0.5, 17)])
def test_clipped_attention_with_alpha_above_one_empties_uniform_rows(alpha, keys):
    """With gamma = -alpha / T a uniform row becomes (1 - alpha + alpha / T) / T: below zero from
    alpha > T / (T - 1), so equal logits (a fresh model's) give an all-zero row and no gradient."""
    torch.manual_seed(0)
    layer = A.build("clipped", 16, heads=2, alpha=alpha)
    token = torch.randn(16)
    x = token.expand(1, keys, 16)  # every token alike: every key the same, so every row is uniform
    out = layer(x)
    out.square().sum().backward()
    uniform = (1 - alpha + alpha / keys) / keys
    if uniform < 0:  # nothing attended: the output is the projection's bias alone, and nothing trains q, k, v
        torch.testing.assert_close(out, layer.proj.bias.expand_as(out))
        assert torch.equal(layer.qkv.weight.grad, torch.zeros_like(layer.qkv.weight))
    else:  # each of the T weights is `uniform`, so the row attends keys * uniform of the shared value
        v = layer.qkv(token)[32:]
        torch.testing.assert_close(out[0, 0], layer.proj(keys * uniform * v))
        assert layer.qkv.weight.grad.abs().sum() > 0


def control_reference(layer, x, causal: bool):
    """Clipped or gated attention in float64 from the layer's own weights, written out."""
    x = x.double()
    b, n, d = x.shape
    h, hd = layer.heads, layer.head_dim
    qkv = x @ layer.qkv.weight.double().T + layer.qkv.bias.double()
    q, k, v = qkv.view(b, n, 3, h, hd).permute(2, 0, 3, 1, 4)
    logits = q @ k.transpose(-1, -2) / hd**0.5
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    if causal:
        logits = logits.masked_fill(future, float("-inf"))
    w = logits.softmax(-1)
    if isinstance(layer, A.ClippedSoftmaxAttention):
        seen = torch.arange(1, n + 1) if causal else torch.full((n,), n)  # the keys each row sees
        seen = seen.double()
        gamma = -layer.alpha / seen[:, None]
        w = ((layer.zeta - gamma) * w + gamma).clamp(0, 1)
    out = w @ v  # (b, h, n, hd)
    if isinstance(layer, A.GatedAttention):
        per_head = x.view(b, n, h, hd)
        gate = torch.sigmoid((per_head * layer.gate_weight.double()).sum(-1) + layer.gate_bias.double())
        out = out * gate.transpose(1, 2)[..., None]
    out = out.transpose(1, 2).reshape(b, n, d)
    return out @ layer.proj.weight.double().T + layer.proj.bias.double()


@pytest.mark.parametrize("name", ["clipped", "gated"])
@pytest.mark.parametrize("causal", [False, True])
def test_controls_against_float64(name, causal):
    layer = A.build(name, 32, heads=4, causal=causal)
    if name == "gated":
        torch.nn.init.normal_(layer.gate_bias)
    x = torch.randn(2, 11, 32) * 3
    torch.testing.assert_close(layer(x).double(), control_reference(layer, x, causal), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["clipped", "gated"])
def test_controls_decode_step_by_step_as_in_parallel(name):
    layer = A.build(name, 32, heads=4, causal=True).eval()
    x = torch.randn(2, 9, 32)
    state, outs = None, []
    for t in range(9):
        y, state = layer.step(x[:, t:t + 1], state)
        outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 1), layer(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["clipped", "gated"])
def test_controls_captured_weights(name):
    import zoo
    from zoo.viz import capture

    model = zoo.create(f"{name}-gpt-tiny").eval()
    seen = []
    layer = model.blocks[0].attn
    layer.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    with capture(model) as maps:
        model(torch.randint(0, 65, (1, 12)))
    w = maps[0].weights.double()
    v = (seen[0].double() @ layer.qkv.weight.double().T + layer.qkv.bias.double()).view(1, 12, 3, 4, 32)[:, :, 2]
    out = w @ v.transpose(1, 2)  # the weights rebuild the heads' outputs before gate and projection
    if name == "gated":
        out = out * maps[0].extra["gate"].double()[..., None]
    else:
        assert (maps[0].extra["nothing"] >= -1e-6).all()
    rebuilt = out.transpose(1, 2).reshape(1, 12, 128) @ layer.proj.weight.double().T + layer.proj.bias.double()
    torch.testing.assert_close(rebuilt, control_reference(layer, seen[0], True), rtol=1e-4, atol=1e-5)
