"""Deployment speed: eager PyTorch against torch.compile and ONNX Runtime.

    python bench/deploy.py            # every shipped image checkpoint and the four text models (~15 minutes)
    python bench/deploy.py --quick    # fewer repetitions

1. Inference, items per second at batch 1 and 64, for every shipped image checkpoint: eager
   PyTorch (inference_mode), torch.compile (inductor, fullgraph) and ONNX Runtime on the graph
   `zoo export --format onnx` writes (checked against PyTorch to 1e-4 as it is written), with as
   many threads as PyTorch and no spinning between runs. The three are timed in turn, round
   after round, so the ratios (eager time over the other's; above 1: faster than eager) come
   from one run.
   Beside the rotation, ONNX Runtime alone at its best setting (1 or all threads, spinning
   or not) against eager alone: `ort_best_alone_x`.
2. Decoding, milliseconds per token at a context of 256 tokens (a prompt of 256, then one new
   token per step, batch 1, float32), for gpt-tiny, quiet-gpt-tiny, micro-gpt-tiny and
   elita-gpt-tiny: the decoding step (zoo/models/decoding.py: the KV cache, or the recurrent
   state) eager, through torch.compile (inductor, fullgraph, dynamic shapes, so the growing
   cache does not recompile) and as the exported step program compiled ahead of time by
   AOTInductor (no Python in the call). The shipped text checkpoints were trained at a
   context of 64; the registered configurations (context 256) are timed with random
   weights, as speed does not depend on the weights.

Results go to bench/results/deploy.json. Run it on an idle machine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import zoo  # noqa: E402
from bench.common import cpu_flags, print_table, timeit, timeit_rotation, write_json  # noqa: E402
from zoo.models import decoding  # noqa: E402
from zoo.release.onnx import export_onnx  # noqa: E402

TEXT_MODELS = ["gpt-tiny", "quiet-gpt-tiny", "micro-gpt-tiny", "elita-gpt-tiny"]
CONTEXT = 256


def image_checkpoints() -> list[str]:
    names = []
    for name in zoo.list_models(pretrained=True):
        if zoo.models.registry.entry(name).family != "text":
            names += [f"{name}.{tag}" for tag in zoo.models.registry.pretrained_tags(name)]
    return names


def ort_session(file: Path, threads: int, spinning: bool):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    session = ort.InferenceSession(str(file), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})[0]


def bench_images(names: list[str], rounds: int, min_time: float) -> list[dict]:
    rows = []
    for name in names:
        model = zoo.load(name).eval()
        shape = getattr(model, "expected_shape", model.input_shape)
        with tempfile.TemporaryDirectory() as tmp:
            export_onnx(model, Path(tmp) / "onnx")
            file = Path(tmp) / "onnx" / "model.onnx"
            threads = torch.get_num_threads()
            # ONNX Runtime's threads spin after each run by default, taking the cores from whatever runs
            # next: in the rotation they may not; alone, each setting of threads and spinning is tried
            ort_run = ort_session(file, threads, spinning=False)
            alone = {(t, spin): ort_session(file, t, spin) for t in sorted({1, threads}) for spin in (False, True)}
            compiled = torch.compile(model, fullgraph=True)
            for batch in (1, 64):
                x = torch.randn(batch, *shape)
                array = x.numpy()
                with torch.inference_mode():
                    eager_s, compiled_s, ort_s = timeit_rotation(
                        [partial(model, x), partial(compiled, x), partial(ort_run, array)], rounds, min_time)
                    best = min(timeit(partial(run, array), min_time, rounds) for run in alone.values())
                    eager_alone = timeit(partial(model, x), min_time, rounds)
                row = {"model": name, "batch": batch, "eager_per_s": batch / eager_s,
                       "compiled_per_s": batch / compiled_s, "ort_per_s": batch / ort_s,
                       "compiled_x": eager_s / compiled_s, "ort_x": eager_s / ort_s,
                       "ort_best_alone_x": eager_alone / best}
                rows.append(row)
                print(row, flush=True)
        torch._dynamo.reset()
    return rows


def bench_decoding(names: list[str], rounds: int, min_time: float) -> list[dict]:
    rows = []
    for name in names:
        model = zoo.create(name, context_length=CONTEXT + 1).eval()  # room for the new token after 256
        prompt = torch.randint(0, model.vocab_size, (1, CONTEXT))
        step = decoding.Step(model).eval()
        compiled = torch.compile(step, fullgraph=True, dynamic=True)
        with tempfile.TemporaryDirectory() as tmp:
            # the exported step (eager routes: all of it generated C++) through AOTInductor
            _, exported = decoding.export(model, eager_routes=True)
            package = torch._inductor.aoti_compile_and_package(exported, package_path=str(Path(tmp) / "step.pt2"))
            aoti = torch._inductor.aoti_load_package(package)
        with torch.inference_mode():
            logits, position, *state = decoding.Prefill(model)(prompt)
            nxt = logits[:, -1].argmax(-1, keepdim=True)
            want = step(nxt, position, *state)[0]
            for run in (compiled, aoti):
                torch.testing.assert_close(run(nxt, position, *state)[0], want, rtol=0, atol=1e-4)
            eager_s, compiled_s, aoti_s = timeit_rotation(
                [partial(f, nxt, position, *state) for f in (step, compiled, aoti)], rounds, min_time)
        row = {"model": name, "context": CONTEXT, "eager_ms": eager_s * 1e3, "compiled_ms": compiled_s * 1e3,
               "aoti_ms": aoti_s * 1e3, "compiled_x": eager_s / compiled_s, "aoti_x": eager_s / aoti_s}
        rows.append(row)
        print(row, flush=True)
        torch._dynamo.reset()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--images", nargs="*", default=None, help="image checkpoints (default: all shipped)")
    parser.add_argument("--text", nargs="*", default=TEXT_MODELS)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    rounds, min_time = (50, 0.5) if args.quick else (300, 2.0)
    images = bench_images(args.images if args.images is not None else image_checkpoints(), rounds, min_time)
    text = bench_decoding(args.text, rounds, min_time)
    print_table("Inference, items per second (ratios: eager time / other time)", images,
                ["model", "batch", "eager_per_s", "compiled_per_s", "ort_per_s", "compiled_x", "ort_x",
                 "ort_best_alone_x"])
    print_table(f"Decoding at context {CONTEXT}, ms per token, batch 1", text,
                ["model", "eager_ms", "compiled_ms", "aoti_ms", "compiled_x", "aoti_x"])
    path = write_json("deploy", {"command": "python bench/deploy.py" + (" --quick" if args.quick else ""),
                                 "cpu_flags": cpu_flags(), "inference": images, "decoding": text})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
