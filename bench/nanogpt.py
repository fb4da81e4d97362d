"""zoo's training against nanoGPT's on the same CPU: same data, model size, batch, context and steps, one process
after the other (the tracker issue "Performance: train text faster than nanoGPT on the same CPU", item 1).

    python bench/nanogpt.py --nanogpt /path/to/nanoGPT                  # 1 and 2 threads, float32 and auto
    python bench/nanogpt.py --nanogpt /path/to/nanoGPT --quick          # 60 steps, 1 thread, a smoke test

nanoGPT is not vendored: its own train.py runs from the checkout the user names, with the CPU recipe of its
README (config/train_shakespeare_char.py, --device=cpu --compile=False --eval_iters=20 --log_interval=1
--dropout=0.0, and the size below). Its data is prepared here, as its data/shakespeare_char/prepare.py does
(the first 90% of the characters train, the last 10% validate, the sorted distinct characters are the
vocabulary), from a local input.txt into a temporary folder that `--dataset` points at (an absolute path:
nanoGPT reads data/<dataset>, and os.path.join keeps an absolute one); nothing is written into the checkout
(PYTHONDONTWRITEBYTECODE). Its meta.pkl is written for nanoGPT with pickle.dump; nothing here unpickles it.

zoo runs `zoo fit --config gpt-tiny.shakespeare` on the same input.txt; the context, batch and steps are the
recipe's (context_length, batch_size, train_samples / batch_size), and nanoGPT gets those and gpt-tiny's
width, depth and heads. Both train in float32 (nanoGPT autocasts on CUDA only); zoo also with `precision:
auto` (zoo/training/precision.py measures what this CPU multiplies fastest: on a CPU without AMX it picks
float32, and that run is a second float32 run, a measure of the noise). Threads: OMP_NUM_THREADS and
MKL_NUM_THREADS for both processes (nanoGPT has no flag), and torch.set_num_threads in zoo's process too.

What is measured, the same way for both:
  - train time: the sum of the times from the end of one optimizer step to the end of the next (nanoGPT's
    printed `time ... ms`, zoo's StepClock callback below), over steps 2 to N, leaving out each interval that
    holds an evaluation (nanoGPT evaluates every 250 iterations, zoo every 500 steps). Data loading, logging
    and the optimizer are inside each interval. steps/s and tokens/s (batch x context per step) are over those
    intervals.
  - wall time: the whole process, start-up (imports, data preparation) and evaluations included.
  - validation loss after N steps. nanoGPT's own (`estimate_loss`) is the mean over 20 batches of 12 random
    windows of the validation split; zoo's val/loss is the mean per-token loss over all consecutive
    non-overlapping windows of the split. Both are per-token cross-entropy over windows of `context` tokens,
    so they estimate the same quantity, nanoGPT's with the noise of 15k random tokens. To compare on the same
    tokens, nanoGPT's checkpoint (written at its last evaluation, after N steps) is also scored on zoo's
    windows (`nanogpt val loss, zoo windows`), by nanoGPT's own model code, read with torch.load(weights_only).

Timings are ratios within one run, on one machine; the results JSON records the CPU flags, the thread counts
and the load average before each process (another process on the machine shows there).
Results go to bench/results/nanogpt.json.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lightning as L  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECIPE = "gpt-tiny.shakespeare"
TEXT = "/work/shared/data/tinyshakespeare/input.txt"
NANOGPT_EVAL_INTERVAL = 250  # config/train_shakespeare_char.py's
ITER_LINE = re.compile(r"^iter (\d+): loss ([\d.]+), time ([\d.]+)ms")
EVAL_LINE = re.compile(r"^step (\d+): train loss ([\d.]+), val loss ([\d.]+)")


class StepClock(L.Callback):
    """Times `zoo fit`'s steps the way nanoGPT prints its own: from the end of one optimizer step to the end of
    the next, marking each interval that holds a validation; writes them, the validation losses, the threads
    and the precision to `out` (JSON) when fit ends. `threads` sets torch.set_num_threads when given (at
    construction, before the Trainer's `precision: auto` measures anything)."""

    def __init__(self, out: str, threads: int | None = None):
        if threads is not None:
            torch.set_num_threads(threads)
        self.out = out
        self.created = time.time()
        self.intervals: list[float] = []
        self.evaluated: list[bool] = []
        self.validations: list[dict] = []
        self.last = None
        self.dirty = False
        self.first_step_end = self.last_step_end = None

    def on_validation_start(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.dirty = True

    def on_validation_end(self, trainer, pl_module):
        loss = trainer.callback_metrics.get("val/loss")
        if not trainer.sanity_checking and loss is not None:
            self.validations.append({"step": trainer.global_step, "val/loss": float(loss)})

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        now = time.perf_counter()
        if self.last is not None:
            self.intervals.append(now - self.last)
            self.evaluated.append(self.dirty)
        else:
            self.first_step_end = time.time()
        self.last, self.dirty = now, False
        self.last_step_end = time.time()

    def on_fit_end(self, trainer, pl_module):
        if not trainer.is_global_zero:
            return
        Path(self.out).write_text(json.dumps({
            "intervals": self.intervals, "evaluated": self.evaluated, "validations": self.validations,
            "steps": trainer.global_step, "threads": torch.get_num_threads(),
            "precision": str(trainer.precision), "precision_reason": getattr(trainer, "precision_reason", None),
            "created": self.created, "first_step_end": self.first_step_end, "last_step_end": self.last_step_end,
        }))


def recipe_setup() -> dict:
    """The recipe's context, batch and steps, and gpt-tiny's size, as nanoGPT is given them."""
    from zoo.cli.recipes import read_recipe, resolve_recipe
    from zoo.models.registry import create

    recipe = read_recipe(resolve_recipe(RECIPE)[0])
    data, model = recipe["data"]["init_args"], recipe["model"]["init_args"]
    context, batch = data["context_length"], data["batch_size"]
    steps = data["train_samples"] // batch
    size = create(model["model_name"], vocab_size=65, **model.get("model_overrides", {})).config
    return {"context": context, "batch": batch, "steps": steps, "val_check_interval":
            recipe["trainer"].get("val_check_interval"), "n_layer": size["depth"], "n_head": size["num_heads"],
            "n_embd": size["embed_dim"]}


def prepare_nanogpt_data(text_file: Path, folder: Path) -> dict:
    """train.bin, val.bin and meta.pkl as nanoGPT's data/shakespeare_char/prepare.py makes them, from a local
    file (its prepare.py downloads one)."""
    import numpy as np

    data = text_file.read_text(encoding="utf-8")
    chars = sorted(set(data))
    stoi = {ch: i for i, ch in enumerate(chars)}
    n = len(data)
    train, val = data[: int(n * 0.9)], data[int(n * 0.9):]
    folder.mkdir(parents=True, exist_ok=True)
    np.array([stoi[c] for c in train], dtype=np.uint16).tofile(folder / "train.bin")
    np.array([stoi[c] for c in val], dtype=np.uint16).tofile(folder / "val.bin")
    with open(folder / "meta.pkl", "wb") as f:  # for nanoGPT to read; never loaded here
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)
    return {"vocab_size": len(chars), "train_tokens": len(train), "val_tokens": len(val)}


def thread_env(threads: int) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}


def summarize(intervals: list[float], tokens_per_step: int) -> dict:
    seconds = sum(intervals)
    return {"timed steps": len(intervals), "train s": round(seconds, 2),
            "median step ms": round(statistics.median(intervals) * 1000, 2),
            "steps/s": round(len(intervals) / seconds, 3),
            "tokens/s": round(len(intervals) * tokens_per_step / seconds)}


def run_nanogpt(nanogpt: Path, work: Path, setup: dict, threads: int, eval_interval: int) -> dict:
    dataset, out_dir = work / "shakespeare_char", work / "nanogpt-out"
    shutil.rmtree(out_dir, ignore_errors=True)
    command = [sys.executable, str(nanogpt / "train.py"), "config/train_shakespeare_char.py", "--device=cpu",
               "--compile=False", "--eval_iters=20", "--log_interval=1", f"--block_size={setup['context']}",
               f"--batch_size={setup['batch']}", f"--n_layer={setup['n_layer']}", f"--n_head={setup['n_head']}",
               f"--n_embd={setup['n_embd']}", f"--max_iters={setup['steps']}", f"--lr_decay_iters={setup['steps']}",
               "--dropout=0.0", f"--eval_interval={eval_interval}", f"--dataset={dataset}", f"--out_dir={out_dir}"]
    load = os.getloadavg()[0]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=nanogpt, env=thread_env(threads), capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"nanoGPT's train.py failed (rc {done.returncode}): {done.stderr.strip()[-2000:]}")
    steps, intervals, evals = setup["steps"], [], {}
    for line in done.stdout.splitlines():
        if m := ITER_LINE.match(line):
            it = int(m.group(1))
            # iteration it's time runs from the end of step it - 1 to the end of step it, and holds the
            # evaluation made at its start when it % eval_interval == 0; iteration `steps` is one past N
            if 1 <= it < steps and it % eval_interval:
                intervals.append(float(m.group(3)) / 1000)
        elif m := EVAL_LINE.match(line):
            evals[int(m.group(1))] = float(m.group(3))
    row = {"trainer": "nanoGPT", "threads": threads, "precision": "float32", "load before": round(load, 2),
           **summarize(intervals, setup["batch"] * setup["context"]), "wall s": round(wall, 2),
           "val loss": evals.get(steps)}
    checkpoint = out_dir / "ckpt.pt"
    if checkpoint.exists():
        row.update(score_nanogpt(nanogpt, checkpoint, dataset / "val.bin", setup["context"], threads))
    return row


def score_nanogpt(nanogpt: Path, checkpoint: Path, val_bin: Path, context: int, threads: int) -> dict:
    """nanoGPT's checkpoint scored on zoo's validation windows, in a process of its own (nanoGPT's model code)."""
    done = subprocess.run([sys.executable, __file__, "--score", str(checkpoint), "--nanogpt", str(nanogpt),
                           "--val-bin", str(val_bin), "--context", str(context)],
                          env=thread_env(threads), capture_output=True, text=True)
    if done.returncode != 0:
        return {"zoo-windows error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    scored = json.loads(done.stdout.strip().splitlines()[-1])
    return {"val loss, zoo windows": scored["loss"], "checkpoint iter": scored["iter_num"]}


def score_worker(checkpoint: str, nanogpt: str, val_bin: str, context: int) -> None:
    """The mean per-token loss of nanoGPT's checkpoint over consecutive non-overlapping windows of the validation
    split, batched as zoo's val_dataloader (CharText.FixedWindows, 4 x 12 windows a batch)."""
    import numpy as np

    sys.dont_write_bytecode = True
    sys.path.insert(0, nanogpt)
    from model import GPT, GPTConfig  # nanoGPT's model.py, from the checkout given

    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    model = GPT(GPTConfig(**saved["model_args"]))
    state = {k.removeprefix("_orig_mod."): v for k, v in saved["model"].items()}
    model.load_state_dict(state)
    model.eval()
    tokens = torch.from_numpy(np.fromfile(val_bin, dtype=np.uint16).astype(np.int64))
    count = (len(tokens) - 1) // context
    windows = torch.stack([tokens[i * context: (i + 1) * context + 1] for i in range(count)])
    total, n = 0.0, 0
    with torch.no_grad():
        for batch in windows.split(48):
            x, y = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()  # nanoGPT's loss views its targets
            _, loss = model(x, y)
            total, n = total + float(loss) * y.numel(), n + y.numel()
    print(json.dumps({"loss": round(total / n, 4), "iter_num": int(saved["iter_num"])}))


def run_zoo(text_file: Path, work: Path, setup: dict, threads: int, precision: str, val_check_interval: int,
            quick: bool, compile: bool = False, extra: list[str] = ()) -> dict:
    runs, clock = work / "zoo-runs", work / "zoo-clock.json"
    shutil.rmtree(runs, ignore_errors=True)
    clock.unlink(missing_ok=True)
    callback = {"class_path": "bench.nanogpt.StepClock", "init_args": {"out": str(clock), "threads": threads}}
    command = [sys.executable, "-m", "zoo.cli", "fit", "--config", RECIPE, "--data.init_args.path", str(text_file),
               "--trainer.default_root_dir", str(runs), "--export.dirpath", "null",
               "--trainer.precision", precision, f"--trainer.callbacks+={json.dumps(callback)}"]
    if compile:
        command += ["--model.init_args.compile", "true"]
    command += list(extra)  # more of `zoo fit`'s arguments
    if quick:
        command += ["--data.init_args.train_samples", str(setup["steps"] * setup["batch"]),
                    "--trainer.val_check_interval", str(val_check_interval)]
    env = thread_env(threads)
    if compile:  # compiled from scratch, as a first run compiles: no kernels cached by an earlier run
        env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-", dir=work)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    load = os.getloadavg()[0]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"zoo fit failed (rc {done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}")
    timed = json.loads(clock.read_text())
    intervals = [s for s, evaluated in zip(timed["intervals"], timed["evaluated"]) if not evaluated]
    final = [v for v in timed["validations"] if v["step"] == setup["steps"]]
    return {"trainer": "zoo", "threads": timed["threads"], "precision": timed["precision"],
            "asked": precision, "compile": compile, "load before": round(load, 2),
            **summarize(intervals, setup["batch"] * setup["context"]), "wall s": round(wall, 2),
            "val loss": final[-1]["val/loss"] if final else None, "precision_reason": timed["precision_reason"]}


# Where a step of `zoo fit` goes (cProfile's cumulative seconds; it inflates Python's share, Lightning's, against
# the kernels'): (label, file suffix, function), each summed over its calls in the training loop.
PROFILE_PARTS = [
    ("training loop (all of it)", "loops/training_epoch_loop.py", "advance"),
    ("forward (training_step, less self.log)", "zoo/training/language_model.py", "training_step"),
    ("self.log in training_step", "lightning/pytorch/core/module.py", "log"),
    ("backward", "torch/_tensor.py", "backward"),
    ("optimizer.step (less the closure)", "torch/optim/optimizer.py", "wrapper"),
    ("zero_grad", "loops/optimization/automatic.py", "zero_grad_fn"),
    ("data: the next batch", "loops/fetchers.py", "__next__"),
    ("callbacks' hooks (progress bar, checkpoint, ...)", "lightning/pytorch/trainer/call.py", "_call_callback_hooks"),
    ("learning-rate schedule", "loops/training_epoch_loop.py", "update_lr_schedulers"),
]


def profile_zoo(text_file: Path, steps: int, precision: str, unfused: bool) -> dict:
    """`zoo fit --config gpt-tiny.shakespeare` for `steps` steps in this process under cProfile (no validation
    falls within them), its training loop's time split as PROFILE_PARTS; unfused: AdamW as before zoo fused it."""
    import cProfile
    import pstats

    from zoo.cli.lightning import run_lightning
    from zoo.training import optim

    if unfused:
        optim.adamw = lambda groups, lr, betas=(0.9, 0.95): torch.optim.AdamW(groups, lr=lr, betas=betas)
    with tempfile.TemporaryDirectory(prefix="zoo-profile-") as tmp:
        args = ["fit", "--config", RECIPE, "--data.init_args.path", str(text_file), "--trainer.default_root_dir",
                tmp, "--export.dirpath", "null", "--trainer.precision", precision, "--trainer.max_steps", str(steps),
                "--trainer.enable_progress_bar", "true"]
        profiler = cProfile.Profile()
        profiler.enable()
        run_lightning(args)
        profiler.disable()
    stats = pstats.Stats(profiler).stats

    def cumulative(suffix: str, name: str, caller: tuple[str, str] | None = None) -> float:
        total = 0.0
        for (file, _, function), (_, _, _, cum, callers) in stats.items():
            if function != name or not file.endswith(suffix):
                continue
            if caller is None:
                total += cum
            else:
                total += sum(c[3] for (cf, _, cn), c in callers.items() if cf.endswith(caller[0]) and cn == caller[1])
        return total

    parts = {label: cumulative(suffix, name) for label, suffix, name in PROFILE_PARTS}
    parts["self.log in training_step"] = cumulative("lightning/pytorch/core/module.py", "log",
                                                    ("zoo/training/language_model.py", "training_step"))
    parts["forward (training_step, less self.log)"] -= parts["self.log in training_step"]
    parts["optimizer.step (less the closure)"] -= cumulative("loops/optimization/automatic.py", "closure")
    parts["callbacks' hooks (progress bar, checkpoint, ...)"] = cumulative(
        "lightning/pytorch/trainer/call.py", "_call_callback_hooks", ("loops/training_epoch_loop.py", "advance"))
    loop = parts.pop("training loop (all of it)")
    parts["the rest of Lightning's loop"] = loop - sum(v for k, v in parts.items() if k != "backward") - \
        parts["backward"]
    rows = [{"part": k, "ms a step": round(v / steps * 1000, 3), "share": round(v / loop, 4)} for k, v in parts.items()]
    return {"steps": steps, "precision": precision, "optimizer": "AdamW (unfused)" if unfused else "optim.adamw",
            "loop ms a step": round(loop / steps * 1000, 2), "threads": torch.get_num_threads(), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", type=Path, help="a checkout of github.com/karpathy/nanoGPT (read, not written)")
    parser.add_argument("--text", type=Path, default=Path(TEXT), help="tiny-shakespeare's input.txt")
    parser.add_argument("--threads", type=int, nargs="+", help="default 1 and 2 (--quick: 1)")
    parser.add_argument("--precisions", nargs="+", help="zoo's (nanoGPT's is float32): default 32-true and auto "
                                                         "(--quick: 32-true)")
    parser.add_argument("--compile", action="store_true",
                        help="also zoo with model.init_args.compile true, in the last of --precisions")
    parser.add_argument("--quick", action="store_true", help="60 steps, a smoke test: nothing written")
    parser.add_argument("--out", default="nanogpt", help="bench/results/OUT.json")
    parser.add_argument("--profile", type=int, metavar="STEPS",
                        help="instead: profile STEPS steps of zoo's training (cProfile), in each of --precisions, with "
                             "AdamW unfused (as before) and as zoo makes it; bench/results/OUT_profile.json")
    parser.add_argument("--score", help=argparse.SUPPRESS)
    parser.add_argument("--val-bin", help=argparse.SUPPRESS)
    parser.add_argument("--profile-worker", help=argparse.SUPPRESS)
    parser.add_argument("--context", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.score:
        score_worker(args.score, str(args.nanogpt), args.val_bin, args.context)
        return
    if args.profile_worker:
        text, steps, precision, unfused = json.loads(args.profile_worker)
        result = profile_zoo(Path(text), steps, precision, unfused)
        sys.stdout.flush()
        print(json.dumps(result))
        return
    from bench.common import cpu_flags, print_table, write_json

    if args.profile:
        torch.set_num_threads((args.threads or [1])[0])
        results = []
        for precision in args.precisions or ["32-true", "auto"]:
            for unfused in (True, False):
                # a process of its own for each: the precision's measurement, the imports and the caches start alike
                done = subprocess.run([sys.executable, __file__, "--profile-worker", json.dumps(
                    [str(args.text), args.profile, precision, unfused])], capture_output=True, text=True,
                    env=thread_env(torch.get_num_threads()))
                if done.returncode != 0:
                    sys.exit(f"profiling failed: {done.stderr.strip()[-2000:]}")
                result = json.loads(done.stdout.strip().splitlines()[-1])
                results.append(result)
                print_table(f"{result['precision']}, {result['optimizer']}: {result['loop ms a step']} ms a step "
                            f"under cProfile ({result['threads']} thread(s))", result["rows"])
        path = write_json(f"{args.out}_profile", {"cpu_flags": cpu_flags(), "profiles": results})
        print(f"\nwrote {path}")
        return
    if args.nanogpt is None or not (args.nanogpt / "train.py").is_file() or not (args.nanogpt / "model.py").is_file():
        sys.exit(f"--nanogpt must name a nanoGPT checkout (train.py, model.py), got {args.nanogpt}")
    if not args.text.is_file():
        sys.exit(f"--text: no file {args.text} (tiny-shakespeare's input.txt)")
    setup = recipe_setup()
    threads = args.threads or ([1] if args.quick else [1, 2])
    precisions = args.precisions or (["32-true"] if args.quick else ["32-true", "auto"])
    eval_interval, val_check = NANOGPT_EVAL_INTERVAL, setup["val_check_interval"]
    if args.quick:
        setup["steps"] = 60
        eval_interval = val_check = 20
    rows = []
    with tempfile.TemporaryDirectory(prefix="zoo-nanogpt-") as tmp:
        work = Path(tmp)
        data = prepare_nanogpt_data(args.text, work / "shakespeare_char")
        for n in threads:
            nano = run_nanogpt(args.nanogpt.resolve(), work, setup, n, eval_interval)
            rows.append(nano)
            variants = [(p, False) for p in precisions] + ([(precisions[-1], True)] if args.compile else [])
            for precision, compiled in variants:
                row = run_zoo(args.text.resolve(), work, setup, n, precision, val_check, args.quick, compiled)
                row["x nanoGPT tokens/s"] = round(row["tokens/s"] / nano["tokens/s"], 3)
                row["x nanoGPT wall"] = round(nano["wall s"] / row["wall s"], 3)
                rows.append(row)
                print(f"{n} thread(s), zoo {row['precision']}{' compiled' * compiled}: {row['x nanoGPT tokens/s']}x "
                      "nanoGPT's tokens/s",
                      file=sys.stderr)
    columns = ["trainer", "threads", "precision", "compile", "timed steps", "train s", "median step ms", "steps/s",
               "tokens/s", "x nanoGPT tokens/s", "wall s", "x nanoGPT wall", "val loss", "val loss, zoo windows",
               "load before"]
    columns += [c for c in ("zoo-windows error",) if any(c in row for row in rows)]
    print_table(f"zoo fit --config {RECIPE} against nanoGPT's train.py ({setup['steps']} steps, batch "
                f"{setup['batch']}, context {setup['context']}, {setup['n_layer']} layers, {setup['n_head']} heads, "
                f"width {setup['n_embd']})", rows, columns)
    if args.quick:
        return
    path = write_json(args.out, {"cpu_flags": cpu_flags(), "cpu_count": os.cpu_count(), "setup": setup,
                                 "data": data, "nanogpt": str(args.nanogpt), "rows": rows})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
