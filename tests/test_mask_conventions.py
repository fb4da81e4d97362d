"""Masks mean what they mean in PyTorch: a grid of masks through zoo's layers, swap's adapters and `attend`,
each held against nn.MultiheadAttention or F.scaled_dot_product_attention on the same weights, in float64.

The conventions: zoo's key_padding_mask is True for a real token (nn.MultiheadAttention's is True for padding);
a boolean attn_mask is True where a query may attend for zoo, timm and F.scaled_dot_product_attention, and True
where it may not for nn.MultiheadAttention; a float attn_mask is added to the logits everywhere. A row that no
key is left to is what F.scaled_dot_product_attention and nn.MultiheadAttention's documented path give it
(zeros before the output projection; the module's inference fast path, taken under no_grad in eval mode, gives
NaN there, so the references here run with autograd on). zoo's layers give zeros at padded queries, and PyTorch
something there that no one reads: real queries are compared.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from zoo.attention import MultiheadAdapter, attend, build, swap

B, L, DIM, HEADS = 3, 6, 16, 2


def _allowed(seed: int) -> torch.Tensor:
    """A random (L, L) pattern of allowed keys that forbids some queries' own keys."""
    allowed = torch.rand(L, L, generator=torch.Generator().manual_seed(seed)) > 0.4
    allowed[0, 0], allowed[2, 2], allowed[4, 4] = False, False, False  # real queries that may not see themselves
    allowed[2, 1], allowed[4, 0] = True, True  # ... but see another key
    return allowed


def _real() -> torch.Tensor:
    """zoo's key_padding_mask, (B, L), True = real: one full row, one padded at the end, one at the start."""
    real = torch.ones(B, L, dtype=torch.bool)
    real[1, 4:] = False
    real[2, :2] = False
    return real


def _case(name: str) -> dict:
    """The masks of one grid case: `allowed` (bool, True = may attend) or `additive` (float) or neither,
    `real` (True = real token) or None, and `causal`."""
    allowed = _allowed(0)
    additive = torch.randn(L, L, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    additive = additive.masked_fill(~allowed, float("-inf"))
    forbids_row = _allowed(2)
    forbids_row[3] = False  # query 3 may attend to nothing
    per_head = torch.rand(B, HEADS, L, L, generator=torch.Generator().manual_seed(3)) > 0.4
    cases = {
        "none": {},
        "bool attn_mask": {"allowed": allowed},
        "float attn_mask": {"additive": additive},
        "per-batch, per-head bool attn_mask": {"allowed": per_head},
        "key_padding_mask": {"real": _real()},
        "bool attn_mask forbidding the diagonal, with key_padding_mask": {"allowed": allowed, "real": _real()},
        "float attn_mask with key_padding_mask": {"additive": additive, "real": _real()},
        "attn_mask forbidding a whole row": {"allowed": forbids_row},
        "attn_mask forbidding a whole row, with key_padding_mask": {"allowed": forbids_row, "real": _real()},
        "causal": {"causal": True},
        "causal with key_padding_mask": {"causal": True, "real": _real()},
        "causal with a bool attn_mask": {"causal": True, "allowed": allowed},
        "causal with a float attn_mask and key_padding_mask": {"causal": True, "additive": additive, "real": _real()},
    }
    return {"allowed": None, "additive": None, "real": None, "causal": False, **cases[name]}


CASES = ["none", "bool attn_mask", "float attn_mask", "per-batch, per-head bool attn_mask", "key_padding_mask",
         "bool attn_mask forbidding the diagonal, with key_padding_mask", "float attn_mask with key_padding_mask",
         "attn_mask forbidding a whole row", "attn_mask forbidding a whole row, with key_padding_mask", "causal",
         "causal with key_padding_mask", "causal with a bool attn_mask",
         "causal with a float attn_mask and key_padding_mask"]


def _sdpa_mask(case: dict) -> torch.Tensor | None:
    """The case's masks as one F.scaled_dot_product_attention attn_mask (B or 1, H or 1, L, L): float, -inf where
    a key is forbidden, or None where nothing is."""
    mask = torch.zeros(1, 1, L, L, dtype=torch.float64)
    if case["allowed"] is not None:
        mask = mask.masked_fill(~case["allowed"].expand(1, 1, L, L) if case["allowed"].dim() == 2
                                else ~case["allowed"], float("-inf"))
    if case["additive"] is not None:
        mask = mask + case["additive"]
    if case["real"] is not None:
        mask = mask.masked_fill(~case["real"][:, None, None, :], float("-inf"))
    if case["causal"]:
        mask = mask.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    return mask


def _mha_masks(case: dict) -> dict:
    """The case's masks in nn.MultiheadAttention's convention (True = may NOT attend; True = padding), the
    causal mask given as a mask (its is_causal is only a hint)."""
    kwargs = {}
    attn_mask = case["allowed"] if case["allowed"] is not None else case["additive"]
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = ~attn_mask
        if attn_mask.dim() == 4:  # (B, H, L, L) is (B * H, L, L) to PyTorch
            attn_mask = attn_mask.reshape(B * HEADS, L, L)
    if case["causal"]:
        future = ~torch.ones(L, L, dtype=torch.bool).tril()
        if attn_mask is None:
            attn_mask = future
        elif attn_mask.dtype == torch.bool:
            attn_mask = attn_mask | future
        else:
            attn_mask = attn_mask.masked_fill(future, float("-inf"))
    if attn_mask is not None:
        kwargs["attn_mask"] = attn_mask
    if case["real"] is not None:
        kwargs["key_padding_mask"] = ~case["real"]
    return kwargs


def _zoo_masks(case: dict) -> dict:
    """The case's masks as zoo's layers take them."""
    kwargs = {"key_padding_mask": case["real"], "is_causal": case["causal"]}
    attn_mask = case["allowed"] if case["allowed"] is not None else case["additive"]
    if attn_mask is not None:
        kwargs["attn_mask"] = attn_mask
    return kwargs


def _real_rows(case: dict) -> torch.Tensor:
    return torch.ones(B, L, dtype=torch.bool) if case["real"] is None else case["real"]


def _mha(quiet: bool) -> nn.MultiheadAttention:
    return nn.MultiheadAttention(DIM, HEADS, batch_first=True, add_zero_attn=quiet).double().eval()


def _zoo_layer_like(mha: nn.MultiheadAttention, mechanism: str) -> nn.Module:
    layer = build(mechanism, DIM, heads=HEADS).double().eval()
    with torch.no_grad():
        layer.qkv.weight.copy_(mha.in_proj_weight)
        layer.qkv.bias.copy_(mha.in_proj_bias)
        layer.proj.weight.copy_(mha.out_proj.weight)
        layer.proj.bias.copy_(mha.out_proj.bias)
    return layer


def _tokens() -> torch.Tensor:
    return torch.randn(B, L, DIM, generator=torch.Generator().manual_seed(4), dtype=torch.float64)


@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("mechanism", ["softmax", "quiet"])
def test_zoo_layer_matches_nn_multihead_attention(mechanism, case_name):
    """SoftmaxAttention against nn.MultiheadAttention, QuietAttention against it with add_zero_attn=True
    (a key and a value of zeros: softmax_one's 1 in the denominator)."""
    case = _case(case_name)
    torch.manual_seed(0)
    mha = _mha(quiet=mechanism == "quiet")
    nn.init.normal_(mha.out_proj.bias)
    layer = _zoo_layer_like(mha, mechanism)
    x = _tokens()
    expected = mha(x, x, x, need_weights=False, **_mha_masks(case))[0].detach()
    got = layer(x, **_zoo_masks(case)).detach()
    rows = _real_rows(case)
    torch.testing.assert_close(got[rows], expected[rows], rtol=1e-10, atol=1e-10)
    assert not got[~rows].any(), "padded queries give zeros"


@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("mechanism", ["softmax", "quiet"])
def test_swapped_multihead_attention_matches_the_original(mechanism, batch_first, case_name):
    """swap's MultiheadAdapter takes nn.MultiheadAttention's own calls, masks in PyTorch's polarity."""
    case = _case(case_name)
    torch.manual_seed(0)
    original = nn.MultiheadAttention(DIM, HEADS, batch_first=batch_first,
                                     add_zero_attn=mechanism == "quiet").double().eval()
    nn.init.normal_(original.in_proj_bias)
    nn.init.normal_(original.out_proj.bias)
    swapped = swap(copy.deepcopy(original), mechanism)
    assert isinstance(swapped, MultiheadAdapter)
    x = _tokens() if batch_first else _tokens().transpose(0, 1)
    masks = _mha_masks(case)
    expected = original(x, x, x, need_weights=False, **masks)[0].detach()
    got = swapped(x, x, x, need_weights=False, **masks)[0].detach()
    if not batch_first:
        expected, got = expected.transpose(0, 1), got.transpose(0, 1)
    rows = _real_rows(case)
    torch.testing.assert_close(got[rows], expected[rows], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("quiet", [False, True], ids=["softmax", "quiet"])
def test_attend_matches_scaled_dot_product_attention(quiet, case_name):
    """`attend` against F.scaled_dot_product_attention given every mask as one; quiet against it with a key
    and a value of zeros in front that every query may see."""
    case = _case(case_name)
    generator = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(B, HEADS, L, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    mask = _sdpa_mask(case)
    k_ref, v_ref, mask_ref = k, v, mask
    if quiet:
        k_ref, v_ref = F.pad(k, (0, 0, 1, 0)), F.pad(v, (0, 0, 1, 0))
        mask_ref = F.pad(mask, (1, 0))
    expected = F.scaled_dot_product_attention(q, k_ref, v_ref, attn_mask=mask_ref)
    attn_mask = case["allowed"] if case["allowed"] is not None else case["additive"]
    got = attend(q, k, v, causal=case["causal"], key_padding_mask=case["real"], quiet=quiet, attn_mask=attn_mask)
    rows = _real_rows(case)[:, None, :].expand(B, HEADS, L)
    torch.testing.assert_close(got[rows], expected[rows], rtol=1e-10, atol=1e-10)


def test_the_grid_reaches_a_row_with_no_key_and_a_query_without_its_own_key():
    """The grid's hard cases are there: a real query whose own key is forbidden beside padding (where a
    padding workaround once let it back in), and a query left no key at all."""
    case = _case("bool attn_mask forbidding the diagonal, with key_padding_mask")
    allowed, real = case["allowed"], case["real"]
    assert any(real[b, i] and not allowed[i, i] and real[b].any() and (~real[b]).any() for b in range(B)
               for i in range(L))
    row = _case("attn_mask forbidding a whole row")["allowed"]
    assert not row[3].any()
    x = _tokens()
    mha = _mha(quiet=False)
    nn.init.normal_(mha.out_proj.bias)
    out = mha(x, x, x, need_weights=False, attn_mask=~row)[0].detach()
    torch.testing.assert_close(out[:, 3], mha.out_proj.bias.expand(B, DIM))  # PyTorch: zeros, then the bias
