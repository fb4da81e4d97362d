"""zoo in Hugging Face transformers: attn_implementation="zoo_quiet" (zoo/attention/hf_attention.py) and swap
of transformers' attention modules to micro, elita and incontext (zoo/attention/hf_swap.py), on small randomly
initialised GPT-2, Llama and ViT models built from configs (no download). References: transformers' own "sdpa"
path, and softmax_one written the slow way in float64 here."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    AttentionInterface,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    ViTConfig,
    ViTForImageClassification,
)
from transformers.masking_utils import AttentionMaskInterface, eager_mask  # noqa: E402

from zoo.attention import load_swapped, register_attention_functions, swap  # noqa: E402

VOCAB = 64


def gpt2(**overrides) -> GPT2LMHeadModel:
    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=VOCAB, n_positions=64, attn_pdrop=0.0,
                        resid_pdrop=0.0, embd_pdrop=0.0, **overrides)
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).eval()


def llama(kv_heads: int = 2, **overrides) -> LlamaForCausalLM:
    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=kv_heads, vocab_size=VOCAB, max_position_embeddings=128, **overrides)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def vit() -> ViTForImageClassification:
    config = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                       image_size=16, patch_size=8, num_labels=3)
    torch.manual_seed(0)
    return ViTForImageClassification(config).eval()


def batch(length: int = 10):
    """Token ids (2, length) and a mask whose first row is left-padded by 3 tokens."""
    ids = torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, length, dtype=torch.long)
    mask[0, :3] = 0
    return ids, mask


def slow_softmax_one(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """softmax_one attention in float64, the slow way: exp(s_j) / (1 + sum_j exp(s_j)) over the allowed keys, the
    mask as transformers' eager path builds it (additive, the dtype's lowest where forbidden)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1).double(), value.repeat_interleave(groups, 1).double()
    logits = query.double() @ key.transpose(-1, -2) * scaling
    allowed = torch.ones_like(logits, dtype=torch.bool)
    if attention_mask is not None:
        allowed = allowed & (attention_mask > torch.finfo(attention_mask.dtype).min / 2)
    weights = torch.where(allowed, logits.exp(), 0.0)
    weights = weights / (1.0 + weights.sum(-1, keepdim=True))
    return (weights @ value).to(query.dtype).transpose(1, 2).contiguous(), None


@pytest.fixture(scope="module", autouse=True)
def registered():
    register_attention_functions()
    AttentionInterface.register("test_slow_softmax_one", slow_softmax_one)
    AttentionMaskInterface.register("test_slow_softmax_one", eager_mask)
    # zoo_clipped's alpha of 4 empties a fresh model's near-uniform rows (clipped.py): training wants alpha < 1
    from transformers.masking_utils import sdpa_mask

    from zoo.attention import attention_function

    AttentionInterface.register("test_clipped_half", attention_function("clipped", alpha=0.5))
    AttentionMaskInterface.register("test_clipped_half", sdpa_mask)


def run(model, implementation: str, *inputs, **kwargs):
    model.set_attn_implementation(implementation)
    with torch.no_grad():
        return model(*inputs, **kwargs).logits


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama-gqa"])
def test_zoo_softmax_equals_sdpa_with_padding_and_gqa(make):
    model = make()
    ids, mask = batch()
    torch.testing.assert_close(run(model, "zoo_softmax", ids, attention_mask=mask),
                               run(model, "sdpa", ids, attention_mask=mask), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(run(model, "zoo_softmax", ids), run(model, "sdpa", ids), rtol=1e-5, atol=1e-5)


def test_zoo_softmax_equals_sdpa_in_a_vit_and_with_a_sliding_window():
    model = vit()
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(run(model, "zoo_softmax", pixels), run(model, "sdpa", pixels), rtol=1e-5, atol=1e-5)
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    mistral = MistralForCausalLM(MistralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                               sliding_window=4)).eval()
    ids, mask = batch(12)
    torch.testing.assert_close(run(mistral, "zoo_softmax", ids, attention_mask=mask),
                               run(mistral, "sdpa", ids, attention_mask=mask), rtol=1e-5, atol=1e-5)
    # the window matters here: without it the outputs differ
    assert not torch.allclose(run(mistral, "sdpa", ids), run(llama(), "sdpa", ids), atol=1e-3)


@pytest.mark.parametrize("make", [gpt2, llama, vit], ids=["gpt2", "llama-gqa", "vit"])
def test_zoo_quiet_equals_softmax_one_written_in_float64(make):
    model = make().double()
    if isinstance(model, ViTForImageClassification):
        inputs, kwargs = (torch.randn(2, 3, 16, 16, dtype=torch.float64),), {}
    else:
        ids, mask = batch()
        inputs, kwargs = (ids,), {"attention_mask": mask}
    quiet = run(model, "zoo_quiet", *inputs, **kwargs)
    reference = run(model, "test_slow_softmax_one", *inputs, **kwargs)
    torch.testing.assert_close(quiet, reference, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(quiet, run(model, "sdpa", *inputs, **kwargs), atol=1e-6)  # it is not softmax


def test_clipped_with_alpha_zero_is_softmax_and_alibi_adds_the_linear_bias():
    from transformers.masking_utils import sdpa_mask

    from zoo.attention import attention_function
    from zoo.attention.positions import alibi_slopes

    model = gpt2()
    ids, mask = batch()
    AttentionInterface.register("test_clipped_0", attention_function("clipped", alpha=0.0))
    AttentionMaskInterface.register("test_clipped_0", sdpa_mask)
    torch.testing.assert_close(run(model, "test_clipped_0", ids, attention_mask=mask),
                               run(model, "sdpa", ids, attention_mask=mask), rtol=1e-5, atol=1e-5)
    assert torch.isfinite(run(model, "zoo_clipped", ids, attention_mask=mask)).all()

    # ALiBi, against its formula in float64 on one layer: softmax(q k^T * scale - m_h (i - j)) v, causal
    layer = model.transformer.h[0].attn
    q, k, v = (torch.randn(1, 4, 6, 8, dtype=torch.float64) for _ in range(3))
    out, weights = AttentionInterface()["zoo_alibi"](layer, q, k, v, None, scaling=0.3)
    slopes = alibi_slopes(4)
    i = torch.arange(6.0, dtype=torch.float64)
    logits = q @ k.transpose(-1, -2) * 0.3 - slopes[:, None, None] * (i[:, None] - i[None, :])
    logits = logits.masked_fill(i[None, :] > i[:, None], float("-inf"))
    torch.testing.assert_close(out, (logits.softmax(-1) @ v).transpose(1, 2), rtol=1e-10, atol=1e-10)
    assert weights is None


def test_bf16_matches_sdpa_and_softcap_is_refused():
    model = llama().to(torch.bfloat16)
    ids, mask = batch()
    torch.testing.assert_close(run(model, "zoo_softmax", ids, attention_mask=mask),
                               run(model, "sdpa", ids, attention_mask=mask), rtol=2e-2, atol=2e-2)
    assert run(model, "zoo_quiet", ids, attention_mask=mask).dtype == torch.bfloat16
    q = torch.randn(1, 4, 3, 8)
    with pytest.raises(ValueError, match="softcap"):
        AttentionInterface()["zoo_quiet"](model.model.layers[0].self_attn, q, q[:, :2], q[:, :2], None, softcap=30.0)


@pytest.mark.parametrize("implementation", ["zoo_quiet", "test_clipped_half", "zoo_alibi"])
def test_a_training_step_runs_with_dropout(implementation):
    model = llama(attention_dropout=0.1)
    model.set_attn_implementation(implementation)
    model.train()
    ids, mask = batch()
    loss = model(ids, attention_mask=mask, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("implementation", ["zoo_quiet", "zoo_clipped", "zoo_alibi"])
def test_generate_with_the_cache_equals_recomputation(implementation):
    model = llama()
    model.set_attn_implementation(implementation)
    ids, mask = batch()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, output_scores=True,
                             return_dict_in_generate=True)
        full_mask = torch.cat([mask, torch.ones(2, 5, dtype=torch.long)], 1)
        positions = (full_mask.cumsum(-1) - 1).clamp(min=0)  # as generate counts them
        full = model(out.sequences, attention_mask=full_mask, position_ids=positions, use_cache=False).logits
    torch.testing.assert_close(torch.stack(out.scores, 1), full[:, ids.shape[1] - 1:-1], rtol=1e-4, atol=1e-4)


# swap


@pytest.mark.parametrize("mechanism", ["micro", "elita", "incontext", "gla", "deltanet", "ssd"])
@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_swapped_models_generate_as_they_recompute(make, mechanism):
    model = make()
    swap(model, mechanism, strict=False)
    ids, mask = batch()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, output_scores=True,
                             return_dict_in_generate=True)
        full_mask = torch.cat([mask, torch.ones(2, 5, dtype=torch.long)], 1)
        positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
        full = model(out.sequences, attention_mask=full_mask, position_ids=positions, use_cache=False).logits
    torch.testing.assert_close(torch.stack(out.scores, 1), full[:, ids.shape[1] - 1:-1], rtol=1e-4, atol=1e-4)
    assert all(state is not None for state in getattr(out.past_key_values, "zoo_states", {0: None}).values())


def test_incontext_keeps_gpt2s_weights_under_their_names_and_its_outputs():
    model = gpt2()
    ids, mask = batch()
    with torch.no_grad():
        before = model(ids, attention_mask=mask).logits
    original = copy.deepcopy(model.state_dict())
    swap(model, "incontext")
    with torch.no_grad():
        after = model(ids, attention_mask=mask).logits
    # the position tables start at zero: plain softmax attention with the same weights, at the real tokens
    torch.testing.assert_close(after[1], before[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(after[0, 3:], before[0, 3:], rtol=1e-5, atol=1e-5)
    state = model.state_dict()
    assert set(original) <= set(state)
    assert all(torch.equal(state[key], original[key]) for key in original)
    assert {key for key in state if key not in original} == {
        f"transformer.h.{i}.attn.mixer.{part}" for i in range(2) for part in
        ("gate.weight", "gate.bias", "table.weight", "table.bias")}


def test_micro_swap_of_llama_and_vit_keeps_the_output_projections_and_trains():
    model = llama(kv_heads=4)
    o_proj = model.model.layers[0].self_attn.o_proj.weight.clone()
    swap(model, "micro")
    assert torch.equal(model.state_dict()["model.layers.0.self_attn.o_proj.weight"], o_proj)
    assert "model.layers.0.self_attn.q_proj.weight" not in model.state_dict()
    model.train()
    ids, mask = batch()
    loss = model(ids, attention_mask=mask, labels=ids).loss
    loss.backward()
    assert model.model.layers[0].self_attn.mixer.queries.grad.abs().sum() > 0
    image = vit()
    swap(image, "micro")  # bidirectional, as ViT attends
    assert not image.vit.layers[0].attention.mixer.causal
    assert image(torch.randn(2, 3, 16, 16)).logits.shape == (2, 3)


def test_what_cannot_be_swapped_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"GPT2Attention.*attn_implementation='zoo_quiet'") as caught:
        swap(gpt2(), "quiet")
    assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match=r"elita is causal only"):
        swap(vit(), "elita")
    with pytest.raises(ValueError, match=r"GPT2Attention.*neither q_proj.*micro, elita, incontext, gla, deltanet"):
        swap(gpt2(add_cross_attention=True), "micro")
    model = llama(sliding_window=4)
    with pytest.raises(ValueError, match="sliding window"):
        swap(model, "micro")


@pytest.mark.parametrize("mechanism", ["micro", "deltanet", "ssd"])
def test_a_swapped_gpt2_saved_with_save_pretrained_loads_back_or_is_refused(tmp_path, mechanism):
    model = gpt2()
    swap(model, mechanism)
    model.save_pretrained(tmp_path)
    ids, mask = batch()
    # the original class would rebuild plain attention and drop the mechanism's weights: it refuses
    with pytest.raises(ValueError, match=f"zoo_swapped_{mechanism}"):
        GPT2LMHeadModel.from_pretrained(tmp_path)
    loaded = load_swapped(GPT2LMHeadModel, tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits,
                                   rtol=0, atol=0)
    with pytest.raises(ValueError, match="zoo_swap"):
        load_swapped(GPT2LMHeadModel, _plain_folder(tmp_path))


def _plain_folder(tmp_path):
    folder = tmp_path / "plain"
    gpt2().save_pretrained(folder)
    return folder


def test_timm_swaps_keep_the_models_own_keys_and_eva_and_swin_are_reached():
    timm = pytest.importorskip("timm")
    from timm.models.eva import Eva

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2).eval()
    original = copy.deepcopy(model.state_dict())
    pixels = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        before = model(pixels)
    swap(model, "quiet")
    assert set(model.state_dict()) == set(original)  # blocks.0.attn.qkv.weight, not blocks.0.attn.attn.qkv.weight
    model.load_state_dict(original)  # the original checkpoint loads into the swapped model
    swap(model, "softmax")
    with torch.no_grad():
        torch.testing.assert_close(model(pixels), before, rtol=1e-5, atol=1e-5)

    torch.manual_seed(0)
    eva = Eva(img_size=16, patch_size=8, embed_dim=32, depth=2, num_heads=4, num_classes=3,
              use_rot_pos_emb=False, qkv_fused=False).eval()
    with torch.no_grad():
        before = eva(torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(3)))
        swap(eva, "softmax")
        after = eva(torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(3)))
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="rope"):
        swap(timm.create_model("eva02_tiny_patch14_224", pretrained=False, img_size=28, depth=1), "softmax")

    swin = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=56, depths=(2,),
                             num_heads=(2,), embed_dim=16, num_classes=3).eval()
    with pytest.raises(ValueError, match="relative position bias"):
        swap(swin, "softmax")
    with pytest.raises(ValueError, match="Swin WindowAttention.*micro cannot apply"):
        swap(swin, "micro")
    with pytest.warns(UserWarning, match="relative position bias"):
        swap(swin, "quiet", strict=False)
    assert swin(torch.randn(2, 3, 56, 56)).shape == (2, 3)  # the shifted block's window mask goes through
