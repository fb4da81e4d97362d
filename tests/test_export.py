"""The models through PyTorch's compilers and exporters, and `zoo export --format onnx`.

Every registered model compiles with fullgraph=True (forward, and a training step's gradients)
and exports with torch.export with a dynamic batch (and length for text), each equal to eager
within 1e-5 in float32 (the slow set runs every model; the default run each attention and family
once). The compiled kernels are custom operators that pass torch.library.opcheck.
Text models decode from two exported programs (and from ONNX Runtime sessions) to the tokens
`generate` gives. The default run compiles with the aot_eager backend (dynamo's graph capture
and AOT autograd, the parts that break on a graph break or a missing fake implementation);
inductor's code generation takes 6-50 s a model and runs here on a stack of one layer around each
custom operator (inference), on every model (inference and a training step) in the slow set.
"""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import zoo
from zoo.attention import native
from zoo.models import decoding
from zoo.models.arguments import PER_BLOCK

from .conftest import onnx_decoding, onnx_program

NAMES = zoo.list_models()
CHECKPOINTS = [f"{n}.{t}" for n in zoo.list_models(pretrained=True) for t in zoo.models.registry.pretrained_tags(n)]
TEXT_CHECKPOINTS = [c for c in CHECKPOINTS if zoo.models.registry.entry(c.split(".")[0]).family == "text"]
TOLERANCE = dict(rtol=1e-5, atol=1e-5)
SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints"
# models that run another's code in the default run: hybrid-elita-conv1-gpt-tiny is hybrid-elita-conv-gpt-tiny
# with its convolution in one block of four, the plain hybrids their short-convolution ones without it; their
# per-model tests (3-7 s each) and default checkpoints' decoding are in the slow set
SAME_CODE = ("hybrid-elita-conv1-gpt-tiny", "hybrid-elita-gpt-tiny", "hybrid-micro-gpt-tiny")


def _args(checkpoint: str) -> dict:
    """A shipped checkpoint's model arguments, less what changes no code path (its text and context length)."""
    args = json.loads((SHIPPED / checkpoint / "config.json").read_text())["args"]
    return {k: v for k, v in args.items() if k not in ("vocab_size", "context_length", "tokenizer")}


def _decoding_cases() -> list:
    """Every text checkpoint, in the slow set those that export the same code as their model's default one
    (gpt-tiny.warpeace is gpt-tiny.shakespeare at another length), SAME_CODE's default ones (the plain hybrids'
    per-layer positions on War and Peace stay) and the mini ones (elita-gpt-mini's is
    elita-gpt-tiny.warpeace-alibi's code at width 256 and 6 blocks, and takes 7-10 s): the programs take 2-5 s
    to export each."""
    cases = []
    for checkpoint in TEXT_CHECKPOINTS:
        name = checkpoint.split(".")[0]
        default = f"{name}.{zoo.models.registry.entry(name).default_tag}"
        same = (name in SAME_CODE and checkpoint == default) or name.endswith("-mini") or (
            checkpoint != default and default in TEXT_CHECKPOINTS and _args(checkpoint) == _args(default))
        cases.append(pytest.param(checkpoint, marks=pytest.mark.slow) if same else checkpoint)
    return cases


def example(model, batch: int, length: int = 16) -> torch.Tensor:
    if hasattr(model, "vocab_size"):
        return torch.randint(0, model.vocab_size, (batch, length))
    return torch.randn(batch, *getattr(model, "expected_shape", model.input_shape))


def needs_kernels():
    if native.load() is None:
        pytest.skip("the compiled kernels could not be built here")


# ---- the kernels as custom operators ----------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_softmax_one(dtype):
    needs_kernels()
    x = (torch.randn(3, 5, 17) * 4).to(dtype).requires_grad_()
    torch.library.opcheck(native.softmax_one, (x,))


def test_opcheck_micro_scan():
    needs_kernels()
    b, n, h, d = 2, 9, 3, 4
    args = (torch.randn(b, n, h, d), torch.rand(b, n, h), torch.randn(b, h, d), torch.rand(b, h))
    torch.library.opcheck(native.micro_scan, tuple(a.requires_grad_() for a in args))


@pytest.mark.parametrize("value_dtype", [torch.float32, torch.bfloat16])
def test_opcheck_elita_scan(value_dtype):
    needs_kernels()
    b, n, h, d = 2, 9, 3, 4
    v = torch.randn(b, n, h, d).to(value_dtype)
    args = (torch.randn(b, n, h), torch.randn(b, n, h), v, torch.randn(b, h), torch.randn(b, h, d))
    torch.library.opcheck(native.elita_scan, tuple(a.requires_grad_() for a in args))


@pytest.mark.parametrize("causal", [True, False])
def test_opcheck_incontext_bias(causal):
    needs_kernels()
    b, h, n, positions = 2, 3, 6, 4
    gates = torch.rand(b, n, h).transpose(1, 2)  # transposed views, as the layer passes them
    ends = gates.cumsum(-1)
    queries = n - 2 if causal else n
    tables = torch.randn(b, queries, h, positions).transpose(1, 2)
    args = (ends[..., n - queries:], ends - gates, tables)
    torch.library.opcheck(native.incontext_bias, (*(a.detach().requires_grad_() for a in args), causal))


def test_ops_match_the_eager_routes():
    """The operators give the eager routes' numbers and gradients (the references of test_attention.py)."""
    needs_kernels()
    from zoo.attention.normalizers import _forward_eager

    x = torch.randn(4, 33, dtype=torch.float64) * 3
    torch.testing.assert_close(native.softmax_one(x.float()), _forward_eager(x, -1).float(), rtol=1e-5, atol=1e-7)
    model = zoo.create("micro-gpt-tiny").eval()
    ids = example(model, 2, 40)
    fast = model(ids)
    with native.eager_routes():
        eager = model(ids)
    torch.testing.assert_close(fast, eager, **TOLERANCE)


# ---- torch.compile --------------------------------------------------------------------------------


def traced_model(name: str, depth: int | None = None) -> torch.nn.Module:
    """The registered model, with `depth` blocks where given (None: its registered depth)."""
    return zoo.create(name) if depth is None else zoo.create(name, depth=depth)


def compiled_equals_eager(name: str, backend: str, depth: int | None = None) -> None:
    model = traced_model(name, depth)
    module_compiled_equals_eager(model, example(model, 3), backend)


def module_compiled_equals_eager(module: torch.nn.Module, x: torch.Tensor, backend: str,
                                 training_step: bool = True) -> None:
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True, backend=backend)
    module.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), module(x), **TOLERANCE)
    if not training_step:
        return
    module.train()
    grads = []
    for run in (module, compiled):
        module.zero_grad()
        run(x).float().square().mean().backward()
        grads.append([p.grad.clone() for p in module.parameters()])
    for eager, comp in zip(*grads):
        torch.testing.assert_close(comp, eager, **TOLERANCE)


# The default run compiles and exports each attention (causal in the text family; non-causal where that is
# another route: micro's mean, the in-context bias) and each model family once; the *-small models (the tiny
# ones' code, wider), SAME_CODE's and the crossings below (an attention already run in one family, placed in
# another that is already run) take 3-6 s each and are in the slow set, which runs every model.
CROSSINGS = ("quiet-vit-tiny", "gated-vit-tiny", "clipped-vit-tiny", "hybrid-micro-vit-tiny", "fused-1d-tiny",
             "fused-3d-tiny")
# the mini models whose code a tiny one runs by default (gpt-mini's rotary softmax and elita-gpt-mini's fading
# ELiTA are no tiny model's, and run by default)
MINI_SAME_CODE = ("incontext-gpt-mini", "ssd-gpt-mini", "hybrid-elita-conv1-gpt-mini")
# Tracing costs in proportion to depth, and a model whose blocks are alike runs one block's code in each: so the
# default run traces two of them (the second takes the first's output, as every later one does), and the slow set
# the registered depth; hybrids, whose blocks differ, keep every block. The default run's compile and export cases
# took 124 s on one core with four blocks, 96 s with two.
ALIKE_BLOCKS = 2


def _each_once_by_default() -> list:
    cases = []
    for name in NAMES:
        kwargs = zoo.models.registry.entry(name).kwargs
        alike = kwargs.get("depth", 0) > ALIKE_BLOCKS and not any(isinstance(kwargs.get(k), (list, tuple))
                                                                  for k in PER_BLOCK)
        if name.endswith("-small") or name in SAME_CODE + CROSSINGS + MINI_SAME_CODE:
            cases.append(pytest.param(name, None, marks=pytest.mark.slow, id=name))
        elif alike:
            cases += [pytest.param(name, ALIKE_BLOCKS, id=f"{name}-depth{ALIKE_BLOCKS}"),
                      pytest.param(name, None, marks=pytest.mark.slow, id=name)]
        else:
            cases.append(pytest.param(name, None, id=name))
    return cases


EACH_ONCE_BY_DEFAULT = _each_once_by_default()


# aot_eager's replay of the gated delta rule's backward fails inside PyTorch 2.14 ("view size is not compatible",
# a view of a gradient that is not contiguous; with gated=False it passes). Inductor, torch.compile's default,
# compiles it whole and gives eager's gradients (test_inductor_every_model, slow: its C++ takes 100 s to build on
# a machine with no inductor cache, 7 s with one). The default run takes the gated rule's forward and the plain
# rule's training step through aot_eager.
AOT_EAGER_FAILS = {"deltanet-gpt-tiny": {"gated": False}}


@pytest.mark.parametrize(("name", "depth"), EACH_ONCE_BY_DEFAULT)
def test_compile_fullgraph_forward_and_training_step(name, depth):
    if name in AOT_EAGER_FAILS:
        model = traced_model(name, depth)
        module_compiled_equals_eager(model, example(model, 3), "aot_eager", training_step=False)
        options = {"attention_options": AOT_EAGER_FAILS[name], **({} if depth is None else {"depth": depth})}
        passing = zoo.create(name, **options)
        module_compiled_equals_eager(passing, example(passing, 3), "aot_eager")
    else:
        compiled_equals_eager(name, "aot_eager", depth)


class SoftmaxOneLayer(torch.nn.Module):
    """softmax_one on learned logits (quiet attention gets it from SDPA with a zero key in front, not the operator)."""

    def __init__(self, dim: int):
        super().__init__()
        self.logits = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return zoo.attention.softmax_one(self.logits(x))


# one layer around each custom operator, the four in one stack: inductor's code generation for a whole model takes
# 20-50 s on an empty cache (every model goes through it, forward and backward, in the slow set), and each graph it
# compiles costs a C++ build, so one stack rather than four layers (on an empty cache 45 s as one stack, 60 s one
# layer at a time), and by default its inference graph only (16 s; the training step's joint graph adds 27 s)
class PaddedInContext(torch.nn.Module):
    """In-context attention with a padding mask (every token real): the route through zoo::incontext_bias, which
    padding takes; without one the layer takes zoo::incontext_attention."""

    def __init__(self):
        super().__init__()
        self.layer = zoo.attention.InContextAttention(32, 2, causal=True)

    def forward(self, x):
        return self.layer(x, key_padding_mask=torch.ones(x.shape[:2], dtype=torch.bool, device=x.device))


OPERATOR_LAYERS = {
    "softmax_one": lambda: SoftmaxOneLayer(32),
    "micro_scan": lambda: zoo.attention.MicroAttention(32, 2, causal=True),
    "elita_scan": lambda: zoo.attention.ElitaAttention(32, 2),
    "incontext_bias": PaddedInContext,
    "incontext_attention": lambda: zoo.attention.InContextAttention(32, 2, causal=True),
}


def test_inductor_compiles_the_custom_operators():
    """Inductor's code around each operator, for inference; their backward operators go through it with every
    model's training step in the slow set (test_inductor_every_model)."""
    needs_kernels()
    stack, x = torch.nn.Sequential(*(make() for make in OPERATOR_LAYERS.values())), torch.randn(3, 16, 32)
    ops = {str(n.target) for n in torch.export.export(stack.eval(), (x,)).graph.nodes}
    assert {f"zoo.{name}.default" for name in OPERATOR_LAYERS} <= ops, ops  # the operators, not eager routes
    module_compiled_equals_eager(stack, x, "inductor", training_step=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_inductor_every_model(name):
    compiled_equals_eager(name, "inductor")


# ---- torch.export ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "depth"), EACH_ONCE_BY_DEFAULT)
def test_export_with_dynamic_batch_and_length(name, depth):
    model = traced_model(name, depth).eval()
    text = hasattr(model, "vocab_size")
    dynamic = decoding.dynamic_shapes(model, True) if text else ({0: torch.export.Dim("batch", max=4096)},)
    program = torch.export.export(model, (example(model, 2),), dynamic_shapes=dynamic)
    for batch, length in ((1, 5), (5, 100)):  # neither the traced batch nor the traced length
        x = example(model, batch, length)
        torch.testing.assert_close(program.module()(x), model(x), **TOLERANCE)
    ops = {str(n.target) for n in program.graph.nodes}
    if name in ("micro-gpt-tiny", "elita-gpt-tiny") and native.load() is not None:
        assert f"zoo.{name.split('-')[0]}_scan.default" in ops  # the kernel is one operator of the graph
    if text:  # the token-id check travels in the graph
        with pytest.raises(RuntimeError, match="token ids must lie in"):
            program.module()(torch.full((1, 3), model.vocab_size))


@pytest.mark.parametrize("name", _decoding_cases())
def test_exported_decoding_gives_generates_tokens(name):
    """prefill and step, exported, decode greedily to generate's tokens, through the learned positions'
    window (80 new tokens on a context of 64) and with a batch of prompts."""
    model = zoo.load(name)
    if unexported := sorted(set(model.attentions) - set(decoding.STATE_FIELDS)):  # the yardsticks' states
        with pytest.raises(ValueError, match=f"exported decoding takes blocks of .*this model has {unexported[0]}"):
            decoding.export(model)  # one line naming the blocks, not a TypeError from inside the trace
        return
    prefill, step = decoding.export(model)
    prompt = torch.as_tensor([model.tokenizer.encode("ROMEO: "), model.tokenizer.encode("JULIET:")])
    window = model.context_length if model.pos_kind == "learned" else None
    got = decoding.greedy(prefill.module(), step.module(), prompt, 80, window)
    assert torch.equal(got, model.generate(prompt, 80, temperature=0))


# ---- ONNX ---------------------------------------------------------------------------------------


def zoo_export(*args) -> str:
    from zoo.cli import main

    main(["export", *map(str, args)])


def ort_greedy(folder, prompt, max_new_tokens, window):
    return decoding.greedy(*onnx_decoding(folder), prompt, max_new_tokens, window)


def check_onnx_folder(name, folder):
    config = json.loads((folder / "config.json").read_text())
    assert config["format"] == "onnx" and config["opset"] == 18
    # the export's own rule: 1e-4, relative where values exceed 1 (a 2,048-token prefill's logits differ by ~1e-4)
    assert all(f["max_rel_diff"] <= 1e-4 for f in config["files"].values())
    model = zoo.load(name)
    text = hasattr(model, "vocab_size")
    length = model.context_length if text and model.pos_kind == "learned" else 130
    x = example(model, 7, length)  # another batch size (and length) than the export traced and checked
    got = onnx_program(folder, "model")(x)[0].numpy()
    with torch.no_grad():
        # float32 sums in another order: the in-context bias's running gate sums over 130 tokens differed by
        # 1.3e-4 on a logit of 4.1, so a relative part beside the absolute one
        np.testing.assert_allclose(got, model(x).numpy(), atol=1e-4, rtol=1e-4)
    if hasattr(model, "vocab_size"):
        assert config["tokenizer"] == model.config["tokenizer"]
        prompt = torch.as_tensor([model.tokenizer.encode("ROMEO: "), model.tokenizer.encode("JULIET:")])
        window = model.context_length if model.pos_kind == "learned" else None
        assert torch.equal(ort_greedy(folder, prompt, 80, window), model.generate(prompt, 80, temperature=0))
    else:
        assert config["preprocessing"]["mean"] == model.config["mean"]
        assert config["label_names"] == model.config["label_names"]


@pytest.mark.parametrize("name", ["vit-tiny.mnist", pytest.param("micro-gpt-tiny.shakespeare", marks=pytest.mark.slow),
                                  pytest.param("gpt-tiny.shakespeare", marks=pytest.mark.slow)])
def test_zoo_export_onnx(name, tmp_path, capsys):
    zoo_export(name, tmp_path / "out", "--format", "onnx")
    assert "largest absolute difference" in capsys.readouterr().out
    check_onnx_folder(name, tmp_path / "out")
    # an existing export is replaced only with --overwrite
    with pytest.raises(SystemExit, match="--overwrite"):
        zoo_export(name, tmp_path / "out", "--format", "onnx")
    zoo_export(name, tmp_path / "out", "--format", "onnx", "--overwrite")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing left beside it
    check_onnx_folder(name, tmp_path / "out")


# elita's export switches to its eager route as micro's does; it and every checkpoint export in the slow set
@pytest.mark.parametrize("name", ["micro-gpt-tiny", pytest.param("elita-gpt-tiny", marks=pytest.mark.slow)])
def test_plain_torch_onnx_export_works_with_the_kernels_built(name, tmp_path, capsys):
    """`torch.onnx.export(model, args, dynamo=True)` as a user writes it, with nothing zoo-specific passed:
    ONNX has no translation of zoo's operators, so exports trace the eager routes, and ONNX Runtime
    gives the eager model's logits."""
    needs_kernels()
    model = zoo.create(name).eval()
    ids = torch.randint(0, model.vocab_size, (2, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (ids,), dynamo=True).save(str(tmp_path / "model.onnx"))
    assert not native._exporting_to_onnx()  # the routes are the kernels again after the export
    (logits,) = onnx_program(tmp_path, "model")(ids)
    with torch.no_grad():
        np.testing.assert_allclose(logits, model(ids).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("name", CHECKPOINTS)
def test_zoo_export_onnx_every_checkpoint(name, tmp_path, capsys):
    zoo_export(name, tmp_path / "out", "--format", "onnx")
    assert "largest absolute difference" in capsys.readouterr().out
    check_onnx_folder(name, tmp_path / "out")


def test_zoo_export_onnx_refusals(tmp_path, monkeypatch, capsys):
    import contextlib

    from zoo.cli import main

    with pytest.raises(SystemExit) as exit_:  # an unknown format lists the known ones
        main(["export", "vit-tiny.mnist", str(tmp_path / "x"), "--format", "tflite"])
    assert exit_.value.code == 2 and "choose from 'release', 'onnx'" in capsys.readouterr().err
    # an operation the exporter cannot translate is named, and nothing is left in OUTDIR (zoo's own operators
    # are such operations once the exports' switch to the eager routes is turned off)
    monkeypatch.setattr(native, "eager_routes", contextlib.nullcontext)
    monkeypatch.setattr(native, "_exporting_to_onnx", lambda: False)
    if native.load() is not None:
        with pytest.raises(SystemExit, match=r"could not translate TextTransformer: it stopped at zoo::micro_scan"):
            main(["export", "micro-gpt-tiny.shakespeare", str(tmp_path / "y"), "--format", "onnx"])
        assert not (tmp_path / "y").exists() and list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    # a check that fails writes nothing either (test_zoo_export_onnx replaces an export with --overwrite)
    from zoo.release.onnx import export_onnx

    with pytest.raises(ValueError, match="more than the tolerance"):
        export_onnx(zoo.load("vit-tiny.mnist"), tmp_path / "z", tolerance=0.0)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(SystemExit, match="not a zoo ONNX export folder"):
        zoo_export("vit-tiny.mnist", tmp_path / "mine", "--format", "onnx", "--overwrite")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(SystemExit, match="has no use here"):
            zoo_export("vit-tiny.mnist", tmp_path / "w", "--format", "onnx", "--config", "recipes/vit-tiny.mnist.yaml")


@pytest.mark.slow
def test_aot_compiled_step_decodes_generates_tokens(tmp_path):
    """The exported step compiled ahead of time (AOTInductor, what bench/deploy.py times) decodes to
    generate's tokens too."""
    model = zoo.load("micro-gpt-tiny.shakespeare")
    prefill, step = decoding.export(model, eager_routes=True)
    package = torch._inductor.aoti_compile_and_package(step, package_path=str(tmp_path / "step.pt2"))
    compiled_step = torch._inductor.aoti_load_package(package)
    prompt = torch.as_tensor([model.tokenizer.encode("ROMEO: ")])
    got = decoding.greedy(prefill.module(), compiled_step, prompt, 60)
    assert torch.equal(got, model.generate(prompt, 60, temperature=0))


def test_onnx_export_of_a_model_with_nan_writes_nothing(tmp_path):
    from zoo.release.onnx import OnnxExportError, export_onnx

    model = zoo.create("vit-tiny").eval()
    with torch.no_grad():
        model.head.bias[0] = float("nan")
    with pytest.raises(OnnxExportError, match="differs from PyTorch by nan"):
        export_onnx(model, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
    assert torch.isnan(model.head.bias[0])  # the caller's model is untouched


def test_greedy_bounds_its_length():
    with pytest.raises(ValueError, match="max_new_tokens must be between 0 and 1000000"):
        decoding.greedy(None, None, torch.zeros(1, 1, dtype=torch.long), 10**9)


@pytest.mark.slow  # 13 s; tests/test_robustness.py holds concurrent writers of a release folder
def test_two_processes_exporting_to_one_folder_take_turns(tmp_path):
    """Two `zoo export --format onnx --overwrite` at once: each builds beside OUT and swaps in under the
    folder's lock, so OUT ends as one whole export and nothing staged is left."""
    import subprocess
    import sys

    command = [sys.executable, "-m", "zoo.cli", "export", "vit-tiny.mnist", str(tmp_path / "out"), "--format", "onnx",
               "--overwrite"]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for run in runs:
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-2000:]
    from zoo.release.onnx import is_onnx_folder

    assert is_onnx_folder(tmp_path / "out") and sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    check_onnx_folder("vit-tiny.mnist", tmp_path / "out")


@pytest.mark.parametrize("name", ["incontext-gpt-tiny", "incontext-vit-tiny", "gpt-tiny", "vit-tiny"])
def test_plain_torch_onnx_export_runs_in_onnx_runtime(name):
    """PyTorch's own `torch.onnx.export(model, (x,), dynamo=True)`, as a user calls it, not zoo's exporter: the
    in-context bias's heads once reached a reshape that torch.export could not decompose."""
    import onnxruntime as ort

    model = zoo.create(name).eval()
    generator = torch.Generator().manual_seed(0)
    x = (torch.randint(0, model.vocab_size, (2, 16), generator=generator) if hasattr(model, "vocab_size")
         else torch.randn(2, *model.input_shape, generator=generator))
    program = torch.onnx.export(model, (x,), dynamo=True, verbose=False)
    session = ort.InferenceSession(program.model_proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.as_tensor(got), model(x), rtol=1e-4, atol=1e-4)
