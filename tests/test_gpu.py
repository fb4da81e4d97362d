"""Every mechanism's eager route on CUDA, held to the same float64 formulas as on the CPU (tests/reference.py),
and decoding on CUDA without a host synchronization per token. Skipped, saying so, without a CUDA device:
`python -m pytest -m gpu` runs them where there is one."""

import pytest
import torch

import zoo
import zoo.attention as A
from tests import reference as ref
from tests.test_attention import make, reference  # the same layers and formulas as on the CPU

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")]


@pytest.mark.parametrize("name,causal", [("softmax", True), ("softmax", False), ("quiet", True), ("quiet", False),
                                         ("micro", True), ("micro", False), ("elita", True)])
def test_every_mechanism_on_cuda_matches_the_float64_formula(name, causal):
    layer = make(name, dim=16, heads=2, causal=causal)
    x = torch.randn(2, 11, 16)
    want = reference(name, layer, x)
    got = layer.cuda()(x.cuda()).double().cpu()
    torch.testing.assert_close(got, want, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["softmax", "quiet", "micro", "elita"])
def test_step_by_step_decoding_on_cuda_equals_the_parallel_forward(name):
    layer = make(name, dim=16, heads=2, causal=True).cuda()
    x = torch.randn(2, 9, 16, device="cuda")
    state, steps = None, []
    for t in range(x.shape[1]):
        y, state = layer.step(x[:, t : t + 1], state)
        steps.append(y)
    torch.testing.assert_close(torch.cat(steps, 1), layer(x), atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["softmax", "quiet", "micro"])
def test_padding_on_cuda_matches_the_formula(name):
    layer = make(name, dim=16, heads=2, causal=False)
    x = torch.randn(2, 7, 16)
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[1, 4:] = False
    want = reference(name, layer, x, mask)
    got = layer.cuda()(x.cuda(), key_padding_mask=mask.cuda()).double().cpu()
    torch.testing.assert_close(got[mask], want[mask], atol=5e-5, rtol=1e-4)


def test_fused_attention_on_cuda_matches_the_formula():
    layer = A.FusedAttention(16, heads=2)
    x = torch.randn(2, 9, 16)
    want, _ = ref.fused_attention(layer, x)
    torch.testing.assert_close(layer.cuda()(x.cuda()).double().cpu(), want, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["gpt-tiny", "quiet-gpt-tiny", "micro-gpt-tiny", "elita-gpt-tiny"])
def test_text_models_forward_and_decode_on_cuda_without_a_sync_per_token(name):
    model = zoo.create(name).eval()
    ids = torch.randint(0, model.vocab_size, (2, 24))
    with torch.no_grad():
        want = model(ids)
        model.cuda()
        torch.testing.assert_close(model(ids.cuda()).cpu(), want, atol=1e-4, rtol=1e-4)
        logits, states = model.forward_step(ids[:, :-1].cuda(), None)
        position = torch.tensor(ids.shape[1] - 1, device="cuda")  # as the exported step takes it
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")  # any host synchronization inside a decoding step raises
        try:
            last, states = model.forward_step(ids[:, -1:].cuda(), states, position)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.testing.assert_close(last[:, -1].cpu(), want[:, -1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["micro-vit-tiny", "fused-2d-tiny"])
def test_image_models_on_cuda_match_the_cpu(name):
    model = zoo.create(name).eval()
    x = torch.randn(3, *model.input_shape)
    with torch.no_grad():
        want = model(x)
        torch.testing.assert_close(model.cuda()(x.cuda()).cpu(), want, atol=1e-4, rtol=1e-4)


def test_a_capability_run_on_the_gpu_trains_and_tests_there_and_names_its_device():
    """bench/capabilities.py --accelerator gpu: the tiny MQAR run trains on the GPU, is tested where it trained
    and its record names the device; in float32 (TF32 matmuls) it lands near the same run on the CPU."""
    from bench import capabilities

    on_cpu = capabilities.run_one("mqar", "gpt-tiny", 0, tiny=True)
    on_gpu = capabilities.run_one("mqar", "gpt-tiny", 0, tiny=True, accelerator="gpu")
    assert "device" not in on_cpu and on_gpu["device"].startswith(f"cuda: {torch.cuda.get_device_name()}")
    assert on_gpu["metrics"]["test/loss"] == pytest.approx(on_cpu["metrics"]["test/loss"], rel=0.05)
