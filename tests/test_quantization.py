"""Outlier statistics and W8A8 fake quantization against formulas written out in float64."""

import json
import math

import pytest
import torch

import zoo
from zoo.quantization import W8A8, ActivationStats, fake_quantize_weight, pearson_kurtosis
from zoo.quantization.fake_quant import ActivationQuantizer, fake_quantize_activation


def kurtosis_by_hand(values: list[float]) -> float:
    n = len(values)
    mu = sum(values) / n
    m2 = sum((v - mu) ** 2 for v in values) / n
    m4 = sum((v - mu) ** 4 for v in values) / n
    return m4 / m2**2


def test_pearson_kurtosis_known_values():
    signs = torch.tensor([[1.0, -1.0] * 8])  # two points: the smallest kurtosis there is, 1
    spike = torch.zeros(1, 100)
    spike[0, 7] = 5.0  # one non-zero value among n: kurtosis (n^2 - 3n + 3) / (n - 1), whatever its size
    n = 100
    assert pearson_kurtosis(signs).item() == pytest.approx(1.0)
    assert pearson_kurtosis(spike).item() == pytest.approx((n**2 - 3 * n + 3) / (n - 1))
    assert pearson_kurtosis(spike).item() == pytest.approx(kurtosis_by_hand(spike[0].tolist()))
    gauss = torch.randn(4, 200_000, generator=torch.Generator().manual_seed(0))
    assert pearson_kurtosis(gauss).sub(3).abs().max() < 0.05  # a Gaussian gives 3 (Pearson's, not excess)
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(1))
    by_hand = [kurtosis_by_hand(x[i].flatten().double().tolist()) for i in range(3)]
    assert pearson_kurtosis(x).tolist() == pytest.approx(by_hand, rel=1e-12)  # one value per input


def test_activation_stats_match_a_manual_forward():
    torch.manual_seed(0)
    model = zoo.create("vit-tiny", img_size=28, in_chans=1, num_classes=10, depth=2).eval()
    x = torch.randn(5, 1, 28, 28)
    with torch.no_grad(), ActivationStats(model) as stats:
        logits = model(x)
    assert torch.equal(logits, model(x))  # watching changes nothing
    summary = stats.summary()
    tokens = model.embed_tokens(x)
    expected = {}
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            attn = block.attn(block.norm1(tokens))
            mid = tokens + attn
            mlp = block.mlp(block.norm2(mid))
            tokens = mid + mlp
            for name, out in ((f"blocks.{i}.attn", attn), (f"blocks.{i}.mlp", mlp), (f"blocks.{i}", tokens)):
                per_input = [kurtosis_by_hand(out[j].flatten().double().tolist()) for j in range(5)]
                expected[name] = (sum(per_input) / 5, out.abs().max().item())
    assert set(summary["layers"]) == set(expected) and summary["inputs"] == 5
    for name, (kurt, max_abs) in expected.items():
        assert summary["layers"][name]["kurtosis"] == pytest.approx(kurt, rel=1e-5)
        assert summary["layers"][name]["max_abs"] == pytest.approx(max_abs, rel=1e-6)
    assert summary["kurtosis"] == pytest.approx(sum(k for k, _ in expected.values()) / len(expected), rel=1e-5)
    assert summary["max_abs"] == pytest.approx(max(m for _, m in expected.values()), rel=1e-6)
    with pytest.raises(RuntimeError, match="saw no forward pass"):
        ActivationStats(model).summary()
    with pytest.raises(TypeError, match="needs a model with transformer blocks"):
        ActivationStats(torch.nn.Linear(3, 3))


def test_weight_fake_quantization_is_symmetric_min_max():
    w = torch.tensor([-1.0, 0.5, 0.25, 1.0, 0.003])
    q = fake_quantize_weight(w)
    scale = 1.0 / 127
    assert q.tolist() == pytest.approx([round(v / scale) * scale for v in w.tolist()], abs=1e-7)
    big = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    qb = fake_quantize_weight(big)
    s = big.abs().max().item() / 127
    levels = (qb / s).round()
    assert torch.allclose(qb / s, levels, atol=1e-4) and levels.abs().max() == 127  # integers, the max exact
    assert (qb - big).abs().max() <= s / 2 + 1e-6
    assert torch.equal(fake_quantize_weight(torch.zeros(3)), torch.zeros(3))


def test_activation_fake_quantization_is_asymmetric_with_a_zero_point():
    x = torch.tensor([-1.0, -0.2, 0.0, 1.7, 3.0, 9.0])  # 9 lies outside the range: clamped to its top
    q = fake_quantize_activation(x, -1.0, 3.0)
    scale, zero = 4.0 / 255, round(1.0 / (4.0 / 255))
    expected = [(min(max(round(v / scale) + zero, 0), 255) - zero) * scale for v in x.tolist()]
    assert q.tolist() == pytest.approx(expected, abs=1e-6)
    assert q[2].item() == 0.0  # zero stays exactly zero
    only_positive = fake_quantize_activation(torch.tensor([0.5, 2.0]), 0.5, 2.0)  # range widened to hold 0
    assert only_positive.tolist() == pytest.approx([round(0.5 / (2 / 255)) * 2 / 255, 2.0], abs=1e-6)


def test_running_min_max_is_an_exponential_moving_average():
    q = ActivationQuantizer(momentum=0.9)
    for batch in ([-1.0, 2.0], [-3.0, 1.0], [0.0, 10.0]):
        assert torch.equal(q(torch.tensor(batch)), torch.tensor(batch))  # estimating: passes through
    low, high = -1.0, 2.0
    for lo, hi in ((-3.0, 1.0), (0.0, 10.0)):
        low, high = 0.9 * low + 0.1 * lo, 0.9 * high + 0.1 * hi
    assert (q.low, q.high) == pytest.approx((low, high))
    uncalibrated = ActivationQuantizer()
    uncalibrated.estimating = False
    with pytest.raises(RuntimeError, match="never calibrated"):
        uncalibrated(torch.ones(2))


@pytest.mark.parametrize("name", ["vit-tiny", "gpt-tiny"])
def test_w8a8_quantizes_every_tensor_it_should_and_nothing_else(name):
    torch.manual_seed(0)
    kwargs = {"img_size": 28, "in_chans": 1, "num_classes": 10} if name == "vit-tiny" else {}
    model = zoo.create(name, depth=2, **kwargs).eval()
    make = (lambda: torch.randn(4, 1, 28, 28)) if name == "vit-tiny" else (lambda: torch.randint(0, 65, (2, 32)))
    original = {k: v.clone() for k, v in model.state_dict().items()}
    quantized = W8A8(model).calibrate(make() for _ in range(16))
    assert all(torch.equal(v, original[k]) for k, v in model.state_dict().items())  # a copy: the model untouched
    inner = quantized.model
    assert torch.equal(inner.head.weight, model.head.weight)  # the head stays float (and the tied embedding)
    for mod_name, module in inner.named_modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Conv2d)) and mod_name != "head":
            w = module.weight
            s = w.abs().max() / 127
            assert torch.allclose(w / s, (w / s).round(), atol=1e-3), mod_name  # on a 255-level grid
    # every residual sum and every linear output takes at most 256 values once quantized
    seen = {}
    for block_name in ("blocks.0", "blocks.1.after_attn", "blocks.1.mlp.2"):
        module = inner.get_submodule(block_name)
        module.register_forward_hook(lambda m, a, out, n=block_name: seen.__setitem__(n, out.detach()))
    x = make()
    out = quantized(x)
    for n, tensor in seen.items():
        assert tensor.unique().numel() <= 256, n
    float_out = model(x)
    assert out.shape == float_out.shape and not torch.equal(out, float_out)
    assert (out - float_out).abs().max() < 0.5 * float_out.abs().max()  # close, for an untrained model
    with pytest.raises(ValueError, match="calibration needs 16 batches, the data gave 3"):
        W8A8(model).calibrate(make() for _ in range(3))
    with pytest.raises(ValueError, match="keep_float names modules the model does not have"):
        W8A8(model, keep_float=("classifier",))


def test_track_outliers_logs_during_training(tmp_path):
    import lightning as L

    from zoo.data import Digits
    from zoo.training import ClassificationTask
    from zoo.training.outliers import TrackOutliers

    class Collect(L.pytorch.loggers.logger.DummyLogger):
        def __init__(self):
            super().__init__()
            self.logged = []

        def log_metrics(self, metrics, step=None):
            self.logged.append((step, dict(metrics)))

    logger = Collect()
    dm = Digits(batch_size=64)
    task = ClassificationTask("vit-tiny", {"depth": 1, "patch_size": 2, "embed_dim": 32, "num_heads": 2},
                              data_info=dm.data_info)
    trainer = L.Trainer(default_root_dir=tmp_path, accelerator="cpu", max_steps=6, logger=logger,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0,
                        callbacks=[TrackOutliers(every_n_steps=2, max_inputs=16, path=str(tmp_path / "o.jsonl"))])
    trainer.fit(task, dm)
    tracked = [(step, m) for step, m in logger.logged if "outliers/kurtosis" in m]
    assert [step for step, _ in tracked] == [2, 4, 6]
    assert all(m["outliers/kurtosis"] >= 1.0 and math.isfinite(m["outliers/max_abs"]) for _, m in tracked)
    assert task.model.training  # measured in eval mode, handed back in train mode
    lines = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [(line["step"], line["kurtosis"]) for line in lines] == [(s, m["outliers/kurtosis"]) for s, m in tracked]
    with pytest.raises(ValueError, match="every_n_steps must be an integer >= 1, got 0"):
        TrackOutliers(every_n_steps=0)


def test_bad_inputs_are_named_not_hidden(tmp_path):
    from zoo.training.outliers import TrackOutliers
    from zoo.training.timeline import Timeline

    torch.manual_seed(0)
    model = zoo.create("vit-tiny", img_size=28, in_chans=1, num_classes=10, depth=1).eval()
    x = torch.randn(2, 1, 28, 28)
    x[1, 0, 3, 3] = float("nan")
    with torch.no_grad(), ActivationStats(model) as stats:
        model(x)
    assert math.isnan(stats.summary()["max_abs"])  # a NaN activation shows, it is not dropped by max()
    broken = zoo.create("vit-tiny", img_size=28, in_chans=1, num_classes=10, depth=1)
    with torch.no_grad():
        broken.blocks[0].mlp[0].weight[0, 0] = float("inf")
    with pytest.raises(ValueError, match=r"blocks\.0\.mlp\.0\.weight holds NaN or inf"):
        W8A8(broken)
    with pytest.raises(ValueError, match="calibration saw NaN or inf activations"):
        W8A8(model).calibrate(x for _ in range(16))
    for cls in (Timeline, lambda path: TrackOutliers(path=path)):
        with pytest.raises(IsADirectoryError, match="is a folder"):
            cls(str(tmp_path))
        (tmp_path / "file").write_text("")
        with pytest.raises(NotADirectoryError, match="a part of its folder is a file"):
            cls(str(tmp_path / "file" / "log.jsonl"))
        (tmp_path / "notes.txt").write_text("my own notes\n")  # a file zoo did not write is never appended to
        with pytest.raises(FileExistsError, match="is not a JSON-lines file"):
            cls(str(tmp_path / "notes.txt"))
        assert (tmp_path / "notes.txt").read_text() == "my own notes\n"
        (tmp_path / "blank_first.txt").write_text("\nmy own notes\n")  # a blank first line hides nothing
        with pytest.raises(FileExistsError, match="is not a JSON-lines file"):
            cls(str(tmp_path / "blank_first.txt"))
        (tmp_path / "binary.bin").write_bytes(bytes(range(256)) * 512)  # no newline in the first 64 KiB
        with pytest.raises(FileExistsError, match="is not a JSON-lines file"):
            cls(str(tmp_path / "binary.bin"))
        for ours in ("", "\n", '{"step": 1}\n', "\n" + json.dumps({"x": "y" * 100_000}) + "\n"):  # ours, or empty
            (tmp_path / "ours.jsonl").write_text(ours)
            cls(str(tmp_path / "ours.jsonl"))
    for steps in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="calibration steps must be an integer >= 1"):
            W8A8(model).calibrate([x], steps)
