"""Which ops give other bits on a CPU of another kind: the suite's models trained a few steps with PyTorch's
libraries held to a narrower vector width than this CPU's, against the same steps at this CPU's own.

    python bench/cpu_kinds.py                       # the six models below, 30 steps (about 1.5 minutes, 1 thread)
    python bench/cpu_kinds.py --models micro-gpt-tiny --steps 5
    python bench/cpu_kinds.py --task induction_heads  # its vocabulary and length (256, 64) instead of (16, 128)

A capabilities run repeats its record to the digit on the same kind of CPU, and some do not on another kind (README,
the three-seed sweep): an AVX2 CPU's kernels sum in another order than an AVX-512 CPU's. Which kernels? Each variant
below runs in a fresh process (the libraries read these settings once, at start) and trains each model `--steps`
steps from the same seed on the same random tokens, at the vocabulary and length of `--task` (selective copying's by
default), with one thread; the table says to which other variants' weights its weights came out equal, bit for bit,
and, against this CPU's own run, the largest change and the first module, in forward order, whose output on one
batch before training differs; a second table says whether the training loss's own kernels, which are no module (the
log-softmax over the vocabulary and the cross-entropy's gradient), give this CPU's bits under each variant. The
variants: oneDNN (PyTorch's library for GELU, among others) held one width lower with ONEDNN_MAX_CPU_ISA; oneDNN
switched off (`torch.backends.mkldnn.enabled = False`: PyTorch's own kernels instead), at this CPU's width and one
lower; on an AVX-512 CPU also ATen's own kernels and zoo's (built for it, native.py) held to AVX2 with
ATEN_CPU_CAPABILITY, beside oneDNN: an AVX2 CPU but for MKL; on a CPU with AMX also oneDNN held below it
(AVX512_CORE_BF16: an AVX-512 CPU without AMX, as the suite's). ATen is not held lower than AVX2: below it there is
only its scalar fallback, which also draws other random numbers, so every weight would differ from the first. MKL's
matrix products stay at this CPU's width: MKL_ENABLE_INSTRUCTIONS did not move one of their bits on an AVX2 CPU.
ELiTA with ALiBi, which has no GELU, repeated its selective-copying runs to the digit on AVX2 and AVX-512 CPUs at
every rate and its induction runs (a vocabulary of 256, not 16) at the three slowest only, so some kernel beside
oneDNN's GELU rounds by width too; on an AVX2 CPU this script cannot hold it lower, on an AVX-512 CPU it can (ATen
at AVX2).
Results go to bench/results/cpu_kinds_<width>.json, one file per vector width (cpu_kinds_avx2.json from an AVX2
CPU, cpu_kinds_avx512.json from an AVX-512 one), so that a run on one kind does not replace the other's; with
another --task, cpu_kinds_<width>_<task>.json.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.common import cpu_flags, in_subprocess, print_table, write_json  # noqa: E402

MODELS = ["gpt-tiny", "quiet-gpt-tiny", "micro-gpt-tiny", "micro-gpt-tiny:alibi", "elita-gpt-tiny",
          "elita-gpt-tiny:alibi"]
# One width below this CPU's: ATen's capability -> oneDNN's name for the width below it
LOWER = {"AVX512": "AVX2", "AVX2": "AVX"}
# --task: capabilities tasks (bench/capabilities.py TASKS, which gives their vocabulary and length); the first is the
# default, whose results file has no task in its name
TASK_CHOICES = ("selective_copying", "induction_heads", "mqar")
BATCH = 8
MAX_STEPS = 1000  # bits part within a step or two; 30 steps take about 1.5 minutes for the six models


def variants() -> dict[str, dict]:
    """Each variant's environment and whether oneDNN is on, by name; only this CPU's own where it has no
    narrower width to hold the libraries to."""
    own = {"this CPU": {"env": {}, "onednn": True}}
    lower = LOWER.get(torch.backends.cpu.get_cpu_capability())
    if lower is None:
        return own
    return {**own,
            f"oneDNN at {lower}": {"env": {"ONEDNN_MAX_CPU_ISA": lower}, "onednn": True},
            "oneDNN off": {"env": {}, "onednn": False},
            f"oneDNN off, at {lower}": {"env": {"ONEDNN_MAX_CPU_ISA": lower}, "onednn": False},
            **({"ATen and oneDNN at AVX2": {"env": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
                                            "onednn": True}} if lower == "AVX2" else {}),
            **({"oneDNN without AMX": {"env": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "onednn": True}}
               if "amx_bf16" in cpu_flags() else {})}


def digest(tensors) -> str:
    sha = hashlib.sha256()
    for t in tensors:
        sha.update(t.detach().contiguous().numpy().tobytes())
    return sha.hexdigest()[:16]


def module_outputs(net: torch.nn.Module, tokens: torch.Tensor) -> list[tuple[str, str, str]]:
    """(name, class, digest of its output) of each innermost module of `net`, in the order they run on `tokens`."""
    outputs = []

    def record(module, inputs, output, name):  # some layers return (output, state): every tensor of it counts
        tensors = [t for t in (output if isinstance(output, (tuple, list)) else [output]) if torch.is_tensor(t)]
        outputs.append((name, type(module).__name__, digest(tensors)))

    hooks = [m.register_forward_hook(functools.partial(record, name=n))
             for n, m in net.named_modules() if not list(m.children())]
    with torch.no_grad():
        net(tokens)
    for hook in hooks:
        hook.remove()
    return outputs


def loss_digests(vocab: int, length: int) -> dict[str, str]:
    """Digests of the training loss's own kernels on fixed logits of a batch at this vocabulary and length: the
    log-softmax over the vocabulary and the cross-entropy's gradient. The loss is no module, so module_outputs does
    not see it."""
    draw = torch.Generator().manual_seed(2)
    logits = torch.randn(BATCH * length, vocab, generator=draw, requires_grad=True)
    F.cross_entropy(logits, torch.randint(0, vocab, (BATCH * length,), generator=draw)).backward()
    return {"log-softmax": digest([torch.log_softmax(logits.detach(), -1)]),
            "cross-entropy gradient": digest([logits.grad])}


def worker(job: dict) -> dict:
    """Train each model `steps` steps and save its weights in the job's folder; each module's output digest on the
    first batch (forward order), the weights' file and the last loss; and the loss kernels' digests (loss_digests)."""
    import safetensors.torch

    import zoo
    from bench.capabilities import model_spec

    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = job["onednn"]
    vocab, length = job["vocab"], job["length"]
    out = {"loss kernels": loss_digests(vocab, length), "models": {}}
    for model in job["models"]:
        torch.manual_seed(0)
        name, size = model_spec(model)
        net = zoo.create(name, vocab_size=vocab, context_length=length, **size)
        tokens = torch.Generator().manual_seed(1)  # the same batches for every model and variant
        batches = (torch.randint(0, vocab, (BATCH, length + 1), generator=tokens) for _ in range(job["steps"]))
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
        outputs = None
        for batch in batches:
            if outputs is None:
                outputs = module_outputs(net, batch[:, :-1])
            loss = F.cross_entropy(net(batch[:, :-1]).reshape(-1, vocab), batch[:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        weights = Path(job["folder"]) / f"{job['variant']}-{model}.safetensors".replace(" ", "_").replace(":", "_")
        safetensors.torch.save_file({n: p.detach().contiguous() for n, p in net.named_parameters()}, weights)
        out["models"][model] = {"file": str(weights), "outputs": outputs, "loss": loss.item()}
    return out


def first_difference(outputs: list, own: list) -> str:
    """The first module, in forward order, whose output digest is not this CPU's own; "-" where none is."""
    for (name, kind, sha), (_, _, own_sha) in zip(outputs, own):
        if sha != own_sha:
            return f"{name} ({kind})"
    return "-"


def largest_change(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest |a - b| over two models' weights (0.0 where they are equal bit for bit, nan where one holds a NaN:
    torch's max keeps it, Python's would depend on the order)."""
    changes = [(a[n] - b[n]).abs().max() for n in a if a[n].numel()]
    return torch.stack(changes).max().item() if changes else 0.0


def equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[n], b[n]) for n in a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=MODELS, help="suite models, as bench/capabilities.py names them")
    parser.add_argument("--steps", type=int, default=30,
                        help=f"training steps per model, 1 to {MAX_STEPS} (default 30)")
    parser.add_argument("--task", choices=TASK_CHOICES, default=TASK_CHOICES[0],
                        help="train at this capabilities task's vocabulary and length (default selective_copying)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if not 1 <= args.steps <= MAX_STEPS:
        parser.error(f"--steps must be 1 to {MAX_STEPS} (bits part within a step or two), got {args.steps}")
    from bench.capabilities import TASKS, unbuildable

    for model in args.models:
        if why := unbuildable(model):
            parser.error(f"--models: {model}: {why}")
    import safetensors.torch

    shape = TASKS[args.task][1]
    settings, runs = variants(), {}
    with tempfile.TemporaryDirectory() as folder:
        for variant, setting in settings.items():
            job = {"variant": variant, "models": args.models, "steps": args.steps, "onednn": setting["onednn"],
                   "folder": folder, "vocab": shape["vocab_size"], "length": shape["sequence_length"]}
            runs[variant] = in_subprocess(__file__, job, timeout=None, env=setting["env"])  # --steps bounds it
            if "error" in runs[variant]:
                sys.exit(f"bench/cpu_kinds.py: the run '{variant}' failed: {runs[variant]['error']}")
        weights = {(v, m): safetensors.torch.load_file(run["models"][m]["file"])
                   for v, run in runs.items() for m in args.models}
    own = runs["this CPU"]["models"]
    rows = [{"model": model, "variant": variant,
             "weights equal to": ", ".join(v for v in runs if v != variant
                                           and equal(weights[v, model], weights[variant, model])) or "none",
             "largest |change|": largest_change(weights[variant, model], weights["this CPU", model]),
             "first module that differs": first_difference(run["models"][model]["outputs"], own[model]["outputs"]),
             "loss": run["models"][model]["loss"]}
            for model in args.models for variant, run in runs.items()]
    kernels = {variant: {name: sha == runs["this CPU"]["loss kernels"][name]
                         for name, sha in run["loss kernels"].items()} for variant, run in runs.items()}
    flags, capability = cpu_flags(), torch.backends.cpu.get_cpu_capability()
    print_table(f"{args.steps} steps from one seed at {args.task}'s vocabulary and length, against this CPU's own run "
                f"(ATen at {capability}, cpu_flags {flags})", rows)
    print_table(f"the loss's kernels at {args.task}'s vocabulary and length: bits equal to this CPU's own",
                [{"variant": variant, **equal_bits} for variant, equal_bits in kernels.items()])
    write_json(f"cpu_kinds_{capability.lower()}" + ("" if args.task == TASK_CHOICES[0] else f"_{args.task}"),
               {"command": " ".join(["python bench/cpu_kinds.py", *sys.argv[1:]]), "cpu_flags": flags,
                "capability": capability, "task": args.task, "vocab_size": shape["vocab_size"],
                "sequence_length": shape["sequence_length"], "steps": args.steps, "threads per run": 1,
                "variants": {v: s["env"] | {"onednn": s["onednn"]} for v, s in settings.items()}, "rows": rows,
                "loss kernels equal to this CPU's": kernels})


if __name__ == "__main__":
    main()
