"""`zoo report --out DIR`: one static HTML page of every shipped checkpoint, the benchmarks and the pictures.

DIR/index.html needs no server, no network and no script: every image is a PNG inside the
page (a data: URI). It holds
- every shipped checkpoint with its card's metrics, training command and time, and a plot of
  accuracy against parameters;
- the tables of bench/results/*.json (those found under --bench), and plots of them: attention
  layer time against sequence length (log-log, per mechanism), decoding ms per token against
  context, training images per second against timm's ViT, deployment speedups, accuracy against test
  length for each capability task (bench/capabilities.py), and loss by token position for the long-context
  releases (bench/long_context.py);
- zoo.viz's pictures of each checkpoint: the model's own, and those of one input (a prompt for
  text models; the first test input of its data where --data-root holds it).
The folder is built beside DIR and moved there whole (zoo/utils/atomic.py).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path

import torch

from zoo.utils.atomic import marked_folder, replace_folder

MARKER = "report.json"
PROMPT = "ROMEO:\nWhat light through yonder window"


def is_report_folder(path) -> bool:
    return marked_folder(path, MARKER, "zoo-report", ("index.html", MARKER))


def _png(figure) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _img(figure, alt: str) -> str:
    caption = html.escape(alt)
    return f'<figure><img src="{_png(figure)}" alt="{caption}"><figcaption>{caption}</figcaption></figure>'


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, dict)):
        return html.escape(json.dumps(value)[:120])
    return html.escape(str(value))


def _table(rows: list[dict], columns: list[str] | None = None) -> str:
    columns = columns or list(dict.fromkeys(k for row in rows for k in row))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(row.get(c, ''))}</td>" for c in columns) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _checkpoints() -> list[tuple[str, Path, dict]]:
    from zoo.models.release_files import CONFIG
    from zoo.release.check import shipped_folders

    return [(folder.name, folder, json.loads((folder / CONFIG).read_text())) for folder in shipped_folders()]


def _checkpoint_section(checkpoints) -> str:
    from zoo.viz import figures

    rows, accuracy = [], {}
    for name, folder, config in checkpoints:
        training = config.get("training") or {}
        params = _parameter_count(folder)
        metrics = config.get("metrics") or {}
        shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if k.startswith(("test/", "val/")))
        rows.append({"checkpoint": name, "parameters": f"{params:,}", "data": (training.get("data") or {}).get("name"),
                     "metrics": shown, "training command": training.get("command"),
                     "seconds": training.get("seconds")})
        if "test/acc" in metrics:
            accuracy[name] = (params, 100 * metrics["test/acc"])
    plot = _img(figures.scatter_figure(accuracy, "parameters", "test accuracy (%)", "accuracy against parameters, "
                                       "shipped checkpoints"), "accuracy against parameters")
    return f'<section id="checkpoints"><h2>Checkpoints</h2>{_table(rows)}{plot}</section>'


def _parameter_count(folder: Path) -> int:
    """The stored parameters, read from the safetensors header (no tensor is loaded)."""
    from safetensors import safe_open

    with safe_open(folder / "model.safetensors", framework="pt") as f:
        return sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())


def _bench_plots(name: str, data: dict) -> list[str]:
    """The plots drawn for each benchmark file, from its rows."""
    from zoo.viz import figures

    plots = []
    if name == "attention" and data.get("train"):
        for dtype in sorted({r["dtype"] for r in data["train"]}):
            series = {}
            for row in data["train"]:
                if row["dtype"] == dtype and "ms" in row:
                    x, y = series.setdefault(row["mechanism"], ([], []))
                    x.append(row["length"]), y.append(row["ms"])
            plots.append(_img(figures.lines_figure(series, "sequence length", "ms (forward + backward)",
                                                   f"attention layer time, {dtype}"), f"layer time {dtype}"))
    decode_rows = data.get("decode") or []
    if decode_rows:
        series = {}
        for row in decode_rows:
            label = row.get("mechanism") or row.get("model")
            # bench/decode.py times today's cache against the old one (new_ms, old_ms); the others one cost
            costs = {label: row["ms_per_token"]} if "new_ms" not in row else \
                {f"{label} (preallocated cache)": row["new_ms"], f"{label} (torch.cat cache)": row.get("old_ms")}
            costs = {k: v for k, v in costs.items() if v is not None}  # constant-state models have no old cache
            for name_, ms in costs.items():
                x, y = series.setdefault(name_, ([], []))
                x.append(row.get("length") or row.get("context")), y.append(ms)
        plots.append(_img(figures.lines_figure(series, "context (tokens)", "ms per token",
                                               f"decoding cost against context ({name}.json)"), f"decode {name}"))
    if name == "models" and data.get("image"):
        rows = [r for r in data["image"] if r.get("mode") == "train"]
        groups = [f"{r['model']} {r['precision']}" for r in rows]
        plots.append(_img(figures.bars_figure(groups, {"zoo": [r["ours_img_per_s"] for r in rows],
                                                       "timm ViT": [r["timm_img_per_s"] for r in rows]},
                                              "images per second", "training throughput against timm"),
                          "training images per second"))
    if name == "deploy" and data.get("inference"):
        rows = [r for r in data["inference"] if r["batch"] == 1]
        plots.append(_img(figures.bars_figure([r["model"] for r in rows],
                                              {"torch.compile": [r["compiled_x"] for r in rows],
                                               "ONNX Runtime": [r["ort_x"] for r in rows]},
                                              "x eager", "batch-1 inference against eager"), "deployment speedups"))
    if name == "leaderboard" and data.get("cells"):
        for group in dict.fromkeys(c["group"] for c in data["cells"]):
            cells = [c for c in data["cells"] if c["group"] == group]
            points = {f"{c['model']} ({len(c['seeds'])} seed{'s' * (len(c['seeds']) != 1)})":
                      (c["train_minutes_mean"], c["mean"]) for c in cells if c.get("train_minutes_mean")}
            plots.append(_img(figures.scatter_figure(points, "training minutes (mean over seeds)",
                                                     f"{cells[0]['metric']} (mean over seeds)",
                                                     f"leaderboard: {group}"), f"leaderboard {group}"))
    if name == "capabilities" and isinstance(data.get("runs"), dict):
        runs = list(data["runs"].values())
        for task in dict.fromkeys(r["task"] for r in runs if not r.get("loss_by_position")):
            by_model = {}  # model -> length -> accuracies over seeds
            for r in runs:
                if r["task"] == task:
                    for key, value in r["metrics"].items():
                        if key.startswith("test/accuracy@"):
                            length = int(key.rsplit("@", 1)[1])
                            by_model.setdefault(r["model"], {}).setdefault(length, []).append(100 * value)
            series = {model: (sorted(at), [sum(at[n]) / len(at[n]) for n in sorted(at)])
                      for model, at in by_model.items()}
            if any(len(x) > 1 for x, _ in series.values()):  # tested beyond the training length
                plots.append(_img(figures.lines_figure(series, "test length (tokens)", "accuracy (%), mean over seeds",
                                                       f"capabilities: {task} against test length", log=False),
                                  f"capabilities {task}"))
        grid = {}  # Zoology's Figure 2: (model, width, length) -> pairs -> accuracies at the training length
        for r in runs:
            args = r.get("data", {}).get("init_args", {})
            if r.get("data", {}).get("name") == "MQAR" and "size" in r:
                length = args["sequence_length"]
                accuracy = r["metrics"].get(f"test/accuracy@{length}")
                if accuracy is not None:
                    line = (r["model"].split(":w")[0], r["size"]["embed_dim"], length)
                    grid.setdefault(line, {}).setdefault(args["num_pairs"], []).append(100 * accuracy)
        series = {f"{model}, width {width}" + (f", length {length}" if length != 64 else ""):
                  (sorted(at), [sum(at[n]) / len(at[n]) for n in sorted(at)])
                  for (model, width, length), at in grid.items() if len(at) > 1}
        if series:
            plots.append(_img(figures.lines_figure(series, "key-value pairs", "accuracy (%), mean over seeds",
                                                   "MQAR against width and pairs (Zoology's Figure 2)", log=False),
                              "capabilities MQAR grid"))
    if name == "long_context" and isinstance(data.get("runs"), dict):
        series = {}
        for release, r in data["runs"].items():
            longest = max(r["by_length"], key=int)
            spans = [(k, v) for k, v in r["by_length"][longest]["loss"].items()
                     if int(k.split("-")[0]) >= r["context"] // 2 or k.startswith("0-")]
            series[release] = ([math.sqrt(max(1, int(k.split("-")[0])) * int(k.split("-")[1])) for k, _ in spans],
                               [v for _, v in spans])
        plots.append(_img(figures.lines_figure(series, "token position (geometric middle of its range)",
                                               "loss (nats per character)", "War and Peace: loss by position, "
                                               "within and beyond the training context"), "long context"))
    if name == "outliers" and data.get("cells"):
        labels = [f"{c['group']}/{c['model']}" for c in data["cells"]]
        plots.append(_img(figures.bars_figure(labels, {"kurtosis": [c["kurtosis"]["mean"] for c in data["cells"]]},
                                              "Pearson kurtosis (Gaussian: 3)", "activation kurtosis, mean over "
                                              "layers and seeds"), "outlier kurtosis"))
    return plots


def _bench_results(file: Path) -> dict:
    """One benchmark's results: a JSON object of named lists of rows, refused in one line naming the file."""
    expected = "expected a JSON object as a bench/*.py script writes it"
    try:
        data = json.loads(file.read_bytes())
    except UnicodeDecodeError:
        raise ValueError(f"{file} is not UTF-8 text; {expected}") from None
    except json.JSONDecodeError as e:
        where = f"{e.msg} at line {e.lineno}, column {e.colno}"
        raise ValueError(f"{file} is not valid JSON ({where}); {expected}") from None
    except (ValueError, RecursionError) as e:  # integers of too many digits, nesting too deep for json
        raise ValueError(f"{file} is not JSON zoo reads ({type(e).__name__}); {expected}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file} holds a JSON {type(data).__name__}; {expected}")
    return data


def _bench_section(bench: Path) -> str:
    files = sorted(bench.glob("*.json")) if bench.is_dir() else []
    if not files:
        return (f'<section id="benchmarks"><h2>Benchmarks</h2><p>No benchmark results under '
                f'{html.escape(str(bench))}: run python bench/*.py first, or pass --bench.</p></section>')
    parts = ['<section id="benchmarks"><h2>Benchmarks</h2>']
    for file in files:
        data = _bench_results(file)
        parts.append(f"<h3>{html.escape(file.stem)}</h3><p>machine: {_cell(data.get('machine', {}))}</p>")
        try:
            parts += _bench_plots(file.stem, data)
        except (KeyError, TypeError, ValueError, AttributeError) as e:  # rows of another shape than bench/ writes
            detail = f"a row lacks the field {e}" if isinstance(e, KeyError) else f"{type(e).__name__}: {e}"
            raise ValueError(f"{file} does not hold the results of bench/{file.stem}.py ({detail}); "
                             "expected the JSON a bench/*.py script writes, or move the file out of --bench") from None
        for key, rows in data.items():
            if isinstance(rows, list) and rows and all(isinstance(r, dict) for r in rows):
                parts.append(f"<h4>{html.escape(key)}</h4>{_table(rows)}")
    return "".join(parts) + "</section>"


def _sample(model, config: dict, data_root) -> torch.Tensor | None:
    if hasattr(model, "vocab_size"):
        return torch.as_tensor([model.tokenizer.encode(PROMPT)]) if model.tokenizer else None
    if data_root is None:
        return None
    from zoo.release.check import data_samples

    try:
        return data_samples(config, data_root, 1)
    except (FileNotFoundError, ValueError):
        return None


def _pictures_section(checkpoints, data_root) -> str:
    from tqdm import tqdm

    from zoo.models.pretrained import load
    from zoo.viz import pictures

    parts = ['<section id="pictures"><h2>Pictures</h2>']
    for name, folder, config in tqdm(checkpoints, desc="pictures", unit="checkpoint"):
        model = load(folder)
        x = _sample(model, config, data_root)
        drawn = pictures(model, x)
        note = "" if x is not None else " (no input: its data was not found under --data-root)"
        parts.append(f'<h3 id="{html.escape(name)}">{html.escape(name)}{html.escape(note)}</h3><div class="grid">')
        parts += [_img(figure, f"{name}: {key}") for key, (figure, _) in drawn.items()]
        parts.append("</div>")
    return "".join(parts) + "</section>"


STYLE = """body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;font-size:12px;
margin:1em 0}td,th{border:1px solid #ccc;padding:2px 6px}figure{display:inline-block;margin:6px}
figcaption{font-size:11px;color:#555}img{max-width:640px}.grid{display:flex;flex-wrap:wrap}"""


def build_report(out, bench="bench/results", data_root=None, overwrite: bool = False) -> Path:
    checkpoints = _checkpoints()
    body = (f"<h1>zoo report</h1><p>{len(checkpoints)} shipped checkpoints: "
            + ", ".join(f'<a href="#{html.escape(n)}">{html.escape(n)}</a>' for n, _, _ in checkpoints) + "</p>"
            + _checkpoint_section(checkpoints) + _bench_section(Path(bench))
            + _pictures_section(checkpoints, data_root))
    page = (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>zoo report</title>'
            f"<style>{STYLE}</style></head><body>{body}</body></html>\n")

    def fill(staging: Path) -> None:
        (staging / "index.html").write_text(page, encoding="utf-8")
        names = [n for n, _, _ in checkpoints]
        (staging / MARKER).write_text(json.dumps({"format": "zoo-report", "checkpoints": names}, indent=2) + "\n")

    return replace_folder(out, fill, is_report_folder, "report folder", overwrite)


