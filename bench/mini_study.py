"""The mini study: do the tiny models' conclusions hold at ten times the size?

    python bench/mini_study.py                            # every mini release in checkpoints/ (*-mini.*)
    python bench/mini_study.py --releases runs/mini/*     # release folders elsewhere (a `zoo fit` export)
    python bench/mini_study.py --table                    # the table from bench/results/mini_study.json

The mini models (`gpt-mini`, `elita-gpt-mini`, `incontext-gpt-mini`, `hybrid-elita-conv1-gpt-mini`,
`ssd-gpt-mini`: width 256, 6 blocks, a context of 2,048) train with the tiny long-context checkpoints' recipe
(recipes/*-mini.{warpeace,stdlib}.yaml). For each release this reads what its folder records (parameters, the
validation loss it was selected by, training hours, threads, precision) and its loss by position, which
`python bench/long_context.py --releases FOLDER ...` (`--text stdlib` for the standard library) writes first,
and sets beside it the figure of the tiny form it scales up: on War and Peace the tiny checkpoint of the same
form (its validation loss, the same recipe at width 128 and 4 blocks); on the standard library the capability
suite's form (its mean test loss over the seeds run, width 64, 2 blocks, a context of 1,024), the only tiny
figure there is. The verdicts, in docs/capabilities/mini.md, are read from this table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import long_context  # noqa: E402
from bench.common import RESULTS, locked, machine, nothing_to_show, read_runs  # noqa: E402
from zoo.data.sequences import STDLIB  # noqa: E402
from zoo.utils.atomic import write_text_atomic  # noqa: E402

OUT = RESULTS / "mini_study.json"
ROOT = Path(__file__).resolve().parents[1]
TEXTS = {"warpeace": long_context.OUT, "stdlib": long_context.OUT_STDLIB}  # where bench/long_context.py writes
# The tiny form each mini model scales up: a shipped War and Peace checkpoint, and a capability-suite model whose
# stdlib column is the tiny study's figure on Python source. None: the tiny study has no such run.
TINY = {
    "gpt-mini": {"warpeace": "gpt-tiny.warpeace-rope", "stdlib": "gpt-tiny:rope"},
    "elita-gpt-mini": {"warpeace": "elita-gpt-tiny.warpeace-alibi", "stdlib": "elita-gpt-tiny:alibi"},
    "incontext-gpt-mini": {"warpeace": None, "stdlib": "incontext-gpt-tiny"},
    "hybrid-elita-conv1-gpt-mini": {"warpeace": None, "stdlib": "hybrid-elita-gpt-tiny:conv1"},
    "ssd-gpt-mini": {"warpeace": "ssd-gpt-tiny.warpeace", "stdlib": "ssd-gpt-tiny"},
}


def tiny_figure(model: str, text: str) -> dict | None:
    """The tiny form's figure on `text`: {"name", "loss", "source"}, or None where the tiny study has none."""
    name = TINY[model][text]
    if name is None:
        return None
    if text == "warpeace":
        config = json.loads((ROOT / "checkpoints" / name / "config.json").read_text())
        return {"name": name, "loss": round(config["metrics"]["val/loss"], 4), "source": "validation loss, shipped"}
    runs = read_runs(RESULTS / "capabilities.json")["runs"]
    losses = [r["metrics"]["test/loss"] for r in runs.values() if r["task"] == "stdlib" and r["model"] == name]
    if not losses:
        return None
    return {"name": name, "loss": round(sum(losses) / len(losses), 4),
            "source": f"capability suite, test loss, mean of {len(losses)} seed{'s' * (len(losses) > 1)}"}


def has_amx(training: dict) -> bool | None:
    """Whether the CPU a run trained on has AMX (Intel's matrix units, which make bf16 training several times
    faster than avx512_bf16 alone), as `precision: auto` recorded its flags; None where the run did not record them."""
    reason = training.get("precision_reason")
    if not isinstance(reason, str) or "CPU flags:" not in reason:
        return None
    flags = reason.split("CPU flags:", 1)[1].strip()
    return not flags.startswith("none of") and "amx_bf16" in flags.rstrip(")").split()


def record(folder: Path) -> dict:
    """One mini release's row: what its folder records, its loss by position, and its tiny form's figure."""
    import zoo

    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{folder} is not a release folder (no config.json): give the folder `zoo fit` exported")
    try:
        config = json.loads(config_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{config_path} is not a release's config ({error}): give the folder `zoo fit` exported") \
            from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_path} is not a release's config (not a JSON object): give the folder `zoo fit` "
                         "exported")
    model_name, training = config.get("model_name"), config.get("training") or {}
    if model_name not in TINY:
        raise ValueError(f"{folder} holds {model_name!r}, not a mini model; expected one of {', '.join(TINY)}")
    if "val/loss" not in (config.get("metrics") or {}) or not {"seconds", "command"} <= set(training):
        raise ValueError(f"{folder} records no validation loss or no training run: give a folder `zoo fit` exported")
    # LongContextText records the standard library as its path, a text file by the file's name
    text = "stdlib" if (training.get("data") or {}).get("init_args", {}).get("path") == STDLIB else "warpeace"
    scored = read_runs(TEXTS[text])["runs"].get(folder.name)
    if scored is None:
        flag = " --text stdlib" if text == "stdlib" else ""
        shown = TEXTS[text].relative_to(ROOT) if TEXTS[text].is_relative_to(ROOT) else TEXTS[text]
        raise ValueError(f"{folder.name} has no loss by position in {shown}: run `python "
                         f"bench/long_context.py --releases {folder}{flag}` first")
    context = str(scored["context"])
    loss = scored["by_length"][context]["loss"]
    half = f"{int(context) // 2}-{context}"
    kept = scored.get("keeps_context_at_4x")
    far = scored["by_length"].get("131072", {}).get("loss", {}).get("65536-131072")
    return {
        "model": model_name,
        "text": text,
        "parameters": sum(p.numel() for p in zoo.load(str(folder)).parameters()),
        "val_loss": round(config["metrics"]["val/loss"], 4),
        "hours": round(training["seconds"] / 3600, 2),
        # a run resumed from a checkpoint: zoo's exporter carries the time before the resume where the checkpoint
        # had it; an older record counted the resumed part's time only
        "resumed": "--ckpt_path" in training["command"].split() or bool(training.get("resumed_at_step")),
        "resumed_at_step": training.get("resumed_at_step") if training.get("seconds_before_resume") is not None
        else None,
        "threads": training.get("threads"),
        "precision": training.get("precision"),
        "amx": has_amx(training),
        "command": training["command"],
        "first": round(loss["0-64"], 4),
        "second_half": round(loss[half], 4),
        "gain": scored["uses_context"]["gain"], "gain_met": scored["uses_context"]["met"],
        "rise_4x": kept["rise"] if kept else None, "rise_met": kept["met"] if kept else None,
        "at_64x": round(far, 4) if far is not None else None,
        "tiny": tiny_figure(model_name, text),
    }


CPU = {True: ", AMX", False: ", no AMX"}  # a row without the record (None) says nothing of its CPU


def resumed(row: dict) -> str:
    """What a resumed run's hours cover: the whole run where the export recorded the step it resumed at."""
    if row.get("resumed_at_step"):
        return f"; resumed at step {row['resumed_at_step']:,}"
    return "; the resumed part only" if row.get("resumed") else ""


def table(results: dict) -> list[str]:
    """The page's table, one row per release, each text's rows by validation loss."""
    lines = ["| model | text | parameters | val loss | its tiny form | 0-63 | 1,024-2,047 | gain (>= 0.15) | "
             "4x rise (<= 0.05) | 65,536-131,071 | hours |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    runs = sorted(results["runs"].values(), key=lambda r: (r["text"] != "warpeace", r["val_loss"]))
    for r in runs:
        tiny = r["tiny"]
        tiny_cell = f"`{tiny['name']}` {tiny['loss']:.3f}" if tiny else "- (not in the tiny study)"
        rise = "-" if r["rise_4x"] is None else f"{r['rise_4x']:+.3f} {'met' if r['rise_met'] else '**not met**'}"
        far = "-" if r["at_64x"] is None else f"{r['at_64x']:.4f}"
        text = "War and Peace" if r["text"] == "warpeace" else "Python stdlib"
        lines.append(f"| `{r['model']}` | {text} | {r['parameters']:,} | {r['val_loss']:.3f} | {tiny_cell} | "
                     f"{r['first']:.3f} | {r['second_half']:.3f} | "
                     f"{r['gain']:+.3f} {'met' if r['gain_met'] else '**not met**'} | {rise} | {far} | "
                     f"{r['hours']:.2f} ({r['threads']} thread{'s' * (r['threads'] != 1)}, {r['precision']}"
                     f"{CPU.get(r.get('amx'), '')}{resumed(r)}) |")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--releases", nargs="+", default=None, help="mini release folders (default: every "
                        "checkpoints/*-mini.* release)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"default bench/results/{OUT.name}")
    parser.add_argument("--table", action="store_true", help="print the table from --out, run nothing")
    args = parser.parse_args(argv)
    try:
        results = read_runs(args.out)
        if args.table and not results["runs"]:
            raise ValueError(nothing_to_show(args.out))
        if not args.table:
            folders = [Path(f) for f in args.releases] if args.releases else sorted(
                f.parent for f in (ROOT / "checkpoints").glob("*-mini.*/config.json"))
            if not folders:
                raise ValueError("no mini release in checkpoints/: train one (recipes/*-mini.*.yaml) and pass its "
                                 "folder with --releases")
            rows = {folder.name: record(folder) for folder in folders}  # all read before anything is written
            with locked(args.out.stem):
                results = read_runs(args.out)
                results["runs"].update(rows)
                results.update({"command": "python bench/mini_study.py " + " ".join(argv or sys.argv[1:]),
                                "machine": machine()})
                write_text_atomic(args.out, json.dumps(results, indent=2))
    except (OSError, ValueError) as e:
        raise SystemExit(f"bench/mini_study.py: error: {e}") from None
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
