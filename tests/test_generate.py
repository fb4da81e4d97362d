"""Generation for real use (issue 23 item 6): batches of prompts of different lengths, left-padded and masked,
give each prompt's own tokens; stop tokens and strings; a padding mask in `TextTransformer.forward`; and the
KV cache that grows in place (quiet attention's zero key stored once). The references are independent of
the code under test: a full forward pass of each prompt alone (no cache, no padding), and the unstopped
continuation cut by hand."""

import functools

import pytest
import torch

import zoo
from zoo.attention import KVCache, build
from zoo.models.tokenizer import CharTokenizer

from .reference import greedy_by_recompute

CAUSAL = ["gpt-tiny", "quiet-gpt-tiny", "micro-gpt-tiny", "elita-gpt-tiny", "clipped-gpt-tiny", "gated-gpt-tiny"]
PROMPTS = [[5, 17, 3, 9, 22, 40, 1], [7], [11, 12, 13]]


@functools.cache
def sharp(name: str, context_length: int = 256, text: str | None = None):
    """A small model whose logits are far apart (a fresh one's differ by ~1e-3), so that greedy choices are
    not decided by rounding; with `text`, a character tokenizer of it. Built once per test run: tests only
    read it."""
    torch.manual_seed(0)
    kw = {}
    if text is not None:
        tok = CharTokenizer.from_text(text)
        kw = dict(vocab_size=tok.vocab_size, tokenizer=tok.to_dict())
    model = zoo.create(name, depth=2, context_length=context_length, **kw).eval()
    with torch.no_grad():
        model.tok_embed.weight.mul_(50)
    return model


@pytest.mark.parametrize("name", CAUSAL)
def test_left_padded_prompts_give_the_tokens_they_give_alone(name):
    model = sharp(name)
    got = model.generate(PROMPTS, 8, temperature=0)
    assert got == [greedy_by_recompute(model, p, 8) for p in PROMPTS]
    assert len({tuple(row[-8:]) for row in got}) == 3  # three different continuations: the rows did not mix


@pytest.mark.parametrize("name", ["gpt-tiny", "quiet-gpt-tiny", "elita-gpt-tiny"])
def test_padded_prompts_slide_past_learned_positions_as_alone(name):
    """Past context_length, the window of each row counts its own tokens (a prompt longer than the window too)."""
    model = sharp(name, context_length=8)
    prompts = [list(range(1, 11)), [7, 8], [30, 31, 32, 33, 34]]
    window = model.context_length if model.pos_kind == "learned" else None
    want = []
    for prompt in prompts:  # alone, through the tensor path (the old code path: no mask at all)
        want.append(model.generate(torch.tensor([prompt]), 10, temperature=0)[0].tolist())
    assert model.generate(prompts, 10, temperature=0) == want
    if window:  # and the alone path itself is the recompute over the last window tokens
        ids = list(prompts[1])
        with torch.no_grad():
            for _ in range(10):
                ids.append(int(model(torch.tensor([ids[-window:]]))[0, -1].argmax()))
        assert want[1] == ids


@pytest.mark.parametrize("name", CAUSAL)
def test_forward_with_a_padding_mask_gives_each_row_its_logits_alone(name):
    model = sharp(name)
    idx = torch.zeros(3, 7, dtype=torch.long)
    mask = torch.zeros(3, 7, dtype=torch.bool)
    for row, prompt in enumerate(PROMPTS):
        idx[row, 7 - len(prompt):], mask[row, 7 - len(prompt):] = torch.tensor(prompt), True
    noisy = idx.masked_fill(~mask, 60)  # what the padding holds does not matter
    with torch.no_grad():
        a, b = model(idx, key_padding_mask=mask), model(noisy, key_padding_mask=mask)
        for row, prompt in enumerate(PROMPTS):
            alone = model(torch.tensor([prompt]))[0]
            torch.testing.assert_close(a[row, 7 - len(prompt):], alone, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(a[mask], b[mask], atol=1e-4, rtol=1e-4)
        with pytest.raises(ValueError, match=r"key_padding_mask of shape \(3, 7\)"):
            model(idx, key_padding_mask=mask[:, 1:])


def test_a_list_of_strings_returns_a_list_of_strings():
    text = "to be or not to be, that is the question\n"
    model = sharp("micro-gpt-tiny", text=text)
    got = model.generate(["to be", "or", "that is the"], 10, temperature=0)
    assert got == [model.generate(p, 10, temperature=0) for p in ["to be", "or", "that is the"]]
    assert [len(t) for t in got] == [15, 12, 21] and got[1].startswith("or")


def test_the_cli_continues_every_prompt_given(capsys):
    # `zoo generate --prompt a --prompt b` continued only b
    from zoo.cli.generate import generate_command

    model = zoo.load("gpt-tiny.shakespeare")
    prompts = ["ROMEO:", "To be", "O"]
    argv = ["gpt-tiny.shakespeare", "--max-new-tokens", "12", "--temperature", "0"]
    generate_command([*argv, *(arg for p in prompts for arg in ("--prompt", p))])
    want = [model.generate(p, 12, temperature=0) for p in prompts]
    # in the order given, each on lines of its own, a line of 40 dashes between two
    assert capsys.readouterr().out == ("\n" + "-" * 40 + "\n").join(want) + "\n"
    generate_command([*argv, "--prompt", "To be"])  # one prompt: its continuation alone, as before
    assert capsys.readouterr().out == want[1] + "\n"


def test_stop_tokens_end_each_row_at_its_first_stop_which_it_keeps():
    model = sharp("gpt-tiny")
    full = [model.generate(p, 30, temperature=0)[0].tolist() for p in PROMPTS]  # unstopped, alone
    stop = full[0][len(PROMPTS[0]) + 3]  # row 0's fourth new token
    want = []
    for prompt, row in zip(PROMPTS, full):
        new = row[len(prompt):]
        want.append(prompt + (new[:new.index(stop) + 1] if stop in new else new))
    assert model.generate(PROMPTS, 30, temperature=0, stop=stop) == want
    assert model.generate(PROMPTS, 30, temperature=0, stop=[stop, 64]) == [
        p + (r[len(p):][:min([r[len(p):].index(s) + 1 for s in (stop, 64) if s in r[len(p):]], default=30)])
        for p, r in zip(PROMPTS, full)]


def test_decoding_ends_when_every_row_has_stopped(monkeypatch):
    model = sharp("gpt-tiny")
    first = greedy_by_recompute(model, PROMPTS[1], 1)[-1]
    calls = []
    step = model.forward_step
    monkeypatch.setattr(model, "forward_step", lambda *a, **k: calls.append(1) or step(*a, **k))
    got = model.generate([PROMPTS[1]], 100_000, temperature=0, stop=first)
    assert got == [PROMPTS[1] + [first]] and len(calls) == 1  # the prefill only: its first token stopped it


def test_a_tensor_result_fills_a_row_after_its_stop_with_minus_one():
    model = sharp("gpt-tiny")
    prompts = torch.tensor([PROMPTS[2], [20, 21, 22]])
    full = model.generate(prompts, 15, temperature=0)
    stop = int(full[0, 3 + 2])  # row 0's third new token
    rows = [r[3:].tolist() for r in full]
    ends = [r.index(stop) + 1 if stop in r else 15 for r in rows]
    got = model.generate(prompts, 15, temperature=0, stop=stop)
    assert got.shape == (2, 3 + max(ends))
    for row, end in enumerate(ends):
        assert got[row, :3 + end].tolist() == full[row, :3 + end].tolist()
        assert (got[row, 3 + end:] == -1).all()


def test_what_generate_returns_is_an_ordinary_tensor_to_write_into_and_train_on():
    # it decodes under inference_mode, whose tensors refuse in-place writes and autograd outside it
    model = zoo.create("gpt-tiny", depth=1, vocab_size=30, context_length=16)
    got = model.generate(torch.tensor([[1, 2, 3]]), 4, temperature=0)
    assert not got.is_inference()
    got[0, 0] = 4
    model(got).sum().backward()
    assert model.tok_embed.weight.grad is not None


def test_stop_strings_cut_the_text_right_after_them():
    text = "to be or not to be, that is the question\n"
    model, tok = sharp("gpt-tiny", text=text), CharTokenizer.from_text(text)
    full = model.generate("to be", 20, temperature=0)
    new = full[len("to be"):]
    stop = new[5:7]
    assert model.generate("to be", 20, temperature=0, stop=stop) == "to be" + new[:new.index(stop) + 2]
    # as ids, the row ends with the token that completed the string
    ids = model.generate([tok.encode("to be")], 20, temperature=0, stop=stop)[0]
    assert tok.decode(ids) == "to be" + new[:new.index(stop) + 2]
    # a stop string found only across the prompt's end is not a stop
    assert model.generate("to be", 20, temperature=0, stop="be" + new[0]) == full


@pytest.mark.parametrize("stop,error,message", [
    (-1, ValueError, r"stop \(a token id or a non-empty string\) must be between 0 and 64, got -1"),
    (65, ValueError, "must be between 0 and 64, got 65"),
    (1.5, TypeError, "must be an integer, got 1.5"),
    (True, TypeError, "must be an integer, got True"),
    ("", TypeError, "must be an integer, got ''"),
    ("\n", ValueError, "stop strings need a model with a tokenizer"),
])
def test_bad_stops_are_refused_before_decoding(stop, error, message):
    with pytest.raises(error, match=message):
        sharp("micro-gpt-tiny").generate([1, 2], 3, temperature=0, stop=stop)


@pytest.mark.parametrize("prompts,error,message", [
    ([[1, 2], []], ValueError, "needs prompt 1 of at least one token"),
    ([[1, 2], [3, 65]], ValueError, r"token ids must lie in \[0, 65\), got \[3, 65\] in prompt 1"),
    ([[1, 2], [1.5]], TypeError, "token ids must be integers, got torch.float32"),
    (["ab", [1]], TypeError, "all strings or all id lists"),
    ([[1, 2], 3], TypeError, "all strings or all id lists"),
])
def test_bad_batches_of_prompts_are_refused(prompts, error, message):
    with pytest.raises(error, match=message):
        sharp("micro-gpt-tiny").generate(prompts, 3, temperature=0)


def test_forward_step_refuses_a_start_of_the_wrong_shape():
    model = sharp("gpt-tiny")
    _, states = model.forward_step(torch.tensor([[1, 2], [3, 4]]))
    with pytest.raises(ValueError, match=r"one per row \(2, 1\), got \(2,\) torch.int64"):
        model.forward_step(torch.tensor([[5], [6]]), states, torch.tensor([2, 2]))
    with pytest.raises(ValueError, match="got \\(2, 1\\) torch.float32"):
        model.forward_step(torch.tensor([[5], [6]]), states, torch.full((2, 1), 2.0))


# ---- the KV cache ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["softmax", "quiet"])
def test_the_cache_grows_in_place_by_doubling(mechanism):
    layer = build(mechanism, 16, heads=2, causal=True).eval()
    x = torch.randn(2, 300, 16)
    zero = mechanism == "quiet"
    with torch.no_grad():
        want = layer(x)
        out, state = layer.step(x[:, :3])
        outs, buffers = [out], set()
        for t in range(3, 300):
            out, state = layer.step(x[:, t:t + 1], state)
            outs.append(out)
            buffers.add(state.keys.data_ptr())
    torch.testing.assert_close(torch.cat(outs, 1), want, atol=1e-5, rtol=1e-5)
    assert state.length == 300 + zero and state.keys.shape[-2] >= state.length
    # 3 -> 6 -> 12 -> ... -> 384 slots: 7 buffers for 297 steps, each token copied about twice in all
    assert len(buffers) == 7
    if zero:  # quiet's zero key and value sit in slot 0, once; every later slot is a token's
        assert not state.keys[:, :, 0].any() and not state.values[:, :, 0].any()
        assert state.keys[:, :, 1:state.length].abs().sum(-1).gt(0).all()


@pytest.mark.parametrize("mechanism", ["softmax", "quiet", "clipped", "gated"])
def test_two_continuations_of_one_cache_do_not_overwrite_each_other(mechanism):
    layer = build(mechanism, 16, heads=2, causal=True).eval()
    prefix, a, b = torch.randn(1, 5, 16), torch.randn(1, 2, 16), torch.randn(1, 2, 16)
    with torch.no_grad():
        _, state = layer.step(prefix)
        _, state = layer.step(prefix[:, :1], state)  # room to spare now: the buffers doubled to 12 slots
        seen = torch.cat([prefix, prefix[:, :1]], 1)
        out_a1, state_a = layer.step(a[:, :1], state)
        out_b, _ = layer.step(b, state)  # writes where branch a wrote: it must get buffers of its own
        out_a2, _ = layer.step(a[:, 1:], state_a)
        full_a, full_b = layer(torch.cat([seen, a], 1)), layer(torch.cat([seen, b], 1))
    torch.testing.assert_close(torch.cat([out_a1, out_a2], 1), full_a[:, -2:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_b, full_b[:, -2:], atol=1e-5, rtol=1e-5)


def test_a_cache_the_caller_built_is_never_written():
    layer = build("softmax", 16, heads=2, causal=True).eval()
    keys, values = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    kept = keys.clone(), values.clone()
    with torch.no_grad():
        _, state = layer.step(torch.randn(1, 1, 16), KVCache(keys, values))
    assert torch.equal(keys, kept[0]) and torch.equal(values, kept[1]) and state.length == 5


def test_a_cache_with_a_mask_of_the_wrong_shape_is_refused():
    layer = build("softmax", 16, heads=2, causal=True).eval()
    with torch.no_grad():
        _, state = layer.step(torch.randn(2, 3, 16), key_padding_mask=torch.tensor([[True] * 3, [False, True, True]]))
    assert state.mask.shape == (2, 3)
    state.mask = state.mask[:, :2]
    with pytest.raises(ValueError, match=r"state.mask must be None or a bool tensor of shape \(2, 3\)"):
        layer.step(torch.randn(2, 1, 16), state)


def test_a_learned_bias_refuses_padded_decoding_before_writing_the_cache():
    layer = build("softmax", 16, heads=2, causal=True, max_len=8, learned_bias=True).eval()
    with torch.no_grad():
        _, state = layer.step(torch.randn(2, 3, 16), key_padding_mask=torch.tensor([[True] * 3, [False, True, True]]))
        kept = state.keys.clone()
        with pytest.raises(ValueError, match="learned bias over absolute positions"):
            layer.step(torch.randn(2, 1, 16), state)
    assert state.length == 3 and torch.equal(state.keys, kept)
