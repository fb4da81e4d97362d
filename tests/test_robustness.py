"""Safe at every boundary (docs/robustness.md): files, kernels, configs, inputs, masks, the Hub, the CLI.

Every test here feeds zoo something bad, or kills it half-way, and asserts one of two
outcomes: the right answer (checked against an independent reference), or a ValueError /
TypeError / OSError whose message names what to change. Never another exception, a
crash, a lost file or a silently wrong number.
"""

import json
import math
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import zoo
from zoo.attention import ElitaState, KVCache, MicroState, build, native

ROOT = Path(__file__).resolve().parents[1]
REFUSED = (ValueError, TypeError)


def siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir())


def marked(value: float) -> torch.nn.Module:
    """A small model whose every parameter is `value` and whose label names say so: a version to recognise."""
    model = zoo.create("fused-1d-tiny", label_names=[str(value)] * 10)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
    return model


def version_of(model) -> float:
    """The value a `marked` model was saved with; fails if config and weights come from different saves."""
    values = {float(v) for p in model.parameters() for v in p.detach().unique()}
    assert len(values) == 1, values
    (value,) = values
    assert model.config["label_names"][0] == str(value)
    return value


# ---- 1. never touch what zoo did not write ---------------------------------------------------


def test_save_refuses_a_folder_that_zoo_did_not_write(tmp_path):
    mine = tmp_path / "photos"
    mine.mkdir()
    (mine / "holiday.jpg").write_bytes(b"precious")
    with pytest.raises(FileExistsError, match=r"photos holds files that are not a zoo release folder \(holiday.jpg\)"):
        zoo.create("fused-1d-tiny").save_pretrained(mine)
    assert (mine / "holiday.jpg").read_bytes() == b"precious"
    assert siblings(mine) == ["photos"]


def test_save_refuses_a_file_and_a_symlink(tmp_path):
    file = tmp_path / "notes.txt"
    file.write_text("keep me")
    with pytest.raises(FileExistsError, match="notes.txt is a file"):
        zoo.create("fused-1d-tiny").save_pretrained(file)
    assert file.read_text() == "keep me" and siblings(file) == ["notes.txt"]
    target = zoo.create("fused-1d-tiny").save_pretrained(tmp_path / "real")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(FileExistsError, match="is a symbolic link"):
        zoo.create("fused-1d-tiny").save_pretrained(tmp_path / "link")


def test_save_replaces_only_its_own_release_and_overwrite_false_keeps_it(tmp_path):
    folder = marked(1.0).save_pretrained(tmp_path / "m")
    marked(2.0).save_pretrained(folder)  # a release folder zoo wrote: replaced
    assert version_of(zoo.load(folder)) == 2.0
    with pytest.raises(FileExistsError, match="pass --overwrite"):
        marked(3.0).save_pretrained(folder, overwrite=False)
    assert version_of(zoo.load(folder)) == 2.0
    (folder / "extra.txt").write_text("a user's file")  # no longer only release files: never replaced
    with pytest.raises(FileExistsError, match="extra.txt"):
        marked(3.0).save_pretrained(folder)
    assert (folder / "extra.txt").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert version_of(zoo.load(marked(4.0).save_pretrained(empty))) == 4.0


def test_export_refuses_the_folder_that_holds_its_checkpoint(tmp_path):
    from zoo.cli import main

    ckdir = tmp_path / "ckdir"
    ckdir.mkdir()
    (ckdir / "best.ckpt").write_bytes(b"the only copy")
    with pytest.raises(SystemExit, match="overlaps the checkpoint it exports"):
        main(["export", str(ckdir / "best.ckpt"), str(ckdir)])
    assert (ckdir / "best.ckpt").read_bytes() == b"the only copy"
    with pytest.raises(SystemExit, match="no checkpoint file at"):
        main(["export", str(tmp_path / "missing.ckpt"), str(tmp_path / "out")])


def test_fit_refuses_an_export_folder_that_is_or_holds_the_run(tmp_path):
    from zoo.release.callback import ExportRelease

    root = tmp_path / "R"
    trainer = SimpleNamespace(default_root_dir=str(root), log_dir=str(root / "lightning_logs" / "version_0"),
                              checkpoint_callback=SimpleNamespace(dirpath=str(root / "checkpoints" / "run")))
    for dirpath in (root, root / "checkpoints", root / "lightning_logs", tmp_path):
        with pytest.raises(ValueError, match="overlaps"):
            ExportRelease(dirpath=str(dirpath)).setup(trainer, None, "fit")
    for beside in (tmp_path / "elsewhere", root / "release"):  # apart from what the run keeps: fine
        ExportRelease(dirpath=str(beside)).setup(trainer, None, "fit")


def test_a_failure_at_any_step_of_a_save_keeps_the_old_release_and_leaves_nothing(tmp_path, monkeypatch):
    import safetensors.torch

    import zoo.utils.atomic

    folder = marked(1.0).save_pretrained(tmp_path / "m")

    def boom(*args, **kwargs):
        raise OSError("injected fault")

    faults = [(Path, "write_text"), (safetensors.torch, "save_model"), (zoo.utils.atomic, "_exchange")]
    for owner, name in faults:
        with monkeypatch.context() as mp:
            mp.setattr(owner, name, boom)
            with pytest.raises(OSError, match="injected fault"):
                marked(2.0).save_pretrained(folder)
        assert version_of(zoo.load(folder)) == 1.0, name
        assert siblings(folder) == ["m"], name


WRITER = textwrap.dedent("""
    import sys, torch, zoo
    folder, values, rounds = sys.argv[1], [float(v) for v in sys.argv[2].split(",")], int(sys.argv[3])
    models = []
    for value in values:
        m = zoo.create("fused-1d-tiny", label_names=[str(value)] * 10)
        with torch.no_grad():
            for p in m.parameters():
                p.fill_(value)
        models.append(m)
    print("ready", flush=True)
    for i in range(rounds):
        models[i % len(models)].save_pretrained(folder)
""")


@pytest.mark.slow  # 12 s of saving and killing
def test_saves_killed_at_random_points_keep_a_loadable_release(tmp_path):
    folder = marked(1.0).save_pretrained(tmp_path / "m")
    rng = random.Random(0)
    for _ in range(4):
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(folder), "2.0,3.0", "100000"],
                                  stdout=subprocess.PIPE, text=True)
        assert writer.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.05, 0.6))
        writer.send_signal(signal.SIGKILL)
        writer.wait(30)
        assert version_of(zoo.load(folder)) in (1.0, 2.0, 3.0)
    marked(4.0).save_pretrained(folder)  # the next save sweeps away what killed saves left
    assert siblings(folder) == ["m"]
    assert version_of(zoo.load(folder)) == 4.0


def test_concurrent_readers_and_writers_see_whole_releases(tmp_path):
    """Two writer processes save over one release while this process, already warm, loads it in a loop."""
    folder = marked(1.0).save_pretrained(tmp_path / "m")
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(folder), values, "30"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for values in ("2.0,3.0", "4.0")]
    seen, errors, deadline = {}, [], time.monotonic() + 300  # a hung writer fails below, not hangs the suite
    while any(w.poll() is None for w in writers) and time.monotonic() < deadline:
        try:
            m = zoo.load(folder)
            values = {float(v) for p in m.parameters() for v in p.detach().unique()}
            label = m.config["label_names"][0]
            key = "mixed" if len(values) != 1 or label != str(next(iter(values))) else label
            seen[key] = seen.get(key, 0) + 1
        except Exception as e:  # noqa: BLE001  (every failure is reported below)
            errors.append(f"{type(e).__name__}: {e}")
    for w in writers:
        _, err = w.communicate(timeout=300)
        assert w.returncode == 0, err[-2000:]
    assert errors == [], errors[:5]
    # Every load is one whole version. Whether this reader happened to catch a swap is up to the
    # scheduler; the swap under a reader is forced in the next test.
    assert "mixed" not in seen and sum(seen.values()) > 10, seen
    assert siblings(folder) == ["m"]


@pytest.mark.parametrize("swap_after", ["config.json", "model.safetensors"])
def test_a_release_swapped_between_a_readers_opens_is_read_whole(tmp_path, monkeypatch, swap_after):
    """The overlap forced: a writer swaps a new version in just after the reader opened `swap_after`.
    Opened only the config: the old folder is gone, so the reader reads the new version whole; opened
    both files: it reads the old version whole from its handles."""
    import os

    folder = marked(1.0).save_pretrained(tmp_path / "m")
    real_open, swaps = os.open, []

    def open_then_swap(path, flags, mode=0o777, *, dir_fd=None):
        fd = real_open(path, flags, mode, dir_fd=dir_fd)
        if dir_fd is not None and path == swap_after and not swaps:  # the reader's open through its folder handle
            swaps.append(path)
            marked(2.0).save_pretrained(folder)
        return fd

    monkeypatch.setattr(os, "open", open_then_swap)
    monkeypatch.setattr(os, "supports_dir_fd", os.supports_dir_fd | {open_then_swap})
    assert version_of(zoo.load(folder)) == (2.0 if swap_after == "config.json" else 1.0)
    assert swaps == [swap_after]
    monkeypatch.undo()
    assert version_of(zoo.load(folder)) == 2.0
    assert siblings(folder) == ["m"]


# ---- 2. kernels validate everything they index ----------------------------------------------


def kernels():
    k = native.load()
    if k is None:
        pytest.skip("no compiled kernels on this machine")
    return k


def test_micro_scan_kernel_refuses_mismatched_tensors():
    k = kernels()
    b, n, h, d = 2, 3, 4, 5
    good = [torch.randn(b, n, h, d), torch.rand(b, n, h), torch.randn(b, h, d), torch.rand(b, h)]
    k.micro_scan_forward(*good)
    bad = {0: torch.randn(b, n, h), 1: torch.rand(b, n + 1, h), 2: torch.randn(b + 1, h, d), 3: torch.rand(b, h + 1),
           4: torch.randn(b, h, d).double()}
    for i, tensor in bad.items():
        args = list(good)
        args[min(i, 2)] = tensor
        with pytest.raises(ValueError, match="micro_scan_forward: .* must"):
            k.micro_scan_forward(*args)
    outs = k.micro_scan_forward(*good)
    grads = [torch.randn_like(o) for o in outs]
    k.micro_scan_backward(*grads, *good)
    for i in range(3):
        wrong = list(grads)
        wrong[i] = torch.randn(*grads[i].shape[:-1], grads[i].shape[-1] + 1)
        with pytest.raises(ValueError, match=r"micro_scan_backward: g\w+ must have shape"):
            k.micro_scan_backward(*wrong, *good)
    with pytest.raises(ValueError, match="must be contiguous"):
        k.micro_scan_forward(good[0].transpose(0, 1).contiguous().transpose(0, 1), *good[1:])


def test_elita_scan_kernel_refuses_mismatched_tensors():
    k = kernels()
    b, n, h, d = 2, 3, 4, 5
    good = [torch.randn(b, n, h), torch.randn(b, n, h), torch.randn(b, n, h, d), torch.randn(b, h),
            torch.randn(b, h, d)]
    outs = k.elita_scan_forward(*good)
    for i, tensor in enumerate([torch.randn(b, n + 1, h), torch.randn(b, n, h + 1), torch.randn(b, n, h, d + 1),
                                torch.randn(b + 1, h), torch.randn(b, h, d - 1)]):
        args = list(good)
        args[i] = tensor
        with pytest.raises(ValueError, match="elita_scan_forward: .* must have shape"):
            k.elita_scan_forward(*args)
    grads = [torch.randn_like(o) for o in outs]
    k.elita_scan_backward(*grads, *good)
    with pytest.raises(ValueError, match="elita_scan_backward: gM_last must have shape"):
        k.elita_scan_backward(grads[0], grads[1], torch.randn(b, h, d + 3), *good)
    with pytest.raises(ValueError, match="must be Float"):
        k.elita_scan_forward(good[0].int(), *good[1:])
    with pytest.raises(ValueError, match="softmax_one_lastdim: x must be Float"):
        k.softmax_one_lastdim(torch.randn(3, 4, dtype=torch.float64))


def test_incontext_bias_kernel_refuses_mismatched_tensors():
    k = kernels()
    b, h, n, positions = 2, 3, 5, 4
    good = [torch.rand(b, h, n), torch.rand(b, h, n), torch.randn(b, h, n, positions)]
    bias = k.incontext_bias_forward(*good, True)
    for i, tensor in enumerate([torch.rand(b, h + 1, n), torch.rand(b + 1, h, n), torch.randn(b, h, n, positions)[0]]):
        args = list(good)
        args[i] = tensor
        with pytest.raises(ValueError, match=r"incontext_bias_forward: \w+ must have"):
            k.incontext_bias_forward(*args, True)
    with pytest.raises(ValueError, match="at least as long as ends"):
        k.incontext_bias_forward(good[0], torch.rand(b, h, 3), good[2], True)
    with pytest.raises(ValueError, match="as many keys as queries, got 5 keys and 3 queries"):
        k.incontext_bias_forward(torch.rand(b, h, 3), good[1], torch.randn(b, h, 3, positions), False)
    with pytest.raises(ValueError, match="must be Float"):
        k.incontext_bias_forward(good[0].double(), *good[1:], True)
    with pytest.raises(ValueError, match="must be contiguous"):
        k.incontext_bias_forward(*good[:2], good[2].transpose(1, 2).contiguous().transpose(1, 2), True)
    k.incontext_bias_backward(torch.randn_like(bias), *good, True)
    # NaN gate sums (NaN activations) give NaN, never an index outside the table (rows longer than a vector too)
    ends, starts = torch.full((b, h, 40), math.nan), torch.rand(b, h, 40)
    bias = k.incontext_bias_forward(ends, starts, torch.randn(b, h, 40, positions), False)
    assert bias.isnan().all()
    grads = k.incontext_bias_backward(torch.ones_like(bias), ends, starts, torch.randn(b, h, 40, positions), False)
    assert grads[2].isnan().any()
    # infinite counts read the table's ends: +inf its last entry, -inf its first
    tables = torch.randn(b, h, 40, positions)
    bias = k.incontext_bias_forward(torch.full((b, h, 40), math.inf), starts, tables, False)
    assert torch.equal(bias[..., :, 0], tables[..., -1])
    bias = k.incontext_bias_forward(torch.full((b, h, 40), -math.inf), starts, tables, True)
    assert torch.equal(bias[..., :, 0], tables[..., 0])
    with pytest.raises(ValueError, match="incontext_bias_backward: grad must have shape"):
        k.incontext_bias_backward(torch.randn(b, h, n, n + 1), *good, True)
    with pytest.raises(ValueError, match="tables must have at least one position, got 0"):
        k.incontext_bias_forward(*good[:2], torch.randn(b, h, n, 0), True)


def test_incontext_bias_gradient_of_an_unused_bias_is_zero():
    """Autograd may hand a custom op's backward None for an output nobody used: no gradient reaches the inputs."""
    from types import SimpleNamespace

    from zoo.attention import native

    kernels()
    ends, starts, tables = torch.rand(2, 3, 4), torch.rand(2, 3, 6), torch.randn(2, 3, 4, 5)
    ctx = SimpleNamespace(saved_tensors=(ends, starts, tables), causal=True)
    *grads, none = native._incontext_bias_grads(ctx, None)
    assert none is None
    for grad, tensor in zip(grads, (ends, starts, tables)):
        assert grad.shape == tensor.shape and not grad.any()


# The route fixture is set once per test and is the same for every example: nothing to reset.
same_route_for_every_example = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(params=["kernel", "eager"])
def both_routes(request, monkeypatch):
    if request.param == "eager":
        monkeypatch.setattr(native, "load", lambda: None)
    return request.param


STATE_DIMS = st.tuples(st.integers(1, 4), st.integers(1, 5), st.integers(1, 6))


@pytest.mark.parametrize("mechanism", ["softmax", "quiet", "micro", "elita"])
@given(dims=STATE_DIMS, new=st.integers(1, 3), batch=st.integers(1, 3))
@same_route_for_every_example
def test_step_with_a_state_of_any_shape_is_right_or_refused(both_routes, mechanism, dims, new, batch):
    """A state from another batch or layer width (random shapes) is refused on both routes alike, never read."""
    layer = build(mechanism, dim=16, heads=4, causal=True).eval()
    sb, sh, sd = dims
    _, fitting = layer.step(torch.randn(batch, 2, 16))
    states = {
        MicroState: lambda: MicroState(torch.zeros(sb, sh, sd), torch.zeros(sb, sh)),
        ElitaState: lambda: ElitaState(torch.zeros(sb, sh), torch.zeros(sb, sh, sd), 2),
        KVCache: lambda: KVCache(torch.zeros(sb, sh, 2, sd), torch.zeros(sb, sh, 2, sd)),
    }
    state = states[type(fitting)]()
    x = torch.randn(batch, new, 16)
    if (sb, sh, sd) == (batch, 4, 4):
        y, _ = layer.step(x, state)
        assert y.shape == (batch, new, 16) and torch.isfinite(y).all()
    else:
        with pytest.raises(ValueError, match=r"state\.\w+ must have shape"):
            layer.step(x, state)
    with pytest.raises(TypeError, match="expects state=None or the"):
        layer.step(x, (fitting,))


def test_forward_step_refuses_a_wrong_state_list():
    model = zoo.create("micro-gpt-tiny").eval()
    _, states = model.forward_step(torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match="list of 4 block states"):
        model.forward_step(torch.tensor([[4]]), states[:2], 3)
    with pytest.raises(ValueError, match="must have shape"):
        model.forward_step(torch.tensor([[4], [5]]), states, 3)


@pytest.mark.slow
def test_kernel_tests_pass_under_address_sanitizer():
    """`.ci/asan`: the kernel tests with an AddressSanitizer build; any out-of-bounds access aborts."""
    out = subprocess.run(["bash", str(ROOT / ".ci" / "asan")], capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert " passed" in out.stdout and "AddressSanitizer" not in out.stderr


# ---- 3. bounds before allocation --------------------------------------------------------------


def test_resource_bombs_are_refused_before_allocation():
    start = time.time()
    with pytest.raises(TypeError, match=r"embed_dim must be an integer, got 1000000000.0 \(float\)"):
        zoo.create("vit-tiny", embed_dim=1e9)
    with pytest.raises(ValueError, match=r"would have [\d,]+ parameters, more than the limit of 1,000,000,000"):
        zoo.create("gpt-tiny", depth=10**6)
    with pytest.raises(ValueError, match="more than the limit"):
        zoo.create("vit-tiny", embed_dim=10**6)
    assert time.time() - start < 20  # counted on the meta device, not built
    assert zoo.create("vit-tiny", max_parameters=10**6) is not None  # about 0.8M: within a raised... lowered limit
    with pytest.raises(ValueError, match="limit of 1,000"):
        zoo.create("vit-tiny", max_parameters=1000)


def test_parameter_count_before_allocation_is_exact():
    from zoo.models.arguments import parameter_count

    for name in ("vit-tiny", "gpt-tiny", "elita-gpt-tiny", "fused-3d-tiny", "quiet-vit-small"):
        e = zoo.models.registry.entry(name)
        built = sum(p.numel() for p in zoo.create(name).parameters())
        assert parameter_count(e.cls, e.kwargs) == built, name


def test_a_model_with_per_block_short_convolutions_and_one_attention_loads_back(tmp_path):
    """short_conv lists one width per block as a hybrid's attention does, so the parameter budget builds the model
    whole rather than from a depth-0 and a depth-1 one (neither takes four widths: such a model saved, and its
    release failed to load)."""
    from zoo.models.arguments import parameter_count

    model = zoo.create("gpt-tiny", short_conv=[0, 0, 0, 4])
    convs = sum(p.numel() for n, p in model.named_parameters() if "conv" in n)
    e = zoo.models.registry.entry("gpt-tiny")
    assert convs > 0 and parameter_count(e.cls, {**e.kwargs, "short_conv": [0, 0, 0, 4]}) == \
        sum(p.numel() for p in zoo.create("gpt-tiny").parameters()) + convs
    again = zoo.load(model.save_pretrained(tmp_path / "m"))
    assert again.short_convs == [0, 0, 0, 4]
    ids = torch.randint(0, model.vocab_size, (2, 9))
    torch.testing.assert_close(again(ids), model.eval()(ids), rtol=0, atol=0)
    # a config.json whose list is edited is refused naming the file, the argument and the block
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    for widths, error in (([0, 4], "short_conv lists 2 widths, but depth=4"),
                          ([0, 0, 0, 10**9], r"short_conv\[3\] \(block 3\) must be between 0 and 64, got 1000000000"),
                          ([0, 0, 0, -1], r"short_conv\[3\] \(block 3\) must be between 0 and 64, got -1"),
                          ([0, 0, 0, float("nan")], r"short_conv\[3\] \(block 3\) must be an integer, got nan"),
                          ([0, 0, 0, "4"], r"short_conv\[3\] \(block 3\) must be an integer, got '4'")):
        (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "args": {**config["args"],
                                                                                 "short_conv": widths}}))
        with pytest.raises((TypeError, ValueError), match=error) as refused:
            zoo.load(tmp_path / "m")
        assert str(tmp_path / "m" / "config.json") in str(refused.value)


def test_a_config_json_bomb_is_refused(tmp_path):
    folder = zoo.create("fused-1d-tiny").save_pretrained(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    for field, value, error in (("embed_dim", 1e9, "embed_dim must be an integer"),
                                ("depth", 10**6, "more than the limit"),
                                ("depth", -1, "depth must be between 0 and"),
                                ("label_names", ["a"], "label_names must be 10 strings")):
        (folder / "config.json").write_text(json.dumps({**config, "args": {**config["args"], field: value}}))
        with pytest.raises(REFUSED, match=error) as err:
            zoo.load(folder)
        assert "config.json" in str(err.value)


FAMILY_FIELDS = {
    "vit-tiny": ["img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads", "mlp_ratio",
                 "drop_rate"],
    "fused-2d-tiny": ["in_chans", "num_classes", "collection", "embed_dim", "depth", "num_heads", "mlp_ratio"],
    "micro-gpt-tiny": ["vocab_size", "context_length", "embed_dim", "depth", "num_heads", "mlp_ratio", "drop_rate"],
}
ODD_VALUES = st.one_of(st.integers(-3, 70), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
                       st.text(max_size=2), st.just(10**12), st.just([4]))


@pytest.mark.parametrize("name", sorted(FAMILY_FIELDS))
@given(data=st.data())
def test_fuzzed_configs_build_a_working_model_or_are_refused(name, data):
    field = data.draw(st.sampled_from(FAMILY_FIELDS[name]))
    value = data.draw(ODD_VALUES)
    try:
        model = zoo.create(name, max_parameters=3_000_000, **{field: value}).eval()
    except REFUSED as e:
        assert str(e)
        return
    if name == "micro-gpt-tiny":
        x = torch.randint(0, model.vocab_size, (2, 5))
        assert model(x).shape == (2, 5, model.vocab_size)
    else:
        x = torch.rand(2, *model.input_shape) if not model.config.get("collection") else \
            torch.rand(2, model.collection, *model.input_shape)
        assert model(x).shape == (2, model.num_classes)


@given(max_new=st.one_of(st.integers(-2, 3), st.just(10**20), st.floats(allow_nan=True)),
       temperature=st.one_of(st.floats(-1, 2), st.just(float("nan")), st.just(float("inf"))),
       top_k=st.one_of(st.none(), st.integers(-1, 100)), top_p=st.one_of(st.none(), st.floats(-0.5, 1.5)))
def test_sampling_parameters_are_checked_before_the_loop(max_new, temperature, top_k, top_p):
    model = GPT
    try:
        out = model.generate([1, 2, 3], max_new, temperature=temperature, top_k=top_k, top_p=top_p, seed=0)
    except REFUSED as e:
        assert "generate" in str(e)
        return
    assert out.shape == (1, 3 + max_new) and int(out.min()) >= 0 and int(out.max()) < model.vocab_size


GPT = zoo.create("micro-gpt-tiny", depth=1, embed_dim=32).eval()


# ---- 4. inputs mean what they say ------------------------------------------------------------


def test_images_are_read_by_their_bit_depth():
    from PIL import Image

    model = zoo.create("vit-tiny").eval()
    rng = np.random.default_rng(0)
    digit = rng.integers(0, 256, (28, 28), dtype=np.uint8)
    reference = ((torch.from_numpy(digit).double() / 255 - 0.5) / 0.5).float()[None, None]
    sixteen = digit.astype(np.uint16) * 257  # the same picture in 16 bits
    same = [digit, torch.from_numpy(digit), digit.astype(np.int64), sixteen, Image.fromarray(digit),
            Image.fromarray(sixteen), Image.fromarray(digit.astype(np.float32) / 255), digit.astype(np.float64) / 255,
            Image.fromarray(digit).convert("RGB"), Image.fromarray(digit.astype(np.int32) * 257, mode="I")]
    for i, image in enumerate(same):
        torch.testing.assert_close(model.preprocess(image), reference, atol=1e-6, rtol=0, msg=f"input {i}")
    refused = {"floating-point pixels must lie in": Image.fromarray(digit.astype(np.float32)),
               "values in \\[0, 65535\\]": sixteen.astype(np.int32),
               "NaN or infinite": np.full((28, 28), np.nan),
               "integer pixels are read as 8-bit": digit.astype(np.int16) - 5,
               "takes numbers": np.array([["a"] * 28] * 28)}
    for message, image in refused.items():
        with pytest.raises(ValueError, match=message):
            model.classify(image)


def test_classify_refuses_nan_and_inf():
    model = zoo.create("fused-1d-tiny").eval()
    for bad in (float("nan"), float("inf")):
        x = torch.rand(1, 40)
        x[0, 3] = bad
        with pytest.raises(ValueError, match="NaN or infinite"):
            model.classify(x)


MECHANISMS = [("softmax", False), ("softmax", True), ("quiet", False), ("quiet", True), ("micro", False),
              ("micro", True), ("micro:alibi", True), ("elita", True), ("fused", False)]  # name:positions


@pytest.mark.parametrize("mechanism,causal", MECHANISMS)
@given(rows=st.lists(st.lists(st.booleans(), min_size=6, max_size=6), min_size=1, max_size=3),
       fill=st.sampled_from([float("nan"), float("inf"), 1e30, 0.0]))
@same_route_for_every_example
def test_masked_tokens_cannot_touch_real_ones(both_routes, mechanism, causal, rows, fill):
    """Whatever a padded token holds (NaN included), real tokens' outputs are those of the same input with
    the padding replaced by other values, and a row that is all padding gives zeros."""
    torch.manual_seed(0)
    mechanism, _, positions = mechanism.partition(":")
    layer = build(mechanism, dim=16, heads=4, causal=causal, **({"positions": positions} if positions else {})).eval()
    mask = torch.tensor(rows)
    x = torch.randn(len(rows), 6, 16)
    other = x.clone()
    other[~mask] = torch.randn(int((~mask).sum()), 16)
    poisoned = x.clone()
    poisoned[~mask] = fill
    clean, y = layer(other, key_padding_mask=mask), layer(poisoned, key_padding_mask=mask)
    assert torch.isfinite(y).all()
    real = mask if mechanism != "fused" else mask.any(-1)
    torch.testing.assert_close(y[real], clean[real], atol=1e-5, rtol=1e-5)
    assert (y[~real] == 0).all()  # padded tokens (and all-padding rows) give zeros
    if mechanism == "fused":  # alpha too, as plots ask for it
        alpha = layer.alpha(poisoned, key_padding_mask=mask)
        torch.testing.assert_close(alpha, layer.alpha(other, key_padding_mask=mask), atol=1e-6, rtol=1e-5)
        assert (alpha[~real] == 0).all() and (alpha.transpose(1, 2)[~mask] == 0).all()


@pytest.mark.parametrize("mechanism", ["softmax", "quiet", "micro"])
def test_padding_is_the_same_as_leaving_the_tokens_out(mechanism):
    """Independent reference for the position-free mechanisms: real tokens' outputs with padding
    equal the outputs of the real tokens alone."""
    layer = build(mechanism, dim=16, heads=4, causal=True).eval()
    x = torch.randn(1, 7, 16)
    mask = torch.tensor([[True, False, True, True, False, False, True]])
    alone = layer(x[:, mask[0]])
    torch.testing.assert_close(layer(x, key_padding_mask=mask)[:, mask[0]], alone, atol=1e-5, rtol=1e-5)


# ---- release folders: every field checked, the file and field named ----------------------------


@pytest.fixture
def release(tmp_path):
    return zoo.create("gpt-tiny", depth=1).save_pretrained(tmp_path / "m")


def rewrite_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("version,message", [(2, "format_version 2, written by a newer zoo"),
                                             ("1", "format_version must be a positive integer"),
                                             (None, "has no format_version")])
def test_unknown_format_versions_are_refused(release, version, message):
    rewrite_config(release, format_version=version)
    if version is None:
        config = json.loads((release / "config.json").read_text())
        del config["format_version"]
        (release / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        zoo.load(release)


def test_malformed_config_is_named_with_line_and_column(release):
    (release / "config.json").write_text('{"format_version": 1,\n  "class": }')
    with pytest.raises(ValueError, match=r"config.json is not valid JSON: Expecting value at line 2, column 12"):
        zoo.load(release)
    (release / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object, got a JSON list"):
        zoo.load(release)
    (release / "config.json").write_text('{"format_version": 1, "class": "TextTransformer", "args": {"wings": 2}}')
    with pytest.raises(ValueError, match="args.wings is not an argument of TextTransformer"):
        zoo.load(release)


def test_weights_of_the_wrong_kind_are_refused(release):
    from safetensors.torch import load_file, save_file

    weights = release / "model.safetensors"
    state = load_file(str(weights))
    for dtype in (torch.int8, torch.bool):
        save_file({**state, "norm.weight": state["norm.weight"].to(dtype)}, str(weights))
        stored = "I8" if dtype == torch.int8 else "BOOL"
        with pytest.raises(ValueError, match=f"tensor 'norm.weight' is stored as {stored}"):
            zoo.load(release)
    (embedding,) = {"tok_embed.weight", "head.weight"} & state.keys()  # safetensors keeps one of the tied pair
    save_file({**state, "head.weight": state[embedding] + 1, "tok_embed.weight": state[embedding]}, str(weights))
    with pytest.raises(ValueError, match="head.weight and tok_embed.weight are tied .* two different values"):
        zoo.load(release)
    save_file({**state, "head.weight": state[embedding], "tok_embed.weight": state[embedding].clone()}, str(weights))
    assert zoo.load(release) is not None
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors is not a valid safetensors file|truncated"):
        zoo.load(release)
    weights.write_bytes(b"PK\x03\x04 this is a zip file, not safetensors")
    with pytest.raises(ValueError, match="is truncated or not a safetensors file"):
        zoo.load(release)
    weights.write_bytes(b"")
    with pytest.raises(ValueError, match="too short for a header"):
        zoo.load(release)


def test_non_finite_weights_are_refused(release):
    from safetensors.torch import load_file, save_file

    weights = release / "model.safetensors"
    state = load_file(str(weights))
    for bad in (float("nan"), float("inf")):
        damaged = state["norm.weight"].clone()
        damaged[3] = bad
        save_file({**state, "norm.weight": damaged}, str(weights))
        with pytest.raises(ValueError, match="tensor 'norm.weight' holds NaN or infinite values"):
            zoo.load(release)


def test_text_is_never_written_onto_a_folder(tmp_path):
    from zoo.utils.atomic import write_text_atomic

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "kept").write_text("mine")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        write_text_atomic(tmp_path / "d", "text")
    assert (tmp_path / "d" / "kept").read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_non_strict_load_with_nothing_in_common_is_refused(release):
    from safetensors.torch import save_file

    save_file({"something.else": torch.zeros(3)}, str(release / "model.safetensors"))
    with pytest.raises(ValueError, match="none of the tensors .* fit TextTransformer"):
        zoo.load(release, strict=False)


# ---- 5 and 6. the Hub and the command line ----------------------------------------------------


@pytest.mark.parametrize("source", ["hf-hub:org/repo@../../..", "hf-hub:org/repo@main\n", "hf-hub:org/repo@a/b",
                                    "hf-hub:org/repo\n", "hf-hub:org/../x", "hf-hub:org/repo@"])
def test_revisions_and_ids_that_are_paths_are_refused(source, tmp_path):
    with pytest.raises(ValueError, match="expected a Hub"):
        zoo.load(source, cache_dir=tmp_path, local_files_only=True)


@pytest.fixture
def answering(monkeypatch):
    """A Hub on loopback that answers every request with one status code."""
    import http.server
    import threading

    import huggingface_hub.constants as constants

    status = {"code": 500}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status["code"])
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": "no"}')

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    yield status
    server.shutdown()


@pytest.mark.parametrize("code,error,message", [(401, PermissionError, "refused access \\(401\\)"),
                                                (404, FileNotFoundError, "not found on .* \\(404\\)"),
                                                (500, ConnectionError, "answered 500 Internal Server Error")])
def test_bad_hub_answers_say_what_happened_without_the_token(answering, tmp_path, code, error, message):
    answering["code"] = code
    with pytest.raises(error, match=message) as err:
        zoo.load("hf-hub:org/repo", cache_dir=tmp_path, token="hf_secret_token_123")
    assert "hf_secret" not in str(err.value) and err.value.__cause__ is None and err.value.__suppress_context__


def test_cli_errors_are_one_line_with_the_closest_names(capsys):
    from zoo.cli import main

    with pytest.raises(SystemExit) as err:
        main(["generate", "micro-gpt-tinyy"])
    assert str(err.value).count("\n") == 0 and "closest: micro-gpt-tiny" in str(err.value)
    with pytest.raises(SystemExit) as err:
        main(["generate", "micro-gpt-tiny", "--max-new-tokens", str(10**20)])
    assert "max_new_tokens must be between 0 and 1000000" in str(err.value)


def test_fit_with_an_unknown_model_is_one_line(tmp_path):
    # in this process (zoo's entry point prints the exit's message, as test_cli's subprocess case shows)
    from zoo.cli import main

    with pytest.raises(SystemExit) as err:
        main(["fit", "--config", str(ROOT / "recipes/quickstart.yaml"), "--model.init_args.model_name",
              "micro-vit-tinyy", "--trainer.default_root_dir", str(tmp_path)])
    message = str(err.value)
    assert message.count("\n") == 0
    assert message.startswith("zoo fit: error: model.init_args.model_name: unknown model 'micro-vit-tinyy'")
    assert "closest: micro-vit-tiny" in message
