"""zoo's text models through Hugging Face transformers' own entry points (zoo/release/transformers_models.py).

The references are zoo's own: zoo.load's model, its logits and its `generate`, and zoo's tokenizers; what
transformers gives must equal them bit for bit (logits, weights) or token for token (greedy decoding).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

import zoo  # noqa: E402  (registers zoo's text models with transformers)
from zoo.models.text_transformer import TextTransformer  # noqa: E402
from zoo.models.tokenizer import BPETokenizer, CharTokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = ROOT / "checkpoints"
SHAKESPEARE = "ROMEO:\nWhat light through yonder window breaks? It is the east,\nand Juliet is the sun."


def _shipped(name: str) -> Path:
    folder = CHECKPOINTS / name
    if not (folder / "model.safetensors").is_file():
        pytest.skip(f"the shipped checkpoint {name} is not in this checkout")
    return folder


def _tiny(tmp_path: Path, tokenizer, name: str = "tiny", **overrides) -> Path:
    """A small random TextTransformer saved by zoo as a release folder."""
    torch.manual_seed(0)
    args = dict(vocab_size=tokenizer.vocab_size, context_length=16, embed_dim=16, depth=2, num_heads=2,
                attention=["micro", "softmax"], pos_embed="none", tokenizer=tokenizer.to_dict(), **overrides)
    return zoo.save_pretrained(TextTransformer(**args), tmp_path / name)


def _state_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_auto_config_reads_a_zoo_release_as_it_is():
    folder = _shipped("hybrid-elita-conv-gpt-tiny.shakespeare")
    config = transformers.AutoConfig.from_pretrained(folder)
    on_disk = json.loads((folder / "config.json").read_text())
    assert type(config).__name__ == "ZooTextConfig"
    assert config.args == on_disk["args"]
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (
        on_disk["args"]["vocab_size"], on_disk["args"]["embed_dim"], on_disk["args"]["depth"],
        on_disk["args"]["num_heads"])
    assert config.tokenizer_class == "ZooCharTokenizer"
    assert config.metrics == on_disk["metrics"]  # the card's metadata travels with the config


@pytest.mark.parametrize("name", ["gpt-tiny.shakespeare", "hybrid-micro-conv-gpt-tiny.shakespeare"])
def test_logits_are_zoos_own(name):
    folder = _shipped(name)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    reference = zoo.load(folder)
    ids = torch.randint(0, reference.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids))
    assert _state_equal(model.state_dict(), reference.state_dict())


@pytest.mark.parametrize("name,prompt,new", [
    # a 60-character prompt and 10 more: past context_length 64, where zoo's generate slides its window
    ("gpt-tiny.shakespeare", SHAKESPEARE[:60], 10),
    ("micro-gpt-tiny.shakespeare", "ROMEO:", 12),
    ("elita-gpt-tiny.shakespeare", "ROMEO:", 12),
    ("hybrid-elita-conv-gpt-tiny.shakespeare", "ROMEO:", 12),
    ("incontext-gpt-tiny.shakespeare", "ROMEO:", 12),
])
def test_greedy_generate_gives_zoos_tokens(name, prompt, new):
    folder = _shipped(name)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    reference = zoo.load(folder)
    ids = torch.tensor([reference.tokenizer.encode(prompt)])
    expected = reference.generate(ids, new, temperature=0)
    assert torch.equal(model.generate(ids, max_new_tokens=new, do_sample=False), expected)
    if name == "gpt-tiny.shakespeare":  # without the cache every step is recomputed: the same tokens
        assert torch.equal(model.generate(ids, max_new_tokens=new, do_sample=False, use_cache=False), expected)


def test_left_padded_batches_give_each_prompts_own_tokens():
    folder = _shipped("hybrid-micro-gpt-tiny.shakespeare")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    reference = zoo.load(folder)
    prompts = [reference.tokenizer.encode(p) for p in ("ROMEO:", "JULIET:\nO Romeo")]
    longest = max(map(len, prompts))
    ids = torch.tensor([[0] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    expected = reference.generate(prompts, 8, temperature=0)  # zoo pads on the left and masks, likewise
    assert [row[longest - len(p):].tolist() for row, p in zip(out, prompts)] == expected


def test_char_tokenizer_encodes_as_zoos(tmp_path):
    folder = _shipped("gpt-tiny.shakespeare")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    chars = json.loads((folder / "config.json").read_text())["args"]["tokenizer"]["chars"]
    reference = CharTokenizer(chars)
    assert type(tokenizer).__name__ == "ZooCharTokenizer"
    assert tokenizer(SHAKESPEARE).input_ids == reference.encode(SHAKESPEARE)
    assert tokenizer.decode(reference.encode(SHAKESPEARE)) == SHAKESPEARE  # spaces before ", ." kept
    with pytest.raises(ValueError, match="not in the tokenizer's vocabulary"):
        tokenizer("café")
    tokenizer.save_pretrained(tmp_path / "saved")  # saved by transformers, read back through its own files
    again = transformers.AutoTokenizer.from_pretrained(tmp_path / "saved")
    assert again(SHAKESPEARE).input_ids == reference.encode(SHAKESPEARE)


def test_bpe_tokenizer_encodes_as_zoos(tmp_path):
    pytest.importorskip("tokenizers")
    text = (ROOT.parent / "shared/data/tinyshakespeare/input.txt")
    corpus = text.read_text()[:4000] if text.is_file() else SHAKESPEARE * 40
    reference = BPETokenizer.from_text(corpus, vocab_size=300)
    folder = _tiny(tmp_path, reference)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    sample = "Hello there , friend . What?  'tis\n\nnaïve"
    assert type(tokenizer).__name__ == "ZooBPETokenizer"
    assert tokenizer(sample).input_ids == reference.encode(sample)
    assert tokenizer.decode(reference.encode(sample)) == sample
    tokenizer.save_pretrained(tmp_path / "saved")  # its tokenizer.json, merges included
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "saved")(sample).input_ids == reference.encode(sample)


def test_text_generation_pipeline_returns_zoos_text():
    folder = _shipped("micro-gpt-tiny.shakespeare")
    generator = transformers.pipeline("text-generation", model=str(folder))
    out = generator("ROMEO:", max_new_tokens=12, do_sample=False)
    assert out[0]["generated_text"] == zoo.load(folder).generate("ROMEO:", 12, temperature=0)


def test_trainer_fine_tunes_a_few_steps(tmp_path):
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate")
    folder = _tiny(tmp_path, CharTokenizer.from_text(SHAKESPEARE))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    ids = torch.tensor(tokenizer(SHAKESPEARE).input_ids[:64]).view(4, 16)
    data = [{"input_ids": row, "labels": row} for row in ids]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=3, per_device_train_batch_size=2,
                                          learning_rate=1e-2, report_to=[], use_cpu=True, save_strategy="no",
                                          logging_steps=1, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    changed = [k for k, v in model.state_dict().items() if not torch.equal(before[k], v)]
    assert "tok_embed.weight" in changed and any(k.startswith("blocks.1.attn") for k in changed)
    model.save_pretrained(tmp_path / "trained")  # and the trained weights load in zoo as they are
    assert _state_equal(zoo.load(tmp_path / "trained").state_dict(), model.state_dict())


def test_save_pretrained_then_zoo_load_is_bit_for_bit(tmp_path):
    folder = _shipped("hybrid-elita-conv-gpt-tiny.shakespeare")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    model.save_pretrained(tmp_path / "saved")
    loaded, original = zoo.load(tmp_path / "saved"), zoo.load(folder)
    assert _state_equal(loaded.state_dict(), original.state_dict())
    assert loaded.head.weight is loaded.tok_embed.weight  # still tied
    ids = torch.randint(0, original.vocab_size, (1, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(ids), original(ids))
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "saved")
    assert _state_equal(again.state_dict(), original.state_dict())


def test_loss_is_the_shifted_cross_entropy(tmp_path):
    folder = _tiny(tmp_path, CharTokenizer.from_text(SHAKESPEARE))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    reference = zoo.load(folder)
    ids = torch.tensor([CharTokenizer.from_text(SHAKESPEARE).encode(SHAKESPEARE[:16])])
    with torch.no_grad():
        logits = reference(ids)
        expected = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
        assert torch.allclose(model(ids, labels=ids).loss, expected)


def test_no_pickle_is_ever_read(tmp_path, monkeypatch):
    folder = tmp_path / "release"
    shutil.copytree(_shipped("gpt-tiny.shakespeare"), folder)
    (folder / "pytorch_model.bin").write_bytes(b"not to be unpickled")

    def refuse(*args, **kwargs):
        raise AssertionError("torch.load was called: a pickle was read")

    monkeypatch.setattr(torch, "load", refuse)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    assert _state_equal(model.state_dict(), zoo.load(folder).state_dict())
    with pytest.raises(ValueError, match="safetensors only"):
        transformers.AutoModelForCausalLM.from_pretrained(folder, use_safetensors=False)


def test_bad_inputs_are_refused_in_one_line(tmp_path):
    folder = tmp_path / "release"
    shutil.copytree(_shipped("gpt-tiny.shakespeare"), folder)
    with pytest.raises(TypeError, match="unexpected keyword argument 'wings'"):
        transformers.AutoModelForCausalLM.from_pretrained(folder, wings=2)
    config = json.loads((folder / "config.json").read_text())
    config["args"]["wings"] = 2
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"args.wings is not an argument of TextTransformer") as error:
        transformers.AutoModelForCausalLM.from_pretrained(folder)
    assert "\n" not in str(error.value)


def test_zoo_save_pretrained_writes_the_model_type(tmp_path):
    folder = _tiny(tmp_path, CharTokenizer.from_text(SHAKESPEARE))
    assert json.loads((folder / "config.json").read_text())["model_type"] == "zoo_text"
    for config in CHECKPOINTS.glob("*/config.json"):  # every shipped text release, and only those
        data = json.loads(config.read_text())
        assert (data.get("model_type") == "zoo_text") == (data["class"] == "TextTransformer"), config.parent.name
