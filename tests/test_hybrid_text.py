"""Hybrid text models (issue 25, parts 1-3): one attention (and MLP) per block, the mechanisms' own options
through attention_options, in-context attention in the text family, decoding with a state of each block's
kind (a KV cache, micro's and elita's sums, incontext's cache and gate sums), the exported decoding
programs, and save_pretrained refusing a model its config would not build. The references are independent
of the code under test: the block classes and option values given by hand, a full forward pass recomputed
for every new token (greedy, and sampling with the same generator), and each prompt decoded alone."""

import json

import pytest
import torch
import torch.nn.functional as F

import zoo
from zoo.attention import ElitaAttention, InContextAttention, MicroAttention, SoftmaxAttention
from zoo.attention.clipped import ClippedSoftmaxAttention
from zoo.attention.elita import FeedForward2
from zoo.models import TextTransformer, decoding
from zoo.models.layers import Mlp

from .conftest import onnx_decoding
from .reference import greedy_by_recompute

HYBRID = ["micro", "softmax", "elita", "incontext"]
SMALL = dict(vocab_size=50, context_length=64, embed_dim=32, depth=4, num_heads=2, pos_embed="none")


def sharp(attention, **kwargs) -> TextTransformer:
    """A small model whose logits are far apart (greedy choices not decided by rounding), and whose in-context
    tables are not zero (a fresh layer's are, which would hide its position bias)."""
    torch.manual_seed(0)
    model = TextTransformer(**{**SMALL, **kwargs}, attention=attention).eval()
    with torch.no_grad():
        model.tok_embed.weight.mul_(50)
        for block in model.blocks:
            if isinstance(block.attn, InContextAttention):
                block.attn.table.weight.normal_(std=0.5)
                block.attn.gate.bias.normal_(std=2.0)
    return model


# ---- one attention, MLP and options per block ---------------------------------------------------------------


def test_each_block_gets_its_attention_mlp_and_options_and_the_folder_keeps_them(tmp_path):
    options = [{"num_queries": 8}, {"alpha": 2.5}, None, {"num_positions": 16}]
    model = TextTransformer(**SMALL, attention=["micro", "clipped", "elita", "incontext"],
                            mlp=["mlp", "ffn2", "ffn2", "mlp"], attention_options=options)
    kinds = [MicroAttention, ClippedSoftmaxAttention, ElitaAttention, InContextAttention]
    assert [type(b.attn) for b in model.blocks] == kinds
    assert [type(b.mlp) for b in model.blocks] == [Mlp, FeedForward2, FeedForward2, Mlp]
    assert model.blocks[0].attn.queries.shape == (2 * 8, 32)  # heads * num_queries learned queries
    assert model.blocks[1].attn.alpha == 2.5
    assert model.blocks[2].attn.max_len == 64  # elita's n is context_length unless an option says otherwise
    assert model.blocks[3].attn.table.out_features == 2 * 16
    assert model.config["attention"] == ["micro", "clipped", "elita", "incontext"]
    assert model.config["attention_options"] == options
    for p in model.parameters():
        p.data.add_(torch.randn_like(p) * 0.01)
    folder = model.eval().save_pretrained(tmp_path / "m")
    assert json.loads((folder / "config.json").read_text())["args"]["attention_options"] == options
    loaded = zoo.load(folder)
    assert [type(b.attn) for b in loaded.blocks] == kinds and loaded.config == model.config
    ids = torch.randint(0, 50, (2, 12))
    assert torch.equal(loaded(ids), model(ids))


def test_one_dict_of_options_reaches_every_block_and_tuples_are_kept_as_lists():
    model = TextTransformer(**SMALL, attention=("micro",) * 4, attention_options={"num_queries": 3})
    assert all(b.attn.num_queries == 3 for b in model.blocks)
    assert model.config["attention"] == ["micro"] * 4 and model.config["attention_options"] == {"num_queries": 3}
    assert json.loads(json.dumps(model.config)) == model.config


def test_a_single_name_model_keeps_its_config_and_the_shipped_checkpoints_load():
    shipped = json.loads((zoo.models.registry.checkpoint_folder("micro-gpt-tiny") / "config.json").read_text())
    model = zoo.create("micro-gpt-tiny", **{k: shipped["args"][k] for k in ("context_length", "tokenizer")})
    assert model.config == shipped["args"]  # no attention_options key where none was given
    assert zoo.load("micro-gpt-tiny").config["attention"] == "micro"


def test_registered_hybrids_and_incontext():
    names = {"hybrid-micro-gpt-tiny": ["micro", "micro", "micro", "softmax"],
             "hybrid-elita-gpt-tiny": ["elita", "elita", "elita", "softmax"],
             "incontext-gpt-tiny": ["incontext"] * 4}
    classes = {"micro": MicroAttention, "elita": ElitaAttention, "softmax": SoftmaxAttention,
               "incontext": InContextAttention}
    for name, attention in names.items():
        model = zoo.create(name)
        assert [type(b.attn) for b in model.blocks] == [classes[a] for a in attention], name
        assert model.pos_embed is None and model.config["embed_dim"] == 128
    assert type(zoo.create("hybrid-elita-gpt-tiny").blocks[0].mlp) is FeedForward2


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(attention=["micro", "softmax"]), ValueError, r"attention lists 2 names, but depth=4"),
    (dict(attention=["micro", "softmx", "micro", "micro"]), ValueError,
     r"attention\[1\] \(block 1\) must be one of .*got 'softmx' \(closest: softmax"),
    (dict(attention=["micro", "micro", "fused", "micro"]), ValueError, r"attention\[2\] \(block 2\).*got 'fused'"),
    (dict(mlp=["mlp", "mlp", "mlp"]), ValueError, r"mlp lists 3 names, but depth=4"),
    (dict(attention=HYBRID, attention_options={"num_queries": 8}), ValueError,
     r"block 1: attention_options 'num_queries' is not an option of the softmax attention"),
    (dict(attention="micro", attention_options=[None, None, {"learned_bias": True}, None]), ValueError,
     r"block 2: attention_options 'learned_bias' is not an option of the micro attention"),  # no cache to bias
    (dict(attention="micro", attention_options={"num_queries": 0}), ValueError, r"block 0 \(micro\): .*num_queries"),
    (dict(attention="micro", attention_options=[{}] * 3), ValueError, r"a list of 4 dicts \(one per block\)"),
    (dict(attention="micro", attention_options={"num_queries": torch.tensor(3)}), TypeError, r"JSON values"),
])
def test_bad_per_block_arguments_are_refused_naming_the_block(kwargs, error, message):
    with pytest.raises(error, match=message):
        TextTransformer(**{**SMALL, **kwargs})


def test_create_says_where_a_mechanisms_option_goes():
    with pytest.raises(TypeError, match=r"^num_queries is an option of the micro attention.*pass "
                                        r"attention_options=\{'num_queries': 8\}$"):
        zoo.create("micro-gpt-tiny", num_queries=8)
    with pytest.raises(TypeError, match=r"takes no argument 'dept' \(closest: depth\)"):
        zoo.create("micro-gpt-tiny", dept=3)
    assert zoo.create("micro-gpt-tiny", attention_options={"num_queries": 8}).blocks[0].attn.num_queries == 8


def test_load_says_where_a_mechanisms_option_goes(tmp_path):
    model = zoo.create("micro-gpt-tiny", **SMALL)
    model.save_pretrained(tmp_path / "m")
    with pytest.raises(TypeError, match=r"^num_queries is an option of the micro attention.*pass "
                                        r"attention_options=\{'num_queries': 8\}$"):
        zoo.load(tmp_path / "m", num_queries=8)
    with pytest.raises(TypeError, match=r"takes no argument 'dept' \(closest: depth\)"):
        zoo.load(tmp_path / "m", dept=3)
    # the option itself reaches the blocks (here a shape the weights do not have: refused by name)
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.queries: checkpoint \(8, 32\), model \(16, 32\)"):
        zoo.load(tmp_path / "m", attention_options={"num_queries": 8})


# ---- decoding with a state per block ----------------------------------------------------------------------


@pytest.mark.parametrize("attention", [HYBRID, "incontext"])
def test_token_by_token_decoding_equals_the_parallel_forward(attention):
    model = sharp(attention)
    ids = torch.randint(0, 50, (2, 24))
    with torch.no_grad():
        full = model(ids)
        states, steps = None, []
        for t in range(ids.shape[1]):
            logits, states = model.forward_step(ids[:, t:t + 1], states, t)
            steps.append(logits)
    assert (torch.cat(steps, 1) - full).abs().max() < 1e-4
    kinds = {"micro": "MicroState", "softmax": "KVCache", "elita": "ElitaState", "incontext": "InContextState"}
    names = [attention] * 4 if isinstance(attention, str) else attention
    assert [type(s).__name__ for s in states] == [kinds[a] for a in names]


@pytest.mark.parametrize("attention", [HYBRID, "incontext"])
def test_generate_gives_the_tokens_of_recomputing_the_whole_sequence(attention):
    model = sharp(attention)
    prompt = [5, 17, 3, 9]
    assert model.generate(torch.tensor([prompt]), 12, temperature=0)[0].tolist() == \
        greedy_by_recompute(model, prompt, 12)
    # sampling: the same generator drawing from the recomputed logits' softmax
    generator, ids = torch.Generator().manual_seed(7), list(prompt)
    with torch.no_grad():
        for _ in range(12):
            probs = F.softmax(model(torch.tensor([ids]))[0, -1:].float() / 3.0, -1)
            ids.append(int(torch.multinomial(probs, 1, generator=generator)))
    assert model.generate(torch.tensor([prompt]), 12, temperature=3.0, seed=7)[0].tolist() == ids


@pytest.mark.parametrize("positions", ["rope", "alibi"])
def test_a_hybrids_softmax_block_with_positions_of_its_own_decodes_as_it_computes(positions):
    model = sharp(HYBRID, attention_options=[None, {"positions": positions}, None, None])
    assert model.blocks[1].attn.positions == positions
    prompt = [5, 17, 3, 9]
    assert model.generate(torch.tensor([prompt]), 10, temperature=0)[0].tolist() == \
        greedy_by_recompute(model, prompt, 10)


def test_left_padded_prompts_of_a_hybrid_give_the_tokens_they_give_alone():
    model = sharp(HYBRID)
    prompts = [[5, 17, 3, 9, 22, 40, 1], [7], [11, 12, 13]]
    assert model.generate(prompts, 8, temperature=0) == [greedy_by_recompute(model, p, 8) for p in prompts]


def test_a_state_of_another_blocks_kind_is_refused():
    model = sharp(HYBRID)
    _, states = model.forward_step(torch.randint(0, 50, (1, 3)))
    with pytest.raises((TypeError, ValueError), match="MicroState|state"):
        model.forward_step(torch.randint(0, 50, (1, 1)), states[::-1], 3)


MIXED = ["quiet", "micro", "incontext", "elita"]  # quiet's cache is one longer than incontext's


def test_decoding_programs_of_a_hybrid_carry_each_blocks_state_as_tensors():
    model = sharp(MIXED)
    assert decoding.state_names(model) == [
        "block0.keys", "block0.values", "block1.weighted_sum", "block1.score_sum", "block2.keys", "block2.values",
        "block2.starts", "block2.total", "block3.log_norm", "block3.mean"]
    prompt = torch.tensor([[5, 17, 3, 9], [7, 1, 2, 30]])
    with torch.no_grad():  # the programs' modules, eager: states flattened to tensors and back every step
        got = decoding.greedy(decoding.Prefill(model), decoding.Step(model), prompt, 10)
        _, _, *state = decoding.Prefill(model)(prompt)
    assert got.tolist() == [greedy_by_recompute(model, p, 10) for p in prompt.tolist()]
    assert [tuple(t.shape) for t in state[:2]] == [(2, 2, 5, 16)] * 2  # quiet: its zero key and 4 tokens
    assert [tuple(t.shape) for t in state[4:8]] == [(2, 2, 4, 16), (2, 2, 4, 16), (2, 2, 4), (2, 2)]
    with pytest.raises(ValueError, match=r"take 10 state tensors"):
        decoding.unflatten_states(model, torch.tensor(4), state[:8])


@pytest.mark.slow  # about 10 s: two programs traced
def test_exported_decoding_of_a_hybrid_decodes_greedily():
    model = sharp(MIXED)
    prefill, step = decoding.export(model)
    prompt = torch.tensor([[5, 17, 3, 9], [7, 1, 2, 30]])
    got = decoding.greedy(prefill.module(), step.module(), prompt, 10)
    assert got.tolist() == [greedy_by_recompute(model, p, 10) for p in prompt.tolist()]


@pytest.mark.slow  # about 30 s: three graphs exported and checked in ONNX Runtime
def test_onnx_decoding_of_a_hybrid(tmp_path):
    pytest.importorskip("onnxruntime")
    from zoo.release.onnx import export_onnx

    model = sharp(["micro", "softmax", "elita", "incontext"])
    folder, diffs = export_onnx(model, tmp_path / "out")
    assert all(d <= 1e-4 for d in diffs.values())
    config = json.loads((folder / "config.json").read_text())
    assert config["state"] == decoding.state_names(model) and len(config["state"]) == 10
    prompt = torch.tensor([[5, 17, 3, 9], [7, 1, 2, 30], [4, 4, 4, 4]])
    got = decoding.greedy(*onnx_decoding(folder), prompt, 10)
    assert got.tolist() == [greedy_by_recompute(model, p, 10) for p in prompt.tolist()]


@pytest.mark.slow  # a cold inductor compile: 20 s and more
def test_compile_fullgraph_of_a_hybrid_equals_eager():
    torch._dynamo.reset()
    model = zoo.create("hybrid-micro-gpt-tiny", attention=HYBRID).eval()
    ids = torch.randint(0, model.vocab_size, (3, 16))
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), model(ids), rtol=1e-5, atol=1e-5)


# ---- save_pretrained and the config ------------------------------------------------------------------------


def test_save_pretrained_refuses_a_model_whose_blocks_changed_after_construction(tmp_path):
    from zoo.attention import build

    model = zoo.create("micro-gpt-tiny")
    model.blocks[1].attn = build("softmax", 128, heads=4, causal=True)
    with pytest.raises(ValueError, match=r"blocks\.1\.attn is a SoftmaxAttention, but its config builds a "
                                         r"MicroAttention.*Construct the model with those arguments instead"):
        model.save_pretrained(tmp_path / "m")
    assert list(tmp_path.iterdir()) == []  # nothing written
    model = zoo.create("micro-gpt-tiny")
    model.blocks[0].attn = MicroAttention(128, heads=4, num_queries=8)  # the same names, another shape
    with pytest.raises(ValueError, match=r"blocks\.0\.attn is a MicroAttention with num_queries=8, but its config "
                                         r"builds num_queries=4"):
        zoo.save_pretrained(model, tmp_path / "m")
    assert list(tmp_path.iterdir()) == []
    built = zoo.create("micro-gpt-tiny", attention=["micro", "softmax", "micro", "micro"])  # the way to do it
    assert zoo.load(built.save_pretrained(tmp_path / "m")).config["attention"][1] == "softmax"


def test_a_hybrids_card_header_is_yaml_with_a_tag_per_mechanism(tmp_path):
    import yaml

    folder = zoo.create("hybrid-micro-gpt-tiny").save_pretrained(tmp_path / "m")
    header = yaml.safe_load((folder / "README.md").read_text().split("---")[1])
    assert header["tags"][-2:] == ["micro-attention", "softmax-attention"]
    assert "(per-block micro/micro/micro/softmax attention;" in (folder / "README.md").read_text()


def test_the_parameter_budget_counts_a_hybrids_blocks_each():
    from zoo.models.arguments import parameter_count

    for name in ("hybrid-micro-gpt-tiny", "hybrid-elita-gpt-tiny"):
        e = zoo.models.registry.entry(name)
        # by hand: the embedding, the final norm, and each block as a model of its own kind has it
        single = {a: zoo.create(f"{a}-gpt-tiny" if a != "softmax" else "gpt-tiny", pos_embed="none",
                                mlp=e.kwargs["mlp"]) for a in set(e.kwargs["attention"])}
        blocks = [sum(p.numel() for p in single[a].blocks[0].parameters()) for a in e.kwargs["attention"]]
        outside = sum(p.numel() for n, p in single["softmax"].named_parameters() if not n.startswith("blocks."))
        assert parameter_count(e.cls, e.kwargs) == outside + sum(blocks) == \
            sum(p.numel() for p in zoo.create(name).parameters())


@pytest.mark.parametrize("overrides, error, message", [
    (dict(tie_embeddings="yes"), TypeError, "tie_embeddings must be true or false, got 'yes'"),
    (dict(embed_std=0), ValueError, r"embed_std must be a finite number in \(0.0, 100.0\], got 0"),
    (dict(embed_std=float("nan")), ValueError, "embed_std must be a finite number .* got nan"),
    (dict(embed_std=1e9), ValueError, "embed_std must be a finite number .* got 1000000000.0"),
    (dict(attention_options={"dropout": float("nan")}), TypeError, "attention_options must hold JSON values"),
    (dict(pos_embed="rope", embed_dim=12, num_heads=4), ValueError, r"block 0 \(softmax\): .* even head width"),
])
def test_the_calibration_and_position_arguments_refuse_what_they_cannot_build(overrides, error, message):
    with pytest.raises(error, match=message):
        zoo.create("gpt-tiny", **overrides)


def test_an_untied_output_layer_with_its_own_init_round_trips(tmp_path):
    torch.manual_seed(0)
    model = zoo.create("gpt-tiny", tie_embeddings=False, embed_std=1.0, depth=1).eval()
    assert model.head.weight is not model.tok_embed.weight
    assert 0.9 < float(model.tok_embed.weight.std()) < 1.1  # the init asked for, not GPT-2's 0.02
    again = zoo.load(model.save_pretrained(tmp_path / "untied"))
    assert again.config["tie_embeddings"] is False and again.head.weight is not again.tok_embed.weight
    x = torch.randint(0, model.vocab_size, (2, 16))
    torch.testing.assert_close(again(x), model(x))
