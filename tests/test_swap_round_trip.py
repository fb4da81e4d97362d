"""What `swap` builds survives saving: swap, save_pretrained, zoo.load gives the same outputs, or the save
refuses in one line. For every registered tiny architecture of each family and every mechanism swap offers.

A comparison of weight names and shapes cannot see a mechanism with softmax's shapes (quiet, clipped): the
config must say what each block is, and the save checks each module's class and settings against what the
config builds.
"""

import re

import pytest
import torch

import zoo
from zoo.attention import MIXERS, swap
from zoo.models.registry import _entries

TINY = sorted(name for name in _entries() if name.endswith("-tiny"))
# Options a user might give, so that they too must reach the config (clipped's alpha differs from its default)
OPTIONS = {"clipped": {"alpha": 2.0}, "micro": {"num_queries": 2}}


def _inputs(model) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    if hasattr(model, "vocab_size"):
        return torch.randint(0, model.vocab_size, (2, 12), generator=generator)
    return torch.randn(2, *model.input_shape, generator=generator)


def _round_trip(name: str, mechanism: str, tmp_path, **options):
    """(the swapped model, the model loaded from its folder), or (the model, the save's refusal)."""
    model = zoo.create(name).eval()
    swap(model, mechanism, **options)
    try:
        model.save_pretrained(tmp_path / "swapped")
    except ValueError as refusal:
        return model, refusal
    return model, zoo.load(str(tmp_path / "swapped")).eval()


@pytest.mark.parametrize("mechanism", list(MIXERS))
@pytest.mark.parametrize("name", TINY)
def test_swap_save_load_gives_the_same_outputs_or_refuses(name, mechanism, tmp_path):
    torch.manual_seed(0)
    try:
        model, loaded = _round_trip(name, mechanism, tmp_path, **OPTIONS.get(mechanism, {}))
    except ValueError as refusal:  # swap itself refuses (elita in a bidirectional model): one line, naming why
        assert "\n" not in str(refusal) and mechanism in str(refusal)
        return
    if isinstance(loaded, ValueError):
        message = str(loaded)
        assert "\n" not in message and "cannot be saved" in message and re.search(r"blocks\.\d+\.attn", message)
        assert not (tmp_path / "swapped").exists(), "a refused save leaves no folder"
        return
    x = _inputs(model)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    assert [type(m) for m in loaded.modules()] == [type(m) for m in model.modules()]


# The swaps that every user of these families expects to save: each must round-trip, not refuse.
SAVED = [("gpt-tiny", "quiet", {}), ("gpt-tiny", "clipped", {"alpha": 2.0}), ("gpt-tiny", "incontext", {}),
         ("gpt-tiny", "micro", {}), ("quiet-gpt-tiny", "softmax", {}), ("micro-gpt-tiny", "elita", {"max_len": 256}),
         ("vit-tiny", "quiet", {}), ("vit-tiny", "clipped", {"alpha": 2.0}), ("vit-tiny", "gated", {}),
         ("vit-tiny", "micro", {}), ("fused-2d-tiny", "quiet", {}), ("hybrid-elita-gpt-tiny", "softmax", {})]


@pytest.mark.parametrize("name, mechanism, options", SAVED)
def test_common_swaps_save_and_load_as_the_swapped_model(name, mechanism, options, tmp_path):
    torch.manual_seed(0)
    original = zoo.create(name).eval()
    model, loaded = _round_trip(name, mechanism, tmp_path, **options)
    assert not isinstance(loaded, Exception), loaded
    x = _inputs(model)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
        if mechanism not in original.config["attention"]:  # the swap changed the function, and the load kept it
            assert (loaded(x) - original(x)).abs().max() > 1e-6
    attention = loaded.config["attention"]
    assert (attention == mechanism) if isinstance(attention, str) else all(a == mechanism for a in attention)


def test_a_swapped_pretrained_model_loads_as_swapped(tmp_path):
    """The case that once came back as softmax: gpt-tiny.shakespeare swapped to quiet."""
    model = swap(zoo.load("gpt-tiny.shakespeare").eval(), "quiet")
    model.save_pretrained(tmp_path / "quiet")
    loaded = zoo.load(str(tmp_path / "quiet")).eval()
    assert loaded.config["attention"] == "quiet"
    ids = torch.randint(0, model.vocab_size, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)


def test_a_module_changed_by_hand_is_refused(tmp_path):
    """A block replaced by hand (not by swap) with softmax's shapes: the save refuses instead of writing softmax."""
    from zoo.attention import QuietAttention

    model = zoo.create("gpt-tiny")
    block = model.blocks[1]
    quiet = QuietAttention(block.attn.dim, heads=block.attn.heads, causal=True)
    quiet.load_state_dict(block.attn.state_dict())
    block.attn = quiet
    with pytest.raises(ValueError, match=r"blocks\.1\.attn is a QuietAttention, but its config builds a "
                                         r"SoftmaxAttention"):
        model.save_pretrained(tmp_path / "hand")
    model = zoo.create("clipped-gpt-tiny")
    model.blocks[0].attn.alpha = 8.0  # a setting the weights do not carry
    with pytest.raises(ValueError, match=r"blocks\.0\.attn is a ClippedSoftmaxAttention with alpha=8\.0"):
        model.save_pretrained(tmp_path / "hand")


def test_a_swap_inside_a_wrapper_records_in_the_model(tmp_path):
    """swap given a module that holds a zoo model (a Lightning task, a Sequential) records in the model."""
    wrapper = torch.nn.Sequential(zoo.create("gpt-tiny"))
    swap(wrapper, "quiet")
    assert wrapper[0].config["attention"] == "quiet"
    wrapper[0].save_pretrained(tmp_path / "inner")
    assert zoo.load(str(tmp_path / "inner")).config["attention"] == "quiet"


def test_a_partial_swap_is_recorded_per_block(tmp_path):
    model = zoo.create("gpt-tiny").eval()
    swap(model.blocks[2], "quiet")  # the block alone: the model's config cannot know, so the save refuses
    with pytest.raises(ValueError, match=r"blocks\.2\.attn is a QuietAttention"):
        model.save_pretrained(tmp_path / "partial")
    model = zoo.create("gpt-tiny").eval()
    swap(model, "micro")
    swap(model, "quiet")  # micro has no q, k, v: quiet starts fresh, and the config follows each swap
    assert model.config["attention"] == "quiet"
