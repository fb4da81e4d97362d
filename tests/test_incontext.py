"""InContextAttention (zoo/attention/incontext.py) against a slow float64 reference written here from its formula.

The reference loops over batch, head, query and key, sums the gates between key and query one by one and
interpolates the query's table by hand: nothing is shared with the layer but its parameters. Beside it:
a 3-token example computed by hand, step-by-step decoding against the parallel forward, bf16, bad input,
gradients, and a task that only a position-aware layer can learn. The layer's three routes (the fused kernel with
the bias inside the attention, the compiled bias mask, the eager bias mask) are each held to the reference and to
one another, forward and backward.
"""

import copy
import logging
import math

import pytest
import timm
import torch
from torch import nn

import zoo.attention as A
from zoo.attention import InContextAttention, InContextState, incontext_kernel, native


def reference(layer, x, key_padding_mask=None, causal=None, extra=None):
    """(outputs (batch, L, dim), bias (batch, heads, L, L)) in float64, one (batch, head, query, key) at a time;
    `extra` (L, L): logits added on top, -inf where a key is forbidden (an attn_mask)."""
    causal = layer.causal if causal is None else causal
    x = x.double()
    b, n, d = x.shape
    h, hd, positions = layer.heads, layer.head_dim, layer.num_positions
    real = torch.ones(b, n, dtype=torch.bool) if key_padding_mask is None else key_padding_mask
    x = x * real[..., None]
    qkv = x @ layer.qkv.weight.double().T + (0 if layer.qkv.bias is None else layer.qkv.bias.double())
    q, k, v = qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]
    gates = torch.sigmoid(x @ layer.gate.weight.detach().double().T + layer.gate.bias.double())  # (b, n, h)
    tables = x @ layer.table.weight.double().T + layer.table.bias.double()  # (b, n, h * positions)
    out = torch.zeros(b, n, d, dtype=torch.float64)
    bias = torch.zeros(b, h, n, n, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            table = tables[bi, :, hi * positions:(hi + 1) * positions]
            sl = slice(hi * hd, (hi + 1) * hd)
            for i in range(n):
                for j in range(n):
                    p = sum(gates[bi, t, hi].item() for t in range(min(i, j), max(i, j) + 1) if real[bi, t])
                    p = min(p, positions - 1)
                    low, high = math.floor(p), min(math.floor(p) + 1, positions - 1)
                    bias[bi, hi, i, j] = (1 - (p - low)) * table[i, low] + (p - low) * table[i, high]
                if not real[bi, i]:
                    continue  # a padded query's output is zero
                keys = [j for j in range(n) if real[bi, j] and (j <= i or not causal)
                        and (extra is None or extra[i, j] > -math.inf)]
                logits = torch.stack([q[bi, i, sl] @ k[bi, j, sl] / math.sqrt(hd) + bias[bi, hi, i, j]
                                      + (0 if extra is None else extra[i, j]) for j in keys])
                weights = torch.softmax(logits, 0)
                out[bi, i, sl] = sum(w * v[bi, j, sl] for w, j in zip(weights, keys))
    y = out @ layer.proj.weight.double().T + (0 if layer.proj.bias is None else layer.proj.bias.double())
    return y * real[..., None], bias


def make(dim=12, heads=3, causal=True, num_positions=6, dtype=torch.float64, seed=0):
    """A layer whose bias matters: random tables (they start at zero), gates spread around 0.5."""
    torch.manual_seed(seed)
    layer = InContextAttention(dim, heads=heads, causal=causal, num_positions=num_positions)
    with torch.no_grad():
        layer.table.weight.normal_(0, 1.0)
        layer.table.bias.normal_(0, 1.0)
        layer.gate.weight.normal_(0, 0.5)
    return layer.to(dtype)


MASK = torch.tensor([[True] * 7, [False, False, True, True, True, True, True], [True, True, False, True, True, True,
                                                                              False]])


# ---- agreement with the formula ------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("padded", [False, True])
def test_matches_float64_reference(causal, heads, padded):
    layer = make(heads=heads, causal=causal)
    x = torch.randn(3, 7, 12, dtype=torch.float64)
    mask = MASK if padded else None
    expected, bias = reference(layer, x, mask)
    torch.testing.assert_close(layer(x, mask), expected, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(layer.position_bias(x, mask), bias, atol=1e-10, rtol=1e-10)


def test_positions_beyond_the_table_share_its_last_entry():
    layer = make(heads=2, causal=False, num_positions=3)  # 7 tokens count up to 7 > 2
    with torch.no_grad():
        layer.gate.bias.fill_(3.0)  # gates near 1: most positions lie beyond the table
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    expected, bias = reference(layer, x)
    assert (layer.positions(x) > 2).any()
    torch.testing.assert_close(layer(x), expected, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(layer.position_bias(x), bias, atol=1e-10, rtol=1e-10)


def test_is_causal_makes_a_bidirectional_layer_causal():
    layer = make(causal=False)
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    expected, _ = reference(layer, x, MASK[:2], causal=True)
    torch.testing.assert_close(layer(x, MASK[:2], is_causal=True), expected, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("kind", ["bool", "float"])
def test_attn_mask_acts_on_top_of_the_bias(kind):
    layer = make(causal=False)
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    allowed = (torch.rand(7, 7) > 0.4) | torch.eye(7, dtype=torch.bool)
    extra = torch.randn(7, 7, dtype=torch.float64) if kind == "float" else torch.zeros(7, 7, dtype=torch.float64)
    extra = extra.masked_fill(~allowed, -math.inf)
    attn_mask = extra if kind == "float" else allowed
    expected, _ = reference(layer, x, extra=extra)
    torch.testing.assert_close(layer(x, attn_mask=attn_mask), expected, atol=1e-10, rtol=1e-10)


def hand_layer(causal: bool, gate_bias: float, num_positions: int = 4) -> InContextAttention:
    """dim 2, one head; B_i[p] = p (x_i0 + 10 x_i1); q = k = 0, so the logits are the bias alone; v = x, W_o = 1."""
    layer = InContextAttention(2, heads=1, causal=causal, num_positions=num_positions).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.zero_()
        layer.gate.bias.fill_(gate_bias)
        layer.table.weight.copy_(torch.tensor([[p, 10.0 * p] for p in range(num_positions)]))
        layer.qkv.weight[4:].copy_(torch.eye(2))
        layer.proj.weight.copy_(torch.eye(2))
    return layer


X = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]], dtype=torch.float64)  # B_i = (0,1,2,3) x 1, 10, 11


@pytest.mark.parametrize("gate_bias,num_positions,expected", [
    # every gate 1 (sigmoid(100) rounds to 1): p_ij = |i - j| + 1 = [[1, 2, 3], [2, 1, 2], [3, 2, 1]]
    (100.0, 4, [[1, 2, 3], [20, 10, 20], [33, 22, 11]]),
    # every gate 1/2: p_ij = (|i - j| + 1) / 2, between the table's entries
    (0.0, 4, [[0.5, 1, 1.5], [10, 5, 10], [16.5, 11, 5.5]]),
    # every gate 1 and a table of 2 entries: p clamped to 1
    (100.0, 2, [[1, 1, 1], [10, 10, 10], [11, 11, 11]]),
])
@pytest.mark.parametrize("causal", [False, True])
def test_a_hand_computed_bias(gate_bias, num_positions, expected, causal):
    layer = hand_layer(causal, gate_bias, num_positions)
    logits = torch.tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(layer.position_bias(X)[0, 0], logits, atol=1e-12, rtol=0)
    if causal:
        logits = logits.masked_fill(torch.ones(3, 3, dtype=torch.bool).triu(1), float("-inf"))
    torch.testing.assert_close(layer(X)[0], torch.softmax(logits, -1) @ X[0], atol=1e-12, rtol=0)


def test_the_same_positions_give_each_query_its_own_choice():
    """Gates at 1 and one table: query 1 (x = (0, 1)) wants its previous token, query 2 (x = (1, 0)) itself."""
    layer = hand_layer(True, 100.0, 3)
    with torch.no_grad():  # B_i = (0, 50 x_i0, 50 x_i1): x0 favours p = 1 (itself), x1 favours p = 2 (previous)
        layer.table.weight.copy_(torch.tensor([[0.0, 0.0], [50.0, 0.0], [0.0, 50.0]]))
    x = torch.tensor([[[3.0, 3.0], [0.0, 1.0], [1.0, 0.0]]], dtype=torch.float64)
    y = layer(x)[0]
    torch.testing.assert_close(y[1], x[0, 0], atol=1e-12, rtol=0)  # the previous token
    torch.testing.assert_close(y[2], x[0, 2], atol=1e-12, rtol=0)  # itself


# ---- decoding ------------------------------------------------------------------------------------


@pytest.mark.parametrize("first", [1, 5])
def test_step_by_step_equals_the_parallel_forward(first):
    layer = make(dim=16, heads=2, dtype=torch.float32)
    x = torch.randn(2, 20, 16)
    expected = layer(x)
    outs, state = [], None
    out, state = layer.step(x[:, :first], state)
    outs.append(out)
    for t in range(first, 20):
        out, state = layer.step(x[:, t:t + 1], state)
        outs.append(out)
    assert isinstance(state, InContextState) and state.keys.shape == (2, 2, 20, 8)
    assert (torch.cat(outs, 1) - expected).abs().max() < 1e-5
    # the running sum is the count of every gate seen
    torch.testing.assert_close(state.total, layer.positions(x)[:, :, -1, 0], atol=1e-5, rtol=0)


def test_step_with_a_left_padded_prompt_equals_the_forward():
    layer = make(dim=16, heads=2, dtype=torch.float32)
    x = torch.randn(2, 12, 16)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, :3] = False  # the second prompt is 3 tokens shorter
    expected = layer(x, mask)
    out, state = layer.step(x[:, :6], key_padding_mask=mask[:, :6])
    outs = [out]
    for t in range(6, 12):
        out, state = layer.step(x[:, t:t + 1], state)
        outs.append(out)
    assert (torch.cat(outs, 1) - expected).abs().max() < 1e-5


# ---- precision, gradients ------------------------------------------------------------------------


def test_bf16_inputs_agree_with_the_float64_reference():
    layer = make(dim=16, heads=2, causal=True, dtype=torch.bfloat16)
    x = torch.randn(2, 10, 16, dtype=torch.bfloat16)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[0, 7:] = False
    expected, bias = reference(layer, x, mask)
    y = layer(x, mask)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), expected, atol=5e-2, rtol=5e-2)
    # the gates, counts and tables run in float32: a bf16 count would be off by up to 1/32 of a position
    got = layer.position_bias(x, mask)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), bias, atol=1e-4, rtol=1e-5)
    out, _ = layer.step(x, key_padding_mask=mask)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_gradients_reach_the_gates_and_the_tables():
    layer = make(dim=4, heads=2, causal=True, dtype=torch.float64)
    x = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    (layer(x, MASK[:2, :5]) ** 2).sum().backward()
    for p in (layer.gate.weight, layer.gate.bias, layer.table.weight, layer.table.bias):
        assert p.grad is not None and p.grad.abs().max() > 1e-6
    # and they are the derivatives: the gates enter only through the interpolation weights
    x = x.detach().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: layer(t, MASK[:2, :5]), (x,))


def test_a_new_layer_is_softmax_attention():
    """The tables start at zero, so the bias is zero until they learn (and swapping in starts where softmax was)."""
    torch.manual_seed(0)
    layer = InContextAttention(8, heads=2, causal=True).double()
    softmax = A.SoftmaxAttention(8, heads=2, causal=True).double()
    softmax.load_state_dict({k: v for k, v in layer.state_dict().items() if k.split(".")[0] in ("qkv", "proj")})
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    torch.testing.assert_close(layer(x), softmax(x), atol=1e-12, rtol=0)


def test_previous_token_copying_needs_the_positions():
    """Target at i: the token at i - 1. Content alone cannot say which earlier token came last (a causal layer
    sees its prefix as a set), so the same layer with its tables frozen at zero stays far below.
    Measured over 10 seeds: 100% with positions (99.7% already after 50 steps), 38-39% without."""

    def accuracy(learn_positions: bool) -> float:
        torch.manual_seed(0)
        vocab, dim, length = 8, 16, 16
        embed, layer = nn.Embedding(vocab, dim), InContextAttention(dim, causal=True)
        head = nn.Linear(dim, vocab)
        layer.table.requires_grad_(learn_positions)
        params = [p for m in (embed, layer, head) for p in m.parameters() if p.requires_grad]
        optimizer = torch.optim.Adam(params, lr=1e-2)
        for _ in range(150):
            tokens = torch.randint(vocab, (16, length))
            logits = head(layer(embed(tokens)))[:, 1:]
            loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, :-1].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        tokens = torch.randint(vocab, (256, length))
        with torch.no_grad():
            guess = head(layer(embed(tokens)))[:, 1:].argmax(-1)
        return (guess == tokens[:, :-1]).float().mean().item()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: a second thread only waits on a shared machine
    try:
        assert accuracy(True) > 0.95
        assert accuracy(False) < 0.5
    finally:
        torch.set_num_threads(threads)


# ---- the compiled bias (csrc/incontext_bias.cpp) ---------------------------------------------------


def needs_kernels():
    if native.load() is None:
        pytest.skip("the compiled kernels could not be built here")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("gate_bias", [0.0, 3.0])  # 3: most counts lie beyond the table's last entry
def test_the_compiled_bias_matches_the_float64_reference(causal, padded, gate_bias):
    """float32 on the CPU takes the kernel; the reference is the float64 loop above."""
    needs_kernels()
    layer = make(heads=3, causal=causal)
    with torch.no_grad():
        layer.gate.bias.fill_(gate_bias)
    x = torch.randn(3, 7, 12, dtype=torch.float64)
    mask = MASK if padded else None
    expected, bias = reference(layer, x, mask)
    layer = layer.float()
    torch.testing.assert_close(layer(x.float(), mask).double(), expected, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(layer.position_bias(x.float(), mask).double(), bias, atol=2e-5, rtol=1e-5)


def test_the_mini_step_bench_times_each_route_it_names_in_bf16(monkeypatch):
    """bench/incontext_bias.py --mini: the "fused" column runs the fused operator on bf16 activations and the
    "bias mask" column the bias kernel; a column that timed another route than its name would mislead."""
    needs_kernels()
    needs_fused()
    from bench import incontext_bias

    seen = []
    for name in ("incontext_attention", "incontext_bias"):
        module = incontext_kernel if name == "incontext_attention" else native
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, name=name: seen.append((name, a[0].dtype)) or real(*a))
    modes = []  # each step's bf16 flag
    real_step = incontext_bias.step
    monkeypatch.setattr(incontext_bias, "step", lambda model, tokens, bf16=False: modes.append(bf16)
                        or real_step(model, tokens, bf16))
    row = incontext_bias.measure_mini("tiny", 2, 16)
    assert modes == [True, True, True]  # every step under the bf16 autocast
    # the fused kernel, on q widened to float32; the bias kernel (its sums are float32 in every dtype)
    assert {name for name, _ in seen} == {"incontext_attention", "incontext_bias"}
    assert {dtype for name, dtype in seen if name == "incontext_attention"} == {torch.float32}
    # times and ratios only exist and are positive: at 16 tokens the rounded milliseconds say nothing of the ratio
    assert all(row[key] > 0 for key in ("gpt-mini s", "fused s", "bias mask s", "fused x gpt-mini",
                                         "bias mask x gpt-mini", "bias mask x fused"))


def test_the_step_profile_names_the_bias_kernels_forward_and_backward():
    """bench/incontext_bias.py --profile labels the forward kernels, which torch.profiler files under their autograd
    wrappers' names: if PyTorch renames that, the label would silently vanish from the table. The fused kernel
    (incontext_kernel.py) runs the step; the bias-mask route runs it as "incontext-gpt-tiny (bias mask)"."""
    needs_kernels()
    needs_fused()
    from bench import incontext_bias

    rows = incontext_bias.profile("tiny", 2, 16, top=100)
    models = ("gpt-tiny", "incontext-gpt-tiny", "incontext-gpt-tiny (bias mask)")
    ops = {m: {r["operator"] for r in rows if r["model"] == m} for m in models}
    assert {"zoo::incontext_bias (the forward)", "zoo::incontext_bias_backward"} <= ops[models[2]]
    assert {"zoo::incontext_attention (the forward)", "zoo::incontext_attention_backward"} <= ops[models[1]]
    assert not any("incontext_bias" in op for op in ops[models[1]])
    assert not any("incontext" in op for op in ops["gpt-tiny"])
    for model in ops:  # the largest first, each a share of the step
        shares = [r["share"] for r in rows if r["model"] == model]
        assert shares == sorted(shares, reverse=True) and 0 < shares[0] <= 1


def long_rows(keys, queries, positions):
    """Gate sums (ends at every key, starts) of 2 x 3 heads whose counts cross integers and the table's end,
    one padded token (its own count exactly 0), and tables for the last `queries` keys."""
    torch.manual_seed(0)
    gates = torch.rand(2, 3, keys) * 2
    gates[0, 1, 10] = 0
    ends = gates.cumsum(-1)
    return ends, ends - gates, torch.randn(2, 3, queries, positions)


@pytest.mark.parametrize("causal,queries", [(True, 53), (True, 20), (False, 53)])
@pytest.mark.parametrize("positions", [1, 5, 64])
def test_the_compiled_bias_matches_its_formula_on_long_rows(causal, queries, positions):
    """Rows longer than a vector (the kernel's vectorized loop and its tail) against the formula in float64:
    p_ij = clamp(c_i - c_{j-1}, 0, P - 1) (c_j - c_{i-1} for a later key), lerp between floor p and the next
    entry; queries at the end of 53 keys; causal: -inf at later keys."""
    needs_kernels()
    keys = 53
    ends, starts, tables = long_rows(keys, queries, positions)
    got = native.incontext_bias(ends[..., keys - queries:], starts, tables, causal).double()
    c, s, t = ends.double(), starts.double(), tables.double()
    for i in range(queries):
        row = keys - queries + i  # the query's own key
        for j in range(keys):
            if j > row and causal:
                assert (got[..., i, j] == -math.inf).all()
                continue
            count = c[..., row] - s[..., j] if j <= row else c[..., j] - s[..., row]
            p = count.clamp(0, positions - 1)
            low = p.floor()
            high = (low + 1).clamp(max=positions - 1)
            want = (t[..., i, :].gather(-1, low.long()[..., None]) * (1 - (p - low))[..., None]
                    + t[..., i, :].gather(-1, high.long()[..., None]) * (p - low)[..., None])[..., 0]
            torch.testing.assert_close(got[..., i, j], want, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("causal,queries", [(True, 53), (True, 20), (False, 53)])
@pytest.mark.parametrize("positions", [1, 5, 64])
def test_the_compiled_bias_backward_matches_its_formula_on_long_rows(causal, queries, positions):
    """The backward on rows longer than a vector, where many keys share a table entry, against autograd
    through the formula in float64. The counts are the kernel's own float32 differences, so that both sides
    take the same floor; d count / d ends = 1 and d count / d starts = -1 are summed here by hand;
    torch.clamp's gradient is 0 on the clamps, as the kernel's is."""
    needs_kernels()
    keys = 53
    ends, starts, tables = long_rows(keys, queries, positions)
    ends = ends[..., keys - queries:]
    upstream = torch.randn(2, 3, queries, keys)
    inputs = [t.clone().requires_grad_() for t in (ends, starts, tables)]
    got = torch.autograd.grad(native.incontext_bias(*inputs, causal), inputs, upstream)

    rows = torch.arange(keys - queries, keys)[:, None]  # each query's own key
    behind = torch.arange(keys)[None, :] <= rows
    later = ~behind if not causal else torch.zeros_like(behind)
    counts = ends[..., :, None] - starts[..., None, :]  # c_i - c_{j-1}
    if not causal:  # a later key (queries = keys): the gates from the query to the key, c_j - c_{i-1}
        counts = torch.where(later, counts.mT, counts)
    counts = counts.double().requires_grad_()
    table64 = tables.double().requires_grad_()
    p = counts.clamp(0, positions - 1)
    low = p.detach().floor().long()
    high = (low + 1).clamp(max=positions - 1)
    weight = p - low
    bias = table64.gather(-1, low) * (1 - weight) + table64.gather(-1, high) * weight
    used = (behind | later).double()
    g_counts, g_tables = torch.autograd.grad(bias, (counts, table64), upstream.double() * used)
    g_ends = (g_counts * behind).sum(-1)
    g_starts = -(g_counts * behind).sum(-2)
    if not causal:
        g_ends = g_ends + (g_counts * later).sum(-2)
        g_starts = g_starts - (g_counts * later).sum(-1)
    for name, a, b in zip(["ends", "starts", "tables"], got, [g_ends, g_starts, g_tables]):
        torch.testing.assert_close(a.double(), b, atol=1e-4, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    assert positions == 1 or g_ends.abs().max() > 0.1  # the counts carry a gradient where the table has a slope


@pytest.mark.parametrize("causal", [True, False])
def test_the_compiled_bias_has_the_eager_routes_gradients(causal):
    """The kernel's backward against autograd through the eager route, for the input and every parameter,
    with padding (a padded token's own count is exactly 0, where torch.clamp's gradient is 0)."""
    needs_kernels()
    layer = make(dim=16, heads=2, causal=causal, num_positions=6, dtype=torch.float32)
    x = torch.randn(3, 40, 16)  # longer than a vector: the kernel's vectorized loop runs
    target = torch.randn(3, 40, 16)
    mask = torch.ones(3, 40, dtype=torch.bool)
    mask[1, :9] = mask[2, 30:] = mask[2, 4] = False

    def gradients():
        inputs = x.clone().requires_grad_()
        layer.zero_grad()
        ((layer(inputs, mask) - target) ** 2).sum().backward()
        return [inputs.grad] + [p.grad.clone() for p in layer.parameters()]

    fast = gradients()
    with native.eager_routes():
        eager = gradients()
    for got, want in zip(fast, eager):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert layer.gate.weight.grad.abs().max() > 1e-3  # the counts do carry a gradient


def test_the_compiled_bias_decodes_as_the_eager_route():
    """`step` with a cache (queries at the end of the keys, the later keys masked) on both routes."""
    needs_kernels()
    layer = make(dim=16, heads=2, dtype=torch.float32)
    x = torch.randn(2, 9, 16)
    out, state = layer.step(x[:, :4])
    fast = [out, layer.step(x[:, 4:], state)[0]]
    with native.eager_routes():
        out, state = layer.step(x[:, :4])
        eager = [out, layer.step(x[:, 4:], state)[0]]
    for got, want in zip(fast, eager):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# ---- the fused kernel (csrc/incontext_attention.cpp): the bias inside the attention, never L x L ----------


def needs_fused():
    if incontext_kernel.load() is None:
        pytest.skip("the fused in-context attention kernel could not be built here")


def fused_calls(monkeypatch) -> list:
    """A list that grows by one at each call of the fused operator."""
    calls = []
    real = incontext_kernel.incontext_attention
    monkeypatch.setattr(incontext_kernel, "incontext_attention", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("gate_bias", [0.0, 3.0])  # 3: most counts lie beyond the table's last entry
@pytest.mark.parametrize("heads", [1, 3])
def test_the_fused_kernel_matches_the_float64_reference(gate_bias, heads, causal, monkeypatch):
    """A float32 layer with no padding takes the fused kernel; forward and every gradient (input, q, k, v
    through W_qkv, the gates' and the tables' weights) against the float64 layer, whose route the loop reference
    above holds (test_matches_float64_reference), and its forward against the loop reference itself."""
    needs_fused()
    calls = fused_calls(monkeypatch)
    layer64 = make(heads=heads, causal=causal)
    with torch.no_grad():
        layer64.gate.bias.fill_(gate_bias)
    x = torch.randn(3, 7, 12, dtype=torch.float64)
    expected, _ = reference(layer64, x)
    layer32 = copy.deepcopy(layer64).float()
    got = layer32(x.float())
    assert calls, "the fused kernel did not run"
    torch.testing.assert_close(got.double(), expected, atol=2e-5, rtol=1e-5)
    target = torch.randn(3, 7, 12, dtype=torch.float64)
    grads = []
    for layer, dtype in ((layer64, torch.float64), (layer32, torch.float32)):
        inputs = x.detach().to(dtype).clone().requires_grad_()
        ((layer(inputs) - target.to(dtype)) ** 2).sum().backward()
        grads.append([inputs.grad] + [p.grad for p in layer.parameters()])
    for want, got in zip(*grads):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)
    assert layer32.gate.weight.grad.abs().max() > 1e-3 or gate_bias  # the counts carry a gradient


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("length,num_positions", [(150, 64), (150, 5), (300, 1), (70, 200)])
def test_the_fused_kernel_equals_the_bias_mask_route_on_long_rows(length, num_positions, causal, monkeypatch):
    """Rows longer than the kernel's blocks (64 queries, 128 keys) and vectors, tables short enough that whole
    vectors of keys lie beyond them (their shortcut) and long enough that none do: forward and gradients against
    the bias-mask route (csrc/incontext_bias.cpp and SDPA) in float32."""
    needs_fused()
    calls = fused_calls(monkeypatch)
    layer = make(dim=16, heads=2, causal=causal, num_positions=num_positions, dtype=torch.float32)
    x = torch.randn(2, length, 16)
    target = torch.randn(2, length, 16)

    def run():
        inputs = x.clone().requires_grad_()
        layer.zero_grad()
        y = layer(inputs)
        ((y - target) ** 2).sum().backward()
        return [y, inputs.grad] + [p.grad.clone() for p in layer.parameters()]

    fused = run()
    assert calls
    with incontext_kernel.disabled():
        mask_route = run()
    assert len(calls) == 1
    for got, want in zip(fused, mask_route):
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-3)


@pytest.mark.parametrize("causal", [True, False])
def test_the_fused_kernel_gradients_are_the_derivatives(causal):
    """gradcheck of the operator itself in float32 is too coarse: its backward against autograd through the same
    formula in float64 on inputs whose counts cross integers, the table's end and 0 (a padded token's gate)."""
    needs_fused()
    torch.manual_seed(0)
    b, h, n, d, p = 2, 2, 140, 8, 6
    gates = torch.rand(b, h, n, dtype=torch.float64) * 2
    gates[0, 1, 10] = 0
    ends = gates.cumsum(-1)
    inputs = [torch.randn(b, h, n, d, dtype=torch.float64) for _ in range(3)] + [ends, ends - gates,
                                                                                torch.randn(b, h, n, p).double()]
    inputs64 = [t.clone().requires_grad_() for t in inputs]
    inputs32 = [t.float().requires_grad_() for t in inputs]
    q, k, v, c, s, t = inputs64
    counts = c[..., :, None] - s[..., None, :]  # c_i - c_{j-1}; a later key's, c_j - c_{i-1}, is its transpose
    later = torch.ones(n, n, dtype=torch.bool).triu(1)
    counts = torch.where(later, counts.mT, counts).clamp(0, p - 1)
    low = counts.detach().floor().long()
    high = (low + 1).clamp(max=p - 1)
    weight = counts - low
    logits = q @ k.mT / d**0.5 + t.gather(-1, low) * (1 - weight) + t.gather(-1, high) * weight
    logits = logits.masked_fill(later, -math.inf) if causal else logits
    want = logits.softmax(-1) @ v
    upstream = torch.randn_like(want)
    want.backward(upstream)
    got, lse = incontext_kernel.incontext_attention(*inputs32, d**-0.5, causal)
    got.backward(upstream.float())
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(lse.double(), logits.logsumexp(-1), atol=1e-4, rtol=1e-5)
    for name, a, w in zip("q k v ends starts tables".split(), inputs32, inputs64):
        torch.testing.assert_close(a.grad.double(), w.grad, atol=1e-3, rtol=1e-4,
                                   msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("causal", [True, False])
def test_the_fused_operator_passes_opcheck(causal):
    needs_fused()
    torch.manual_seed(0)
    gates = torch.rand(2, 2, 20)
    ends = gates.cumsum(-1)
    args = [torch.randn(2, 2, 20, 8) for _ in range(3)] + [ends, ends - gates, torch.randn(2, 2, 20, 5)]
    torch.library.opcheck(incontext_kernel.incontext_attention,
                          (*(a.requires_grad_() for a in args), 8**-0.5, causal))


@pytest.mark.parametrize("kwargs", [{"key_padding_mask": MASK[:2]}, {"attn_mask": torch.ones(7, 7, dtype=torch.bool)},
                                    {"dropout": 0.1}])
def test_what_the_fused_kernel_does_not_take_goes_the_bias_mask_way(kwargs, monkeypatch):
    needs_fused()
    calls = fused_calls(monkeypatch)
    kwargs = dict(kwargs)
    mask, attn_mask = kwargs.pop("key_padding_mask", None), kwargs.pop("attn_mask", None)
    dtype, dropout = kwargs.pop("dtype", torch.float32), kwargs.pop("dropout", 0.0)
    layer = make(dim=12, heads=3, dtype=dtype, **kwargs)
    layer.dropout = dropout
    layer(torch.randn(2, 7, 12, dtype=dtype), mask, attn_mask=attn_mask)
    assert not calls
    with native.eager_routes():
        make(dim=12, heads=3, dtype=torch.float32)(torch.randn(2, 7, 12))
    assert not calls
    layer.eval()
    if dropout:  # dropout acts in training only
        layer(torch.randn(2, 7, 12, dtype=dtype))
        assert calls


@pytest.mark.parametrize("causal", [True, False])
def test_half_precision_takes_the_fused_kernel_in_float32_and_matches_the_float64_reference(causal, monkeypatch):
    """bf16 autocast (precision "auto" on an AMX CPU) makes q, k, v bf16 from float32 tokens, and a bf16 or fp16
    layer makes them so itself: the fused kernel takes them widened to float32 (it once sent them to the bias-mask
    route, 4.4x slower at 4 x 2,048 tokens). Forward and gradients land where the layer's own dtype allows: near the
    float64 formula, in the inputs' dtype."""
    needs_fused()
    calls = fused_calls(monkeypatch)
    torch.manual_seed(0)
    layer = make(dim=16, heads=2, causal=causal, dtype=torch.float32)
    x = torch.randn(2, 9, 16)
    expected, _ = reference(layer, x.double())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert calls == [1] and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), expected, atol=3e-2, rtol=3e-2)  # bf16's q, k, v and projections
    for dtype in (torch.bfloat16, torch.float16):
        half = make(dim=16, heads=2, causal=causal, dtype=dtype)
        half.load_state_dict(layer.state_dict())
        xh = x.to(dtype).requires_grad_()
        before = len(calls)
        yh = half(xh)
        assert len(calls) == before + 1 and yh.dtype == dtype
        torch.testing.assert_close(yh.double(), expected, atol=3e-2, rtol=3e-2)
        yh.square().sum().backward()
        assert xh.grad.dtype == dtype and half.table.weight.grad.dtype == dtype
        with incontext_kernel.disabled():  # the bias-mask route's gradient in the same dtype
            xm = x.to(dtype).requires_grad_()
            half(xm).square().sum().backward()
        torch.testing.assert_close(xh.grad.double(), xm.grad.double(), atol=0.1, rtol=0.1)


def test_the_fused_kernel_under_inference_mode(monkeypatch):
    """inference_mode runs the fused operator without autograd."""
    needs_fused()
    calls = fused_calls(monkeypatch)
    layer = make(dim=16, heads=2, dtype=torch.float32)
    x = torch.randn(2, 9, 16)
    with torch.inference_mode():
        y = layer(x)
    assert calls
    with incontext_kernel.disabled(), torch.inference_mode():
        torch.testing.assert_close(y, layer(x), atol=1e-5, rtol=1e-5)


def test_the_fused_kernel_compiles_fullgraph_and_exports_as_one_operator():
    needs_fused()
    layer = make(dim=16, heads=2, dtype=torch.float32)
    x = torch.randn(2, 9, 16)
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), layer(x), atol=1e-6, rtol=1e-6)
    ops = {str(n.target) for n in torch.export.export(layer, (x,)).graph.nodes}
    assert "zoo.incontext_attention.default" in ops and "zoo.incontext_bias.default" not in ops


# ---- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,error,words", [
    ({"num_positions": 0}, ValueError, "num_positions must be between 1"),
    ({"num_positions": 2.5}, TypeError, "num_positions must be an integer, got 2.5"),
    ({"num_positions": True}, TypeError, "num_positions must be an integer"),
    ({"heads": 5}, ValueError, "dim divisible by heads, got dim=8, heads=5"),
    ({"causal": "yes"}, TypeError, "causal must be true or false"),
    ({"dropout": 1.0}, ValueError, "dropout must be a finite number in [0.0, 1.0)"),
])
def test_bad_arguments_are_refused(kwargs, error, words):
    with pytest.raises(error, match=r"InContextAttention .*" + words.replace("[", r"\[").replace("(", r"\(")
                       .replace(")", r"\)").replace(".", r"\.")):
        InContextAttention(8, **{"heads": 2, **kwargs})


@pytest.mark.parametrize("x,mask,words", [
    (torch.randn(6, 8), None, r"expects input of shape \(batch, length, 8\), got \(6, 8\)"),
    (torch.randn(2, 6, 4), None, r"expects input of shape \(batch, length, 8\), got \(2, 6, 4\)"),
    (torch.randn(2, 6, 8), torch.ones(2, 5, dtype=torch.bool), r"expects key_padding_mask of shape \(2, 6\)"),
    (torch.randn(2, 6, 8), torch.ones(2, 6), "expects a boolean key_padding_mask"),
    (torch.ones(2, 6, 8, dtype=torch.long), None, "expects a floating-point input, got dtype torch.int64"),
])
def test_bad_inputs_are_refused(x, mask, words):
    layer = InContextAttention(8, heads=2, causal=True)
    for call in (lambda: layer(x, mask), lambda: layer.step(x, None, mask), lambda: layer.position_bias(x, mask)):
        with pytest.raises(ValueError, match="InContextAttention " + words):
            call()


def test_bad_attn_mask_and_states_are_refused():
    layer = InContextAttention(8, heads=2, causal=True)
    x = torch.randn(2, 6, 8)
    with pytest.raises(ValueError, match=r"attn_mask of shape \(6, 6\)"):
        layer(x, attn_mask=torch.ones(5, 5, dtype=torch.bool))
    _, state = layer.step(x)
    with pytest.raises(TypeError, match="InContextAttention.step expects state=None or the InContextState"):
        layer.step(x[:, :1], A.KVCache(state.keys, state.values))
    with pytest.raises(ValueError, match=r"state.keys must have shape \(3, 2, 'any', 4\).*got \(2, 2, 6, 4\)"):
        layer.step(torch.randn(3, 1, 8), state)
    short = InContextState(state.keys, state.values, state.starts[..., :4], state.total)
    with pytest.raises(ValueError, match="must cover one number of tokens"):
        layer.step(x[:, :1], short)
    with pytest.raises(ValueError, match=r"state.total must be torch.float32"):
        layer.step(x[:, :1], InContextState(state.keys, state.values, state.starts, state.total.double()))
    with pytest.raises(RuntimeError, match="needs causal=True"):
        InContextAttention(8, heads=2).step(x)


def test_registered_by_name():
    layer = A.build("incontext", 8, heads=2, causal=True, num_positions=5)
    assert isinstance(layer, InContextAttention) and layer.num_positions == 5
    assert A.MIXERS["incontext"] is InContextAttention


def test_swap_keeps_q_k_v_and_starts_where_the_old_layer_was(caplog):
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, num_classes=5,
                            depth=2).eval()
    images = torch.randn(2, 3, 32, 32)
    with caplog.at_level(logging.INFO, logger="zoo.attention.swapping"):
        swapped = A.swap(copy.deepcopy(vit), "incontext", num_positions=8)
    assert "blocks.0.attn: Attention -> incontext, kept q, k, v and the output projection" in caplog.text
    with torch.no_grad():
        torch.testing.assert_close(swapped(images), vit(images), rtol=0, atol=1e-5)  # tables at zero
        swapped.blocks[0].attn.attn.table.weight.normal_()
        assert (swapped(images) - vit(images)).abs().max() > 1e-3
        back = A.swap(swapped, "softmax")  # and back: q, k, v and the projection come with it
        torch.testing.assert_close(back(images), vit(images), rtol=0, atol=1e-5)


def test_swap_into_a_transformer_encoder_with_padding():
    torch.manual_seed(0)
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True), 2,
                                    enable_nested_tensor=False).eval()
    x = torch.randn(2, 5, 16)
    padding = torch.tensor([[False] * 5, [False, False, False, True, True]])  # PyTorch's: True = padding
    swapped = A.swap(copy.deepcopy(encoder), "incontext")
    with torch.no_grad():
        expected, got = encoder(x, src_key_padding_mask=padding), swapped(x, src_key_padding_mask=padding)
    torch.testing.assert_close(got[~padding], expected[~padding], rtol=0, atol=1e-5)


def test_swap_from_a_learned_bias_says_it_is_dropped(caplog):
    layer = A.SoftmaxAttention(8, heads=2, causal=True, max_len=10, learned_bias=True)
    with pytest.raises(ValueError, match=r"its learned bias \(incontext has no learned bias\).*strict=False"):
        A.swap(layer, "incontext")
    with caplog.at_level(logging.INFO, logger="zoo.attention.swapping"):
        with pytest.warns(UserWarning, match="learned bias"):
            new = A.swap(layer, "incontext", strict=False)
    assert isinstance(new, InContextAttention) and new.causal and new.heads == 2
    assert "kept q, k, v and the output projection; dropped its learned bias" in caplog.text
    assert torch.equal(new.qkv.weight, layer.qkv.weight)


def test_viz_captures_the_weights_that_make_the_output_and_pictures_the_bias():
    import zoo
    import zoo.viz as V
    from zoo.viz import capture

    torch.manual_seed(0)
    model = zoo.create("incontext-gpt-tiny", depth=1).eval()
    layer = model.blocks[0].attn
    for weight in (p for p in layer.parameters() if p.dim() > 1):  # tables off their zero start: a visible bias
        torch.nn.init.normal_(weight, std=0.3)
    x = torch.randint(0, model.vocab_size, (1, 10))
    seen = {}
    layer.register_forward_hook(lambda mod, args, out: seen.update(x=args[0], y=out))
    with capture(model) as maps:
        model(x)
    (m,) = maps
    _, _, v = layer._split_heads(seen["x"])
    mixed = (m.weights.to(v.dtype) @ v).transpose(1, 2).reshape(1, 10, -1)  # the heads' outputs, side by side
    torch.testing.assert_close(layer.proj(mixed), seen["y"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(m.extra["bias"], layer.position_bias(seen["x"]))
    assert m.extra["bias"].abs().max() > 0.1  # the bias is there to be seen
    pictures = V.pictures(model, x)
    assert pictures["incontext_bias"][1]["bias"].shape == (1, layer.heads, 10, 10)
