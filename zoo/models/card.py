"""Model cards: the README.md of a release folder, written from what its config.json records.

Everything a card states comes from config.json (the constructor arguments, and for a
trained model the measured metrics and how it was trained), so a card can always be
written again from its folder and never says more than the folder holds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from torch import nn

from zoo.models.registry import checkpoint_roots

HUB_METRICS = {"acc": "accuracy", "acc_top5": "top_k_accuracy", "auroc": "roc_auc", "loss": "loss",
               "bpc": "bits_per_character", "bits_per_token": "bits_per_token", "perplexity": "perplexity"}
CHECK_COMMAND = "zoo check {name} --data-root ../shared/data"


def _article(word: str) -> str:
    return "an" if word[:1].upper() in "AEIOU" else "a"


def _family(config: dict) -> str:
    return "text" if "vocab_size" in config["args"] else "classifier"


def _header(config: dict, metrics: dict, data: dict) -> list[str]:
    attention = config["args"].get("attention", "softmax")
    names = attention if isinstance(attention, list) else [attention]  # a hybrid: one tag per mechanism
    tags = ["zoo", "pytorch", config["class"], *(f"{name}-attention" for name in dict.fromkeys(names))]
    if config.get("pretrained_cfg"):
        tags += ["timm", "image-classification"]
    lines = ["---", "library_name: zoo", "license: mit",
             f"pipeline_tag: {'text-generation' if _family(config) == 'text' else 'image-classification'}",
             "tags:", *[f"- {t}" for t in tags]]
    if data.get("hub_id"):
        lines += ["datasets:", f"- {data['hub_id']}"]
    if str(config.get("base_model") or "").startswith("hf-hub:"):  # the Hub links a fine-tune to its base
        lines += [f"base_model: {config['base_model'].removeprefix('hf-hub:').partition('@')[0]}"]
    names = sorted({HUB_METRICS.get(k.split("/")[-1], k.split("/")[-1]) for k in metrics})
    if names:
        lines += ["metrics:", *[f"- {n}" for n in names]]
    return [*lines, "---", ""]


TARGET = re.compile(r"^\s*(\S+)\s*(>=|<=)\s*([0-9.eE+-]+)\s*(?:\((.*)\))?\s*$")


def parse_target(target: str) -> tuple[str, str, float, str]:
    """ "test/acc >= 0.99 (MNIST baselines)" -> ("test/acc", ">=", 0.99, "MNIST baselines")."""
    match = TARGET.match(target)
    if not match:
        raise ValueError(f"export.target must read 'METRIC >= VALUE (source)' or 'METRIC <= VALUE', got {target!r}")
    metric, op, value, source = match.groups()
    return metric, op, float(value), source or ""


def _target(target: str, metrics: dict) -> str:
    metric, op, value, source = parse_target(target)
    got = metrics.get(metric)
    wanted = f"**Target**: {metric} {op} {value}" + (f" ({source})" if source else "")
    if got is None:
        return f"{wanted}: not measured."
    if _meets(got, op, value):
        return f"{wanted}: met ({got})."
    gap = abs(got - value)
    short = f"{gap * 100:.2f} points" if metric.endswith(("acc", "acc_top5", "auroc")) else f"{gap:.4g}"
    return f"{wanted}: **missed** by {short} ({got})."


def _meets(got: float, op: str, value: float) -> bool:
    return got >= value if op == ">=" else got <= value


def _selection(training: dict) -> str:
    monitor, _, mode = training.get("selected_by", "val/loss (min)").partition(" ")
    return f"{'lowest' if mode == '(min)' else 'highest'} {monitor} on the validation split"


def _usage(name: str, config: dict) -> str:
    if _family(config) == "text":
        # a prompt in the training text's own kind: Python source for the standard library's models
        data = ((config.get("training") or {}).get("data") or {}).get("init_args") or {}
        prompt = "def " if data.get("path") == "stdlib" else "ROMEO:"  # zoo.data's STDLIB, a floor above this one
        return f'import zoo\nmodel = zoo.load("{name}")\nprint(model.generate("{prompt}", max_new_tokens=200, seed=0))'
    shape = ", ".join(map(str, _input_shape(config)))
    return (f'import torch, zoo\nmodel = zoo.load("{name}")\n'
            f'x = torch.rand({shape})  # stands for your input: an image file, a PIL image, an array or a tensor\n'
            'print(model.classify(x))  # [(label, probability), ...], most probable first')


def _input_shape(config: dict) -> list[int]:
    """(channels, *size) of one input of the model's data: (C, L) signals, (C, H, W) images, (C, D, H, W) volumes."""
    args = config["args"]
    size = args.get("input_size") or [args.get("img_size")] * 2
    return [args.get("in_chans", 1), *(size if isinstance(size, list) else [size] * 2)]


def _limitations(config: dict, data: dict) -> list[str]:
    name = data.get("name") or "its training data"
    if _family(config) == "text":
        bpe = (config["args"].get("tokenizer") or {}).get("type") == "bpe"
        vocabulary = ("- Its byte-level BPE tokenizer encodes any text." if bpe else
                      "- Its vocabulary is the characters of the training text; a prompt with any other character "
                      "raises an error.")
        return [f"- A {'byte-level BPE' if bpe else 'character-level'} model trained for minutes on {name}: its text "
                "imitates the style and misspells freely; it knows nothing beyond that text and is meant for research "
                "on attention, not for use.", vocabulary, *([_one_run(config)] if config.get("leaderboard") else [])]
    shape = _input_shape(config)
    return [f"- Trained and evaluated only on {name}: it expects inputs shaped like that data "
            f"({' x '.join(map(str, shape))}); `model.preprocess` resizes and normalizes, but inputs from "
            "another distribution are out of scope.",
            _one_run(config)]


def _one_run(config: dict) -> str:
    board = config.get("leaderboard")
    if board and len(board["seeds"]) > 1:
        return (f"- These weights are one run of {len(board['seeds'])}: compare models by the seeds' mean and "
                "spread above, not by this run's metrics.")
    return ("- One training run with one seed: differences of a few tenths of a point between models are "
            "within run-to-run noise.")


def load_name(name: str, folder) -> str:
    """What `zoo.load` takes to find the release folder `name` written at `folder`: the bare name where it is a
    shipped checkpoint (a folder of a checkpoints root), else the path as it was written."""
    if folder is None:
        return name
    folder = Path(folder)
    if folder.resolve().parent in {root.resolve() for root in checkpoint_roots()}:
        return name
    return folder.as_posix()


def model_card(model: nn.Module, name: str, config: dict, folder=None) -> str:
    """The card of a release folder named `name` (written at `folder`) whose config.json is `config`."""
    source = load_name(name, folder)
    args = config["args"]
    metrics, training = config.get("metrics") or {}, config.get("training") or {}
    data = training.get("data") or {}
    params = sum(p.numel() for p in model.parameters())
    attention = args.get("attention", "softmax")
    if isinstance(attention, list):  # a hybrid
        attention = "per-block " + "/".join(map(str, attention))
    shape = f"{args.get('depth')} blocks of width {args.get('embed_dim')}, {args.get('num_heads')} heads"
    lines = _header(config, metrics, data)
    lines += [f"# {name}", "",
              f"`{config.get('model_name') or config['class']}`: {_article(config['class'])} {config['class']} with "
              f"{params:,} parameters "
              f"({attention} attention; {shape})" + (f", trained with zoo on {data['name']}." if data else "."), ""]
    if config.get("base_model"):
        kept = ("the tokenizer it carries is under Configuration below" if _family(config) == "text" else
                "its input normalization (mean, std) and label names are those of the data it was fine-tuned on "
                "(Configuration below)")
        lines += [f"Fine-tuned from `{config['base_model']}`: {kept}.", ""]
    if data:
        # a text without a file (the standard library's source) names where it was read, which differs by Python
        origin = f" ({data['source']})" if data.get("source") else ""
        lines += ["## Data", "", f"{data['name']}{origin}: {data['splits']}.", ""]
    lines += ["## Results", ""]
    if metrics:
        lines += ["| metric | value |", "|---|---|", *[f"| {k} | {v} |" for k, v in sorted(metrics.items())], "",
                  # a release rounded to a smaller dtype to fit the size limit is measured again on what it stores
                  (f"Measured in float32 on the weights as stored ({training['weights_dtype']}, rounded from the "
                   f"float32 ones of the run's best checkpoint by {_selection(training)}). "
                   if training.get("weights_dtype") else
                   f"Measured at export in float32, on the run's best checkpoint by {_selection(training)}. ") +
                  "To measure them again and compare with this card:", "",
                  f"```\n{CHECK_COMMAND.format(name=source)}\n```", ""]
        if training.get("target"):
            lines += [_target(training["target"], metrics), ""]
        if config.get("leaderboard"):
            lines += _leaderboard(config["leaderboard"], config.get("model_name") or name, training.get("target"))
    else:
        lines += ["No metrics were recorded with these weights: `zoo export CKPT DIR --config RECIPE` measures "
                  "them at export.", ""]
    if training.get("command"):
        lines += ["## Training", "", f"```\n{training['command']}\n```", ""]
        done = [f"{k.replace('_', ' ')} {training[k]}" for k in ("epochs", "steps", "precision") if training.get(k)]
        if training.get("seconds") is not None:
            threads = training.get("threads")
            lines += [f"Took {training['seconds'] / 60:.1f} minutes of wall-clock time on a "
                      f"{training.get('machine', '')} CPU with {threads} thread{'s' if threads != 1 else ''}"
                      + (f" ({', '.join(done)})" if done else "") + _resumed(training) + ".", ""]
        if training.get("precision_reason"):
            reason = training["precision_reason"].removeprefix("auto: ")
            lines += [f"`precision: auto` chose {training['precision']}: {reason}.", ""]
    lines += ["## Use", "", f"```python\n{_usage(source, config)}\n```", "",
              "## Limitations", "", *_limitations(config, data), "",
              "## Configuration", "", f"```json\n{json.dumps(args, indent=2)}\n```", ""]
    return "\n".join(lines)


def _resumed(training: dict) -> str:
    """What the training time covers for a run resumed from a checkpoint: zoo's exporter carries the time trained
    before the resume in the checkpoint; an older checkpoint, or an older export, counted the resumed part only."""
    step = training.get("resumed_at_step")
    step = step if isinstance(step, int) and not isinstance(step, bool) and step > 0 else None  # a hand-edited config
    if step and training.get("seconds_before_resume") is not None:
        return f", resumed from a checkpoint at step {step:,}, the time before it included"
    if step or "--ckpt_path" in str(training.get("command", "")).split():
        return (", counted from the resume" + (f" at step {step:,}" if step else "") +
                " only: the time before it was not recorded")
    return ""


def _leaderboard(board: dict, model: str, target: str | None = None) -> list[str]:
    """The card's account of the seeds: this checkpoint is one run of several, and how the others did."""
    values = ", ".join(f"{v:.4f}" for v in board["values"])
    spread = f" ± {board['std']:.4f} (sample standard deviation)" if board.get("std") is not None else ""
    return [f"These weights are the seed-0 run of the leaderboard's `{board['group']}` group. Over seeds "
            f"{', '.join(map(str, board['seeds']))} the same recipe gave {board['metric']} "
            f"{board['mean']:.4f}{spread}: {values}.{_seeds_against(board, target)} The table is in "
            f"`{board['results']}`; to train the seeds again:", "",
            f"```\n{board['command']} --only '{board['group']}/{model}/*'\n```", ""]


def _seeds_against(board: dict, target: str | None) -> str:
    """How many seeds met the card's target: seed 0 meeting it says nothing of the others."""
    if not target or not board.get("values"):  # no seeds to count: say nothing rather than "every seed"
        return ""
    metric, op, value, _ = parse_target(target)
    if metric != board["metric"]:
        return ""
    meets = [_meets(v, op, value) for v in board["values"]]
    if all(meets):
        return f" Every seed meets the target ({metric} {op} {value})."
    missed = [f"seed {s} ({v:.4f})" for s, v, ok in zip(board["seeds"], board["values"], meets) if not ok]
    named = missed[0] if len(missed) == 1 else f"{', '.join(missed[:-1])} and {missed[-1]}"
    return (f" {sum(meets)} of {len(meets)} seeds {'meets' if sum(meets) == 1 else 'meet'} the target "
            f"({metric} {op} {value}); {named} {'does' if len(missed) == 1 else 'do'} not, and the mean "
            f"{'meets' if _meets(board['mean'], op, value) else 'does not meet'} it.")


