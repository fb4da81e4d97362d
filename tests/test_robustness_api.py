"""The Python API refuses what it cannot answer (issue 21): tokenizers, generate, classify, build, W8A8, configs.

Every test here hands a public function something it used to answer wrongly without a word
(a negative token id read from the end, 1.5 truncated to 1, NaN probabilities, a flag "no"
read as True) or to crash on deep inside torch, and asserts one of two outcomes: the right
answer (checked against an independent reference), or a ValueError / TypeError (RuntimeError
where the docs promise one) whose one-line message names the argument, what it takes and what
it got, raised before any work is done.
"""

import copy
import json
import math
import os

import numpy as np
import pytest
import torch

import zoo
from zoo.attention import build, softmax_one
from zoo.models.tokenizer import CharTokenizer, tokenizer_from_dict
from zoo.quantization import W8A8

REFUSED = (ValueError, TypeError)


def short_id(value) -> str:
    """A test id that pytest can print: no 5000-digit integer (Python will not convert it), no 1 MB string."""
    try:
        return repr(value)[:24]
    except ValueError:  # an integer of more than 4300 digits, or a list holding one
        return f"huge-{type(value).__name__}"


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message and len(message) < 400, message
    return message


# ---- tokenizers --------------------------------------------------------------------------------


@pytest.mark.parametrize(("ids", "error", "message"), [
    ([-1], ValueError, r"CharTokenizer.decode token ids must lie in \[0, 3\), got -1"),
    ([0, 3], ValueError, r"must lie in \[0, 3\), got 3"),
    ([1.5], TypeError, r"token ids must be integers, got 1.5 \(float\)"),
    ([True], TypeError, r"must be integers, got True \(bool\)"),
    (torch.tensor([0.0]), TypeError, "must be integers, got 0.0"),
    (5, TypeError, r"takes a list of token ids, got 5 \(int\)"),
    ("ab", TypeError, "takes a list of token ids, got 'ab'"),
])
def test_char_decode_refuses_ids_outside_the_vocabulary(ids, error, message):
    with pytest.raises(error, match=message) as e:
        CharTokenizer("abz").decode(ids)
    one_line(e)


def test_char_decode_reads_lists_arrays_and_tensors_alike():
    chars = "abz"
    want = "".join(chars[i] for i in (2, 0, 1, 1))  # indexing the vocabulary by hand
    for ids in ([2, 0, 1, 1], np.array([2, 0, 1, 1], dtype=np.int16), torch.tensor([2, 0, 1, 1], dtype=torch.int32)):
        assert CharTokenizer(chars).decode(ids) == want == "zabb"


def test_bpe_decode_refuses_ids_outside_the_vocabulary():
    pytest.importorskip("tokenizers")
    from zoo.models.tokenizer import BPETokenizer

    bpe = BPETokenizer.from_text("the cat sat on the mat " * 20, vocab_size=280)
    assert bpe.decode(bpe.encode("the mat")) == "the mat"
    for bad in (-1, bpe.vocab_size):
        with pytest.raises(ValueError, match=rf"BPETokenizer.decode token ids must lie in \[0, {bpe.vocab_size}\)"):
            bpe.decode([bad])


@pytest.mark.parametrize(("saved", "error", "message"), [
    ({"type": "char"}, ValueError, "'char' tokenizer needs its 'chars' field"),
    ({"type": "char", "chars": 5}, TypeError, r"CharTokenizer chars must be a string \(its vocabulary\), got 5"),
    ({"type": "char", "chars": "aa"}, ValueError, "needs one or more distinct characters"),
    ({"type": "char", "chars": ""}, ValueError, "needs one or more distinct characters"),
    ({"type": ["char"]}, ValueError, r"expected a tokenizer of type \['bpe', 'char'\], got \['char'\]"),
    ([1], TypeError, "a tokenizer is saved as a dict"),
    ({"type": "bpe"}, TypeError, "'bpe' tokenizer needs its 'json' field"),
    ({"type": "bpe", "json": "{not json"}, ValueError, "JSON could not be read by the tokenizers library: key must"),
    ({"type": "bpe", "json": " " * (11 * 2**20)}, ValueError, "11,534,336 characters, more than the limit of 10,485"),
], ids=short_id)
def test_saved_tokenizers_are_checked(saved, error, message):
    if isinstance(saved, dict) and saved.get("type") == "bpe":
        pytest.importorskip("tokenizers")
    with pytest.raises(error, match=message) as e:
        tokenizer_from_dict(saved)
    one_line(e)


def test_a_text_model_config_with_a_broken_tokenizer_names_the_file(tmp_path):
    model = zoo.create("gpt-tiny", depth=1, vocab_size=3, tokenizer=CharTokenizer("abc").to_dict())
    folder = model.save_pretrained(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    config["args"]["tokenizer"] = {"type": "char"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="needs its 'chars' field") as e:
        zoo.load(folder)
    assert "config.json" in one_line(e)


# ---- generate ----------------------------------------------------------------------------------

GPT = zoo.create("gpt-tiny", depth=1, embed_dim=32).eval()


@pytest.mark.parametrize(("prompt", "error", "message"), [
    ([[1.5, 2.7]], TypeError, "token ids must be integers, got torch.float32"),
    (torch.tensor([1.0, 2.0]), TypeError, "token ids must be integers, got torch.float32"),
    ([True, False], TypeError, "token ids must be integers, got torch.bool"),
    ([[1, 2], "3"], TypeError, r"takes a string, a list of token ids or an integer tensor, .*got \[\[1, 2\], '3'\]"),
    ([2**70], TypeError, "takes a string, a list of token ids or an integer tensor"),
    (torch.tensor(5), ValueError, r"token ids of shape \(length,\) or \(batch, length\), got \(\)"),
    ([], ValueError, "needs a prompt of at least one token"),
    (torch.zeros(0, 3, dtype=torch.long), ValueError, "needs a prompt of at least one token"),
    (torch.tensor([1, 2], device="meta"), ValueError, "on the meta device, which has shapes but no data"),
    ([-1], ValueError, r"token ids must lie in \[0, 65\)"),
    ([65], ValueError, r"token ids must lie in \[0, 65\)"),
])
def test_generate_refuses_prompts_that_are_not_token_ids(prompt, error, message):
    with pytest.raises(error, match=message) as e:
        GPT.generate(prompt, 3, temperature=0)
    one_line(e)


def test_generate_takes_integer_tensors_of_any_integer_dtype():
    prompt = [5, 17, 3]
    want = GPT.generate(prompt, 4, temperature=0)
    assert want[0, :3].tolist() == prompt and want.shape == (1, 7)
    for ids in (torch.tensor(prompt, dtype=torch.int32), torch.tensor([prompt], dtype=torch.uint8),
                np.array(prompt, dtype=np.int16)):
        assert torch.equal(GPT.generate(ids, 4, temperature=0), want)


def test_generate_refuses_a_model_whose_logits_overflow():
    model = zoo.create("gpt-tiny", depth=1, embed_dim=32).eval()
    with torch.no_grad():
        model.norm.weight.fill_(3e38)  # a damaged checkpoint: every logit is +-inf
    with pytest.raises(ValueError, match="produced non-finite logits .* weights are likely too large"):
        model.generate([1, 2], 3, temperature=0)


@pytest.mark.parametrize("prompt", [[[[1, 2], [3, 4]]], [[[1, 2]]], [[1, 2], [[3, 4]]]], ids=short_id)
def test_generate_refuses_a_prompt_nested_one_level_too_deep(prompt):
    # [[[1, 2], [3, 4]]] was read as the prompt [1, 2] (its first row) and continued
    with pytest.raises(TypeError, match=r"a list of token ids, a list of lists of token ids .*a string .*tokenizer.*"
                                        r"integer tensor.*prompt \d is nested too deep") as e:
        GPT.generate(prompt, 3, temperature=0)
    one_line(e)


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-5, 9.99e-5])
def test_generate_refuses_a_temperature_too_small_to_divide_logits_by(temperature):
    # 1e-300 passed the check and crashed in torch.multinomial: logits / 1e-300 overflow to inf
    with pytest.raises(ValueError, match=r"temperature must be 0 \(greedy\) or a finite number >= 0.0001") as e:
        GPT.generate([1, 2], 3, temperature=temperature, seed=0)
    one_line(e)


def test_generate_takes_the_smallest_temperature_and_zero():
    greedy = GPT.generate([1, 2], 4, temperature=0)
    assert GPT.generate([1, 2], 4, temperature=1e-4, seed=0).shape == greedy.shape == (1, 6)


# ---- classify ----------------------------------------------------------------------------------

VIT = zoo.create("vit-tiny", depth=1).eval()
DIGIT = np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8)


@pytest.mark.parametrize("top_k", [0, -1, 1.5, True, "3", None])
def test_classify_refuses_a_top_k_that_is_not_a_count(top_k):
    with pytest.raises(REFUSED, match="ImageTransformer.classify top_k must be") as e:
        VIT.classify(DIGIT, top_k=top_k)
    assert repr(top_k) in one_line(e) or str(top_k) in one_line(e)


def test_classify_top_k_gives_the_k_most_likely_labels():
    with torch.no_grad():
        x = ((torch.from_numpy(DIGIT).double() / 255 - 0.5) / 0.5)[None, None]
        probs = torch.softmax(copy.deepcopy(VIT).double()(x)[0], -1)  # the same weights in float64
    got = VIT.classify(DIGIT, top_k=3)
    order = probs.argsort(descending=True)[:3]
    assert [label for label, _ in got] == [str(int(i)) for i in order]
    np.testing.assert_allclose([p for _, p in got], probs[order].numpy(), atol=1e-4)
    assert len(VIT.classify(DIGIT, top_k=50)) == 10  # more than there are classes: all of them


@pytest.mark.parametrize(("image", "message"), [
    (np.zeros((0, 0), np.uint8), r"takes inputs of size \(28, 28\), got an empty one: \(0, 0\)"),
    (np.zeros((1, 28, 0), np.uint8), "got an empty one"),
    (torch.zeros(28, 28, device="meta"), "the input on the meta device, which has shapes but no data"),
    (torch.zeros(28, 28).to_sparse(), "expects the input as a dense tensor, got layout torch.sparse_coo"),
])
def test_classify_refuses_empty_meta_and_sparse_inputs(image, message):
    with pytest.raises(ValueError, match=message) as e:
        VIT.classify(image)
    one_line(e)


def test_classify_refuses_overflowing_logits_and_handles_huge_finite_ones():
    model = zoo.create("fused-1d-tiny").eval()
    x = torch.rand(40)
    with torch.no_grad():
        model.head.bias.zero_()
        model.head.bias[7] = 1e30  # finite but huge: class 7 with probability 1, not NaN
        assert model.classify(x) == [("7", 1.0)]
        model.head.weight.fill_(3e38)  # the reproducer: logits overflow to inf
    with pytest.raises(ValueError, match="produced non-finite logits .* weights are likely too large") as e:
        model.classify(x)
    one_line(e)


def _digits(n: int, seed: int = 0) -> list[np.ndarray]:
    return list(np.random.default_rng(seed).integers(0, 256, (n, 28, 28), dtype=np.uint8))


@pytest.mark.parametrize("kind", ["pil", "array", "tensor"])
def test_classify_reads_a_list_of_images_as_a_batch(kind):
    from PIL import Image

    digits = _digits(3)
    items = {"pil": [Image.fromarray(d) for d in digits], "array": digits,
             "tensor": [torch.from_numpy(d) for d in digits]}[kind]
    alone = [VIT.classify(item, top_k=2) for item in items]
    assert VIT.classify(items, top_k=2) == alone
    assert VIT.classify(tuple(items), top_k=2) == alone
    assert VIT.classify(items[:1], top_k=2) == alone[:1]  # a list of one is a batch of one
    assert VIT.classify(items[0], top_k=2) == alone[0]  # one image, one result


def test_classify_reads_a_list_of_grey_pil_images_as_a_batch_on_an_rgb_model():
    # np.asarray of three greyscale images is (3, 28, 28): an RGB model read them as one image's three channels
    from PIL import Image

    rgb = zoo.create("vit-tiny", depth=1, in_chans=3, mean=(0.5,) * 3, std=(0.5,) * 3).eval()
    images = [Image.fromarray(d) for d in _digits(3, seed=1)]
    got = rgb.classify(images)
    assert len(got) == 3 and got == [rgb.classify(image) for image in images]


def test_classify_refuses_a_list_item_that_is_not_one_image():
    batch = torch.rand(2, 1, 28, 28)
    with pytest.raises(ValueError, match=r"reads a list as a batch, one item each: item 1 holds 2") as e:
        VIT.classify([torch.rand(28, 28), batch])
    one_line(e)
    with pytest.raises(ValueError, match=r"item 0: .*takes inputs of shape \(1, 28, 28\)") as e:
        VIT.classify([torch.rand(3, 28, 28)])
    one_line(e)


# ---- the attention library ---------------------------------------------------------------------


@pytest.mark.parametrize(("name", "kwargs", "error", "message"), [
    ("micro", {"num_queries": 0}, ValueError, "MicroAttention num_queries must be between 1 and"),
    ("elita", {"causal": True, "max_len": 0}, ValueError, "ElitaAttention max_len must be between 1 and"),
    ("elita", {"causal": True, "chunk_size": 0}, ValueError, "ElitaAttention chunk_size must be between 1 and"),
    ("elita", {"causal": True, "pos_dim": 2.0}, TypeError, r"pos_dim must be an integer, got 2.0 \(float\)"),
    ("softmax", {"dim": -8}, ValueError, "SoftmaxAttention dim must be between 1 and 2147483647, got -8"),
    ("quiet", {"dim": 8.0}, TypeError, r"QuietAttention dim must be an integer, got 8.0 \(float\)"),
    ("micro", {"dim": True}, TypeError, r"MicroAttention dim must be an integer, got True \(bool\)"),
    ("softmax", {"heads": -2}, ValueError, "heads must be between 1 and"),
    ("gated", {"heads": 2.0}, TypeError, "GatedAttention heads must be an integer"),
    ("softmax", {"heads": 3}, ValueError, "needs dim divisible by heads, got dim=8, heads=3"),
    ("softmax", {"dropout": 2}, ValueError, r"SoftmaxAttention dropout must be a finite number in \[0.0, 1.0\), got 2"),
    ("quiet", {"dropout": float("nan")}, ValueError, "dropout must be a finite number"),
    ("softmax", {"causal": "no"}, TypeError, r"SoftmaxAttention causal must be true or false, got 'no' \(str\)"),
    ("softmax", {"max_len": 0}, ValueError, "max_len must be between 1 and"),
    ("clipped", {"alpha": float("nan")}, ValueError, "ClippedSoftmaxAttention alpha must be a finite number"),
    ("clipped", {"zeta": 0.5}, ValueError, r"zeta must be a finite number in \[1.0, inf\]"),
    ("gated", {"gate_bias": float("inf")}, ValueError, "GatedAttention gate_bias must be a finite number"),
    ("fused", {"norm": 5}, TypeError, r"FusedAttention norm must be one of \['softmax', 'softmax_one'\] or a callable"),
    ("fused", {"fuse": ["max"]}, TypeError, r"fuse must be one of \['mean', 'max', 'learned'\] or a callable, got"),
    ("fused", {"fuse": "maxx"}, ValueError, "fuse must be one of"),
    (["micro"], {}, ValueError, r"unknown attention \['micro'\]"),
])
def test_build_refuses_arguments_out_of_range(name, kwargs, error, message):
    with pytest.raises(error, match=message) as e:
        build(name, **{"dim": 8, "heads": 2, **kwargs})
    one_line(e)


@pytest.mark.parametrize("name", ["softmax", "quiet", "micro", "elita", "fused"])
def test_a_padding_mask_must_be_a_tensor_on_the_inputs_device(name):
    layer = build(name, 8, heads=2, causal=name == "elita")
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"expects key_padding_mask on the input's device \(cpu\), got meta"):
        layer(x, key_padding_mask=torch.ones(2, 5, dtype=torch.bool, device="meta"))
    with pytest.raises(TypeError, match="key_padding_mask as a boolean torch.Tensor or None, got list"):
        layer(x, key_padding_mask=[[True] * 5] * 2)


def test_softmax_one_takes_only_tensors_with_data():
    with pytest.raises(TypeError, match="softmax_one expects its input as a torch.Tensor, got ndarray"):
        softmax_one(np.zeros(3))
    with pytest.raises(ValueError, match="softmax_one got its input on the meta device, which has shapes but no data"):
        softmax_one(torch.zeros(3, device="meta"))
    with pytest.raises(ValueError, match="dense tensor, got layout torch.sparse_coo"):
        softmax_one(torch.zeros(3).to_sparse())
    # and the right answer where it takes one: exp(x_i) / (1 + sum_j exp(x_j)), written out
    x = torch.tensor([0.0, 0.0, 0.0])
    torch.testing.assert_close(softmax_one(x), torch.full((3,), 0.25))


# ---- W8A8 --------------------------------------------------------------------------------------


def test_w8a8_is_refused_until_calibrated():
    model = zoo.create("fused-1d-tiny").eval()
    x = torch.rand(2, 1, 40)
    quantized = W8A8(model)
    with pytest.raises(RuntimeError, match="used before calibration: call calibrate"):
        quantized(x)
    with pytest.raises(ValueError, match="calibration needs 4 batches, the data gave 3"):
        quantized.calibrate([x] * 3, steps=4)
    with pytest.raises(RuntimeError, match="used before calibration"):  # a failed calibration leaves it refused
        quantized(x)
    with pytest.raises(TypeError, match="takes an iterable of input batches .*, got str"):
        quantized.calibrate("a" * 16, steps=2)
    with pytest.raises(TypeError, match="takes batches of input tensors .*, got str in batch 0"):
        quantized.calibrate(["abc"] * 16, steps=2)
    with pytest.raises(ValueError, match="calibration steps must be an integer >= 1, got 0"):
        quantized.calibrate([x] * 16, steps=0)
    quantized.calibrate([x] * 2, steps=2)
    out = quantized(x)
    assert out.shape == (2, 10) and not torch.equal(out, model(x))  # quantized, so not the float result


# ---- configs reaching the constructors ---------------------------------------------------------


@pytest.mark.parametrize(("name", "field", "value", "error", "message"), [
    ("vit-tiny", "std", [1e-300], ValueError, r"std must be a finite number in \[1e-12, 1000000000000.0\], got 1e-300"),
    ("vit-tiny", "std", [1e300], ValueError, "std must be a finite number in"),
    ("vit-tiny", "std", [0.0], ValueError, "std must be a finite number in"),
    ("vit-tiny", "mean", [1e300], ValueError, r"mean must be a finite number in \[-1000000.0, 1000000.0\], got 1e"),
    ("fused-1d-tiny", "mean", [float("nan")], ValueError, "mean must be a finite number"),
    ("vit-tiny", "final_norm", "no", TypeError, r"ImageTransformer final_norm must be true or false, got 'no' \(str\)"),
    ("vit-tiny", "learned_bias", 1, TypeError, r"learned_bias must be true or false, got 1 \(int\)"),
    ("fused-1d-tiny", "final_norm", "false", TypeError, "FusedAttentionNetwork final_norm must be true or false"),
    ("fused-1d-tiny", "patch_output", "yes", TypeError, "patch_output must be true or false"),
    ("fused-1d-tiny", "norm", 5, ValueError, r"norm must be one of \['softmax', 'softmax_one'\], got 5"),
    ("fused-1d-tiny", "fuse", ["max"], ValueError, r"fuse must be one of \['mean', 'max', 'learned'\], got \['max'\]"),
    ("vit-tiny", "mlp", 5, ValueError, r"ImageTransformer mlp must be one of \['mlp', 'ffn2'\], got 5"),
    ("gpt-tiny", "mlp", "ffn3", ValueError, "TextTransformer mlp must be one of"),
    ("gpt-tiny", "mlp_ratio", 1e-9, ValueError, r"mlp_ratio must give the MLP at least one hidden unit"),
    ("vit-tiny", "mlp_ratio", 1 / 256, ValueError, r"embed_dim \* mlp_ratio >= 1\), got embed_dim=128"),
    ("vit-tiny", "embed_dim", 10**5000, ValueError, "embed_dim must be between 1 and 2147483647, got an integer of"),
    ("vit-tiny", "mlp_ratio", 10**5000, ValueError, "mlp_ratio must be a finite number in .*, got an integer of"),
    ("fused-1d-tiny", "std", [10**5000], ValueError, "std must be a finite number in .*, got an integer of about 5001"),
    ("fused-1d-tiny", "label_names", "a" * 10**6, TypeError, r"label_names must be a list .* \(1,000,002 characters\)"),
], ids=short_id)
def test_constructor_arguments_are_checked(name, field, value, error, message):
    with pytest.raises(error, match=message) as e:
        zoo.create(name, **{field: value})
    one_line(e)


def test_the_smallest_hidden_width_still_builds():
    model = zoo.create("vit-tiny", depth=1, mlp_ratio=1 / 128).eval()  # one hidden unit
    assert model.blocks[0].mlp[0].out_features == 1
    assert model(torch.rand(2, 1, 28, 28)).shape == (2, 10)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("std", [1e-300], "std must be a finite number"),
    ("final_norm", "no", "final_norm must be true or false"),
    ("fuse", ["max"], "fuse must be one of"),
    ("mlp_ratio", 1e-9, "at least one hidden unit"),
])
def test_a_release_config_with_such_values_is_refused_naming_the_file(tmp_path, field, value, message):
    folder = zoo.create("fused-1d-tiny").save_pretrained(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    config["args"][field] = value
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(REFUSED, match=message) as e:
        zoo.load(folder)
    assert "config.json" in one_line(e)


# ---- evaluate_text -----------------------------------------------------------------------------


def _bpe_model(tokenizer):
    torch.manual_seed(1)
    return zoo.create("gpt-tiny", depth=1, embed_dim=32, num_heads=2, context_length=16,
                      vocab_size=tokenizer.vocab_size, tokenizer=tokenizer.to_dict()).eval()


@pytest.mark.parametrize(("training", "vocab_size", "text", "scored_bytes"), [
    # no merges: every token is one byte, and the first, b"\xe2", is a third of the euro sign (3 bytes): the
    # 8 bytes of "€ab é" (é is 2) less that one byte
    ("abc", 256, "€ab é", 7),
    # one merge, b"\xe2\x82" (the first two bytes of every subscript digit, and of €): the first token ends two
    # bytes into "€"; of the 9 bytes of "€ab\n€", 7 are predicted: b"\xac", "a", "b", "\n", b"\xe2\x82", b"\xac"
    ("₁₂₃₄₅₆₇₈₉", 257, "€ab\n€", 7),
])
def test_bits_per_byte_count_the_bytes_of_the_predicted_tokens(tmp_path, training, vocab_size, text, scored_bytes):
    pytest.importorskip("tokenizers")
    from zoo.models.tokenizer import BPETokenizer
    from zoo.training.evaluate import evaluate_text

    tokenizer = BPETokenizer.from_text(training, vocab_size=vocab_size)
    assert tokenizer.vocab_size == vocab_size  # the merges the counts above assume
    file = tmp_path / "t.txt"
    file.write_text(text, encoding="utf-8")
    got = evaluate_text(_bpe_model(tokenizer), file, context_length=16)
    assert got["bytes"] == scored_bytes
    assert got["bits_per_byte"] == pytest.approx(got["loss"] * got["tokens"] / math.log(2) / scored_bytes)


def test_evaluate_refuses_a_text_file_above_the_size_limit_before_reading_it(tmp_path, monkeypatch):
    from zoo.training import evaluate

    model = _bpe_model(CharTokenizer("ab\n"))
    file = tmp_path / "t.txt"
    file.write_text("ab\n" * 40)  # 120 bytes
    monkeypatch.setattr(evaluate, "MAX_TEXT_BYTES", 120)
    assert evaluate.evaluate_text(model, file)["bytes"] == 119
    monkeypatch.setattr(evaluate, "MAX_TEXT_BYTES", 119)
    monkeypatch.setattr("zoo.data.text.read_text", lambda *a: pytest.fail("read a file over the limit"))
    with pytest.raises(ValueError, match=r"t.txt holds 120 bytes, more than the limit of 119 bytes") as e:
        evaluate.evaluate_text(model, file)
    one_line(e)


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo"])
def test_evaluate_refuses_a_file_that_is_not_a_regular_file(tmp_path, kind):
    # /dev/zero was read until MemoryError; a FIFO without a writer blocked forever in open()
    from zoo.cli import main
    from zoo.training.evaluate import evaluate_text

    if kind == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("no named pipes here")
        path = tmp_path / "pipe"
        os.mkfifo(path)
        what = "a FIFO"
    else:
        if not os.path.exists(kind):
            pytest.skip("no /dev/zero here")
        path, what = kind, "a character device"
    model = _bpe_model(CharTokenizer("ab\n"))
    with pytest.raises(ValueError, match=rf"is not a regular file \({what}\); expected a UTF-8 text file of at most "
                                         r"1 GiB") as e:
        evaluate_text(model, path)
    one_line(e)
    with pytest.raises(SystemExit) as exit:
        main(["evaluate", "gpt-tiny.shakespeare", str(path)])
    assert str(exit.value).startswith(f"zoo evaluate: error: {path} is not a regular file ({what})")
