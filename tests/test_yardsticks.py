"""The field's yardsticks: sliding-window attention, GLA (and RetNet), DeltaNet and Mamba-2's SSD.

Each is held to a float64 reference written token by token (tests/reference.py), its chunked training route to
that reference at lengths that are not a multiple of a chunk, its decoding to its parallel forward, padding to
the same row unpadded, and its options to one clear line when wrong.
"""

from __future__ import annotations

import pytest
import torch

import zoo
from tests import reference as ref
from zoo.attention import MIXERS, RecurrentState, WindowCache, build, swap
from zoo.attention.linear_recurrence import MIN_LOG_DECAY, chunked_decayed_sum, chunked_delta_rule

RECURRENT = {"gla": {}, "gla-fixed": {"decay": "fixed"}, "deltanet": {}, "deltanet-plain": {"gated": False},
             "deltanet-noconv": {"conv_width": 0}, "ssd": {"state_dim": 8}, "ssd-noconv": {"state_dim": 8,
                                                                                        "conv_width": 0}}
REFERENCES = {"gla": ref.gla_layer, "deltanet": ref.deltanet_layer, "ssd": ref.ssd_layer}
ALL = {**RECURRENT, "window": {"window": 5}, "window-rope": {"window": 5, "positions": "rope"},
       "window-alibi": {"window": 5, "positions": "alibi"}}


def layer(case: str, dim: int = 16, heads: int = 2, dtype=torch.float32):
    torch.manual_seed(0)
    m = build(case.split("-")[0], dim, heads=heads, causal=True, **ALL[case])
    for p in m.parameters():  # away from the initial values, so that every weight matters
        if p.dim() == 1 and p.requires_grad:
            p.data.add_(0.1 * torch.randn_like(p))
    return m.to(dtype)


def tokens(b=2, n=70, dim=16, seed=1, dtype=torch.float32):
    return torch.randn(b, n, dim, generator=torch.Generator().manual_seed(seed)).to(dtype)


# --- the chunked recurrences against the token-by-token formulas -----------------------------------------------

@pytest.mark.parametrize("length", [1, 15, 16, 17, 64, 150])
@pytest.mark.parametrize("per_channel", [False, True])
def test_chunked_decayed_sum_is_the_recurrence(length, per_channel):
    g = torch.Generator().manual_seed(length)
    b, h, dk, dv = 2, 3, 8, 5
    q, k = torch.randn(b, h, length, dk, generator=g), torch.randn(b, h, length, dk, generator=g)
    v, initial = torch.randn(b, h, length, dv, generator=g), torch.randn(b, h, dk, dv, generator=g)
    shape = (b, h, length, dk) if per_channel else (b, h, length)
    log_decay = -torch.rand(*shape, generator=g) * (-MIN_LOG_DECAY if per_channel else 8.0)
    out, final = chunked_decayed_sum(q, k, v, log_decay, initial)
    want, want_final = ref.decayed_sum(q, k, v, log_decay, initial)
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final.double(), want_final, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("length", [1, 63, 64, 65, 150])
@pytest.mark.parametrize("gated", [False, True])
def test_chunked_delta_rule_is_the_recurrence(length, gated):
    g = torch.Generator().manual_seed(length)
    b, h, dk, dv = 2, 2, 8, 6
    q = torch.randn(b, h, length, dk, generator=g)
    k = torch.nn.functional.normalize(torch.randn(b, h, length, dk, generator=g), dim=-1)
    v, initial = torch.randn(b, h, length, dv, generator=g), torch.randn(b, h, dk, dv, generator=g)
    beta = torch.rand(b, h, length, generator=g)
    log_decay = -torch.rand(b, h, length, generator=g) * 3 if gated else None
    out, final = chunked_delta_rule(q, k, v, beta, log_decay, initial)
    want, want_final = ref.delta_rule(q, k, v, beta, log_decay, initial)
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final.double(), want_final, rtol=1e-4, atol=1e-4)


def test_the_delta_rule_overwrites_what_a_key_held():
    """The property recall needs: write v1 then v2 under one key with b = 1, and reading the key gives v2 (linear
    attention would give v1 + v2)."""
    k = torch.tensor([1.0, 0.0])
    keys = k.expand(1, 1, 2, 2).contiguous()
    values = torch.tensor([[3.0, -1.0], [5.0, 2.0]]).expand(1, 1, 2, 2).contiguous()
    out, _ = chunked_delta_rule(keys, keys, values, torch.ones(1, 1, 2))
    assert torch.allclose(out[0, 0, 1], torch.tensor([5.0, 2.0]))
    summed, _ = chunked_decayed_sum(keys, keys, values, torch.zeros(1, 1, 2))
    assert torch.allclose(summed[0, 0, 1], torch.tensor([8.0, 1.0]))


def test_extreme_gates_stay_finite_forward_and_backward():
    """GLA's clamp keeps the chunked factors inside float32 for gate logits far below any trained value."""
    m = layer("gla")
    with torch.no_grad():
        m.gate[1].bias.fill_(-1e4)
    x = tokens().requires_grad_()
    y = m(x)
    y.sum().backward()
    assert torch.isfinite(y).all() and torch.isfinite(x.grad).all()
    torch.testing.assert_close(y.double(), ref.gla_layer(m, x.detach()), rtol=1e-4, atol=1e-4)


# --- the layers against their float64 references ---------------------------------------------------------------

@pytest.mark.parametrize("case", list(RECURRENT))
def test_layer_matches_float64_reference(case):
    m, x = layer(case), tokens(n=70)
    torch.testing.assert_close(m(x).double(), REFERENCES[case.split("-")[0]](m, x), rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("length", [7, 12, 23])  # within two windows (the band), and past them (in blocks)
def test_window_matches_float64_reference(length):
    m, x = layer("window"), tokens(n=length)
    padding = torch.ones(2, length, dtype=torch.bool)
    padding[1, :3] = False
    for mask in (None, padding):
        torch.testing.assert_close(m(x, mask).double(), ref.window_attention(m, x, mask), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["window", "window-rope", "window-alibi"])
def test_window_blocks_equal_the_band_mask(case):
    """Past two windows a causal layer runs in blocks of W queries; an attn_mask of all True sends the same call
    through the band mask over all keys."""
    m, x = layer(case), tokens(n=37)
    padding = torch.ones(2, 37, dtype=torch.bool)
    padding[0, :6], padding[1, 30:] = False, False
    everything = torch.ones(37, 37, dtype=torch.bool)
    for mask in (None, padding):
        torch.testing.assert_close(m(x, mask), m(x, mask, attn_mask=everything), rtol=1e-5, atol=1e-6)


def test_window_as_wide_as_the_sequence_is_softmax_attention():
    softmax = build("softmax", 16, heads=2, causal=True)
    window = swap(build("softmax", 16, heads=2, causal=True), "window", window=40)
    window.load_state_dict(softmax.state_dict())
    x = tokens(n=40)
    torch.testing.assert_close(window(x), softmax(x))
    assert not torch.allclose(swap(softmax, "window", window=4)(x), window(x))


# --- decoding, padding, precision -------------------------------------------------------------------------------

@pytest.mark.parametrize("case", list(ALL))
def test_decoding_equals_the_parallel_forward(case):
    m, x = layer(case), tokens(n=70)
    padding = torch.ones(2, 70, dtype=torch.bool)
    padding[1, :6] = False  # a left-padded prompt
    for mask in (None, padding):
        want = m(x, mask)
        state, outs = None, []
        for t in range(70):
            y, state = m.step(x[:, t:t + 1], state, None if mask is None else mask[:, t:t + 1])
            outs.append(y)
        torch.testing.assert_close(torch.cat(outs, 1), want, rtol=1e-5, atol=2e-6)
        first, state = m.step(x[:, :33], None, None if mask is None else mask[:, :33])
        rest, _ = m.step(x[:, 33:], state, None if mask is None else mask[:, 33:])
        torch.testing.assert_close(torch.cat([first, rest], 1), want, rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("case", list(ALL))
def test_a_left_padded_row_computes_the_row_unpadded(case):
    m, x = layer(case), tokens(n=40)
    padding = torch.ones(2, 40, dtype=torch.bool)
    padding[1, :9] = False
    out = m(x, padding)
    torch.testing.assert_close(out[1:, 9:], m(x[1:, 9:]), rtol=1e-5, atol=2e-6)
    assert (out[1, :9] == 0).all()


@pytest.mark.parametrize("case", ["window", "gla", "deltanet", "ssd"])
def test_state_size_does_not_grow_with_length(case):
    m = layer(case)
    sizes = []
    state = None
    for t in range(30):
        _, state = m.step(tokens(n=1, seed=t), state)
        tensors = [state.keys, state.values] if isinstance(state, WindowCache) else [state.memory, state.conv]
        sizes.append(sum(t.numel() for t in tensors if t is not None))
    assert sizes[10] == sizes[-1]
    if case == "window":
        assert state.keys.shape[-2] == 4 and state.seen == 30  # W - 1 keys
    else:
        assert isinstance(state, RecurrentState) and state.memory.dtype == torch.float32


@pytest.mark.parametrize("case", ["window", "gla", "deltanet", "ssd"])
def test_bfloat16_autocast_trains_close_to_float32(case):
    m, x = layer(case), tokens(n=40)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = m(x)
    assert low.dtype == torch.bfloat16
    scale = m(x).abs().max()
    assert (low.float() - m(x)).abs().max() < 0.05 * scale
    low.float().square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters() if p.requires_grad)
    bf16 = layer(case, dtype=torch.bfloat16)  # weights in bf16 too: the recurrence still runs in float32
    assert bf16(x.bfloat16()).dtype == torch.bfloat16


# --- options and refusals ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,options,expected", [
    ("gla", {"causal": False}, "causal only"),
    ("deltanet", {"causal": False}, "causal only"),
    ("ssd", {"causal": False}, "causal only"),
    ("gla", {"decay": "retnet"}, "decay must be one of"),
    ("gla", {"expand_k": 0.01}, "multiple of heads"),
    ("deltanet", {"conv_width": 1}, "conv_width must be 0"),
    ("ssd", {"state_dim": 0}, "state_dim"),
    ("window", {"window": 0}, "window"),
])
def test_bad_options_get_one_line(name, options, expected):
    args = {"causal": True, **options}
    with pytest.raises(ValueError, match=expected):
        build(name, 16, heads=2, **args)


@pytest.mark.parametrize("case", ["gla", "deltanet", "ssd", "window"])
def test_a_state_from_another_layer_or_batch_is_refused(case):
    m = layer(case)
    _, state = m.step(tokens(b=2, n=3))
    with pytest.raises(ValueError, match="state"):
        m.step(tokens(b=3, n=1), state)
    with pytest.raises(TypeError, match="expects state=None"):
        m.step(tokens(n=1), object())


@pytest.mark.parametrize("name", ["gla", "deltanet", "ssd"])
def test_recurrent_layers_refuse_an_attn_mask(name):
    m = build(name, 16, heads=2, causal=True)
    with pytest.raises(ValueError, match="no query-key weights"):
        m(tokens(), attn_mask=torch.ones(70, 70, dtype=torch.bool))


def test_window_refuses_cross_attention():
    with pytest.raises(ValueError, match="within one sequence"):
        build("window", 16, heads=2)(tokens(n=5), context=tokens(n=7))


# --- in the models -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["window-gpt-tiny", "gla-gpt-tiny", "deltanet-gpt-tiny", "ssd-gpt-tiny"])
def test_registered_model_generates_what_its_forward_predicts(name):
    model = zoo.create(name, context_length=64).eval()
    prompt = torch.randint(0, 65, (1, 12), generator=torch.Generator().manual_seed(0))
    out = model.generate(prompt, max_new_tokens=6, temperature=0.0)
    ids = prompt
    for _ in range(6):  # greedy by recomputing the whole sequence each time
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, ids)
    assert set(MIXERS) >= {"window", "gla", "deltanet", "ssd"}


@pytest.mark.parametrize("mechanism", ["gla", "deltanet", "ssd"])
def test_a_bidirectional_model_is_not_swapped_to_a_causal_only_layer(mechanism):
    with pytest.raises(ValueError, match="causal only"):
        swap(torch.nn.MultiheadAttention(16, 2, batch_first=True), mechanism)


def test_exported_decoding_refuses_the_new_states_by_name():
    from zoo.models import decoding

    with pytest.raises(ValueError, match="decode it in PyTorch"):
        decoding.state_names(zoo.create("gla-gpt-tiny"))


def test_ssd_in_place_of_transformers_attention_takes_expand_1_only():
    transformers = pytest.importorskip("transformers")
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32,
                                                                 n_positions=32))
    with pytest.raises(ValueError, match="needs expand=1"):
        swap(model, "ssd", expand=2)


@pytest.mark.parametrize("name", ["deltanet", "ssd"])
def test_the_short_convolution_is_applied_and_trained(name):
    """A class attribute `conv = None` once shadowed the submodule, so the convolution was silently skipped."""
    m = build(name, 16, heads=2, causal=True)
    assert m.conv is not None and m.conv is dict(m.named_children())["conv"]
    x = tokens(n=20)
    out = m(x)
    out.square().mean().backward()
    assert m.conv.weight.grad is not None and m.conv.weight.grad.abs().sum() > 0
    with torch.no_grad():
        m.conv.weight.zero_()
    assert not torch.allclose(m(x), out)


@pytest.mark.parametrize("case,chunk", [("gla", 16), ("deltanet", 64), ("ssd", 64)])
def test_a_nan_token_reaches_no_chunk_before_its_own(case, chunk):
    """As documented in linear_recurrence.py: every later output is NaN, the chunks before it stay finite."""
    m, x = layer(case), tokens(n=150)
    x[0, chunk + 5] = float("nan")
    out = m(x)
    assert torch.isfinite(out[0, :chunk]).all() and torch.isnan(out[0, chunk + 5:]).all()
    assert torch.isfinite(out[1]).all()  # another row of the batch is untouched


def _backward_nodes(output: torch.Tensor) -> list[str]:
    """The names of every node of the autograd graph behind `output`."""
    names, seen, todo = [], set(), [output.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        todo.extend(next_node for next_node, _ in node.next_functions)
    return names


@pytest.mark.parametrize("op", ["decayed_sum", "delta_rule"])
def test_the_chunk_loop_backward_is_linear_in_the_length(op):
    """The loop over chunks takes its inputs split once (one UnbindBackward each), not indexed per chunk: the
    backward of an index fills a zero gradient as large as the whole tensor, once per chunk, which made a GLA
    layer's training step at 16k tokens 29 times as slow (bench/attention.py --mechanisms gla deltanet ssd)."""
    b, h, n, d = 1, 2, 16 * 64, 8
    q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(3))
    decay = (-torch.rand(b, h, n)).requires_grad_()
    out, _ = (chunked_decayed_sum(q, k, v, decay) if op == "decayed_sum"
              else chunked_delta_rule(q, k, v, torch.rand(b, h, n), decay))
    nodes = _backward_nodes(out)
    assert nodes.count("UnbindBackward0") >= 2
    assert nodes.count("SelectBackward0") < 16  # one a chunk (16 chunks here) would be the quadratic loop
