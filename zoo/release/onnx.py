"""`zoo export SOURCE OUTDIR --format onnx`: a model as ONNX graphs, checked in ONNX Runtime before they are kept.

The folder holds
    model.onnx     the model's forward: normalized inputs (batch, ...) -> logits, dynamic batch
                   (and length for text models)
    prefill.onnx,  text models only: decoding without Python model code (zoo/models/decoding.py):
    step.onnx      ids -> logits, next_position, present.*; ids, position, past.* -> the same
    config.json    the opset, each graph's inputs and outputs, the check's result, and what a
                   deployment needs around the graphs: the preprocessing and label names of a
                   classifier, the tokenizer of a text model
    README.md
Every graph is run in ONNX Runtime on inputs of another batch size (and length) than it was
traced with and compared with eager PyTorch; a largest difference above `tolerance` (absolute,
and relative to the value where it exceeds 1) fails the export. The folder is built beside OUTDIR
and moved there only when every check passed (zoo/utils/atomic.py), so a failed export leaves
nothing half-written.
"""

from __future__ import annotations

import copy
import json
import re
import warnings
from pathlib import Path

import torch
from torch import nn

from zoo.attention import native
from zoo.models import decoding
from zoo.utils.atomic import marked_folder, replace_folder

OPSET = 18
TOLERANCE = 1e-4  # float32
FORMAT = "onnx"
FILES = ("config.json", "README.md", "model.onnx", "prefill.onnx", "step.onnx")


class OnnxExportError(ValueError):
    """The model has an operation the ONNX exporter cannot translate (named in the message)."""


def is_onnx_folder(path) -> bool:
    """A folder this module wrote: nothing but its files, and a config.json that says format onnx."""
    return marked_folder(path, "config.json", FORMAT, FILES)


def _require_onnx() -> None:
    missing = [m for m in ("onnx", "onnxscript", "onnxruntime") if not _importable(m)]
    if missing:
        raise ValueError(f"ONNX export needs {', '.join(missing)}: pip install 'attention-zoo[onnx]'")


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _blocking_operation(error: Exception) -> str:
    """The operation named in the exporter's error, else its first line."""
    text = str(error)
    found = re.search(r"OpOverload\(op='([^']+)'", text) or re.search(r"\b((?:aten|zoo|prims)[.:]{1,2}\w+)", text)
    if found:
        return found.group(1).replace(".", "::", 1)
    summary = text.split("## Exception summary", 1)[-1].strip().splitlines()
    return summary[0][:300] if summary else type(error).__name__


def _graphs(model: nn.Module) -> dict[str, tuple]:
    """file -> (module, example inputs, dynamic shapes, input names, output names, check inputs)."""
    if hasattr(model, "vocab_size"):
        ids = torch.randint(0, model.vocab_size, (2, 8))
        # past the 64-token chunks of elita's running mean, and up to the learned positions' end
        length = model.context_length - 1 if model.pos_kind == "learned" else 100
        check_ids = torch.randint(0, model.vocab_size, (3, length))
        states = decoding.state_names(model)
        prefill_in, step_in = decoding.example_inputs(model, 2, 8)
        check_prefill, check_step = decoding.example_inputs(model, 3, check_ids.shape[1])
        outputs = ["logits", "next_position", *(f"present.{s}" for s in states)]  # ONNX names must be unique
        return {
            "model.onnx": (model, (ids,), decoding.dynamic_shapes(model, True), ["ids"], ["logits"], (check_ids,)),
            "prefill.onnx": (decoding.Prefill(model).eval(), prefill_in, decoding.dynamic_shapes(model, True), ["ids"],
                             outputs, check_prefill),
            "step.onnx": (decoding.Step(model).eval(), step_in, decoding.dynamic_shapes(model, False),
                          ["ids", "position", *(f"past.{s}" for s in states)], outputs, check_step),
        }
    shape = tuple(getattr(model, "expected_shape", model.input_shape))
    batch = torch.export.Dim("batch", min=1, max=4096)
    return {"model.onnx": (model, (torch.randn(2, *shape),), ({0: batch},), ["input"], ["logits"],
                           (torch.randn(3, *shape),))}


def _as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def _export_and_check(module, args, dynamic, inputs, outputs, check, file: Path,
                      tolerance: float) -> tuple[float, float]:
    """Export one graph to `file` and run it in ONNX Runtime: its largest absolute difference from PyTorch, and
    the largest relative to the value where that exceeds 1 (the one held to `tolerance`)."""
    import onnxruntime as ort

    try:
        with native.eager_routes(), torch.no_grad(), warnings.catch_warnings():  # ONNX has PyTorch's ops, not zoo's
            warnings.filterwarnings("ignore", message=".*axis name.*will not be used")  # shared Dims: expected
            program = torch.onnx.export(module, args, dynamo=True, dynamic_shapes=dynamic, input_names=inputs,
                                        output_names=outputs, opset_version=OPSET, verbose=False)
    except Exception as error:  # the exporter's errors are many kinds; each names what stopped it
        raise OnnxExportError(f"{file.name}: the ONNX exporter could not translate {type(module).__name__}: "
                              f"it stopped at {_blocking_operation(error)}") from error
    program.save(str(file))
    session = ort.InferenceSession(str(file), providers=["CPUExecutionProvider"])
    feed = {i.name: t.numpy() for i, t in zip(session.get_inputs(), check)}
    got = session.run(None, feed)
    with torch.no_grad():
        want = _as_tuple(module(*check))
    if len(got) != len(want):
        raise OnnxExportError(f"{file.name} gives {len(got)} outputs in ONNX Runtime, PyTorch {len(want)}")
    pairs = [(torch.as_tensor(g), w) for g, w in zip(got, want) if w.numel()]
    diff = max((float((g - w).abs().max()) for g, w in pairs), default=0.0)
    # relative where values exceed 1: a recurrent state's running sums reach hundreds, and float32 holds
    # about 7 digits of them, whichever runtime adds them up
    excess = max((float(((g - w).abs() / w.abs().clamp(min=1)).max()) for g, w in pairs), default=0.0)
    if not excess <= tolerance:
        raise OnnxExportError(f"{file.name} differs from PyTorch by {diff:.3g} in ONNX Runtime ({excess:.3g} "
                              f"relative to values above 1), more than the tolerance {tolerance:g}; nothing was "
                              "written")
    return diff, excess


def _describe(session_file: Path) -> dict:
    import onnx

    graph = onnx.load(str(session_file), load_external_data=False).graph

    def shape(value) -> list:
        return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]

    return {"inputs": {v.name: shape(v) for v in graph.input}, "outputs": {v.name: shape(v) for v in graph.output}}


def export_onnx(model: nn.Module, outdir, overwrite: bool = True, tolerance: float = TOLERANCE,
                source: str | None = None) -> tuple[Path, dict[str, float]]:
    """Write `model` as an ONNX folder at outdir, each graph checked in ONNX Runtime (see the module
    docstring); returns the folder and the largest absolute difference of each graph."""
    _require_onnx()
    model = copy.deepcopy(model).eval().float()  # the caller's model keeps its mode and dtype
    graphs = _graphs(model)
    diffs: dict[str, float] = {}

    def fill(staging: Path) -> None:
        files = {}
        for name, (module, args, dynamic, inputs, outputs, check) in graphs.items():
            diffs[name], relative = _export_and_check(module, args, dynamic, inputs, outputs, check,
                                                      staging / name, tolerance)
            # both: the absolute difference for a reader, the one the tolerance holds (relative above 1) to check
            files[name] = {**_describe(staging / name), "max_abs_diff": diffs[name], "max_rel_diff": relative}
        config = {
            "format": FORMAT, "format_version": 1, "opset": OPSET, "source": source,
            "model_name": getattr(model, "model_name", None), "class": type(model).__name__, "args": model.config,
            "files": files, "check": f"ONNX Runtime against eager PyTorch in float32, tolerance {tolerance:g}",
        }
        if hasattr(model, "data_cfg"):
            config["preprocessing"] = {k: v for k, v in model.data_cfg().items() if k != "label_names"}
            config["label_names"] = model.config.get("label_names")
        else:
            config["tokenizer"] = model.config.get("tokenizer")
            config["state"] = decoding.state_names(model)
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (staging / "README.md").write_text(_readme(config))

    path = replace_folder(outdir, fill, is_onnx_folder, "ONNX export folder", overwrite)
    return path, diffs


def _readme(config: dict) -> str:
    name = config["model_name"] or config["class"]
    lines = [f"# {name} (ONNX, opset {config['opset']})", "",
             f"Exported by `zoo export {config['source'] or name} OUTDIR --format onnx`. Each graph was run in "
             "ONNX Runtime on inputs of another batch size than it was traced with; the largest absolute "
             "difference from eager PyTorch (float32):", ""]
    lines += [f"- `{f}`: {info['max_abs_diff']:.2e}" for f, info in config["files"].items()]
    if "preprocessing" in config:
        p = config["preprocessing"]
        lines += ["", f"Input: `input` of shape (batch, {', '.join(map(str, p['input_size']))}): values in [0, 1] "
                  f"normalized with mean {list(p['mean'])} and std {list(p['std'])}. Label names are in config.json."]
    else:
        lines += ["", "Decode with `prefill.onnx` (ids -> logits, position, state) and then `step.onnx` "
                  "(ids, position, state -> the same); `zoo.models.decoding.greedy` shows the loop. The "
                  "tokenizer is in config.json."]
    return "\n".join(lines) + "\n"
