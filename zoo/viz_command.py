"""`zoo viz SOURCE --out DIR`: every picture that applies to a model, as PNG files and the numbers behind
each as .npz, for samples of its own data or an input file.

DIR gets the pictures of the model itself (filters, positions, its learned mask) and one
folder per input, sample-0, sample-1, ..., with the pictures of its attention. The folder
is built beside DIR and moved there whole (zoo/atomic.py), and only an absent or empty
folder, or one this command wrote (with --overwrite), is ever replaced.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from zoo.atomic import marked_folder, replace_folder

MARKER = "viz.json"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def is_viz_folder(path) -> bool:
    return marked_folder(path, MARKER, "zoo-viz")


def read_input(model: nn.Module, given: str) -> torch.Tensor:
    """--input as one input the model takes: an image file or a .npy array (through model.preprocess), or,
    for a text model, a prompt (the text itself, or a .txt file holding it)."""
    path = Path(given)
    if hasattr(model, "vocab_size"):
        text = path.read_text(encoding="utf-8") if path.suffix == ".txt" and path.is_file() else given
        if model.tokenizer is None:
            raise ValueError("this text model has no tokenizer: give token ids as a .npy array")
        return torch.as_tensor([model.tokenizer.encode(text)])
    if not path.is_file():
        raise FileNotFoundError(f"--input {given}: no such file; {type(model).__name__} takes an image file or a "
                                f".npy array of shape {tuple(model.input_shape)}")
    if path.suffix == ".npy":
        return model.preprocess(np.load(path, allow_pickle=False))
    if path.suffix.lower() in IMAGE_SUFFIXES:
        from PIL import Image

        with Image.open(path) as image:
            return model.preprocess(image)
    raise ValueError(f"--input {given}: expected an image ({', '.join(IMAGE_SUFFIXES)}) or a .npy array")


def data_samples(config: dict, data_root, count: int) -> torch.Tensor:
    """The first `count` inputs of the data the release was evaluated on (test split, prepared as in training),
    from `data_root` as it is: nothing is downloaded."""
    from zoo.training.check import datamodule_for

    datamodule = datamodule_for(config, data_root)
    if hasattr(datamodule, "download"):  # pictures read data that is there; they never fetch it
        datamodule.download = False
    datamodule.setup("test")
    x = next(iter(datamodule.test_dataloader()))[0]
    return x[:count]


def _save(figure, numbers: dict, folder: Path, name: str) -> None:
    import matplotlib.pyplot as plt

    figure.savefig(folder / f"{name}.png", dpi=110, bbox_inches="tight")
    plt.close(figure)
    np.savez_compressed(folder / f"{name}.npz", **numbers)


def write_pictures(model: nn.Module, inputs: torch.Tensor | None, out, source: str, overwrite: bool = False) -> Path:
    from tqdm import tqdm

    from zoo.viz import pictures

    def fill(staging: Path) -> None:
        written = {"model": sorted(_write(pictures(model), staging))}
        for i, x in enumerate(tqdm([] if inputs is None else inputs, desc="pictures", unit="input")):
            folder = staging / f"sample-{i}"
            folder.mkdir()
            written[folder.name] = sorted(_write(pictures(model, x[None], include_model=False), folder))
        (staging / MARKER).write_text(json.dumps({"format": "zoo-viz", "source": source, "pictures": written},
                                                 indent=2) + "\n")

    return replace_folder(out, fill, is_viz_folder, "viz folder", overwrite)


def _write(drawn: dict, folder: Path) -> list[str]:
    for name, (figure, numbers) in drawn.items():
        _save(figure, numbers, folder, name)
    return list(drawn)


def viz_command(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="zoo viz", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="a name[.tag], a release folder or hf-hub:org/repo")
    parser.add_argument("--out", required=True, help="the folder to write (absent, empty, or an earlier zoo viz)")
    parser.add_argument("--input", help="an image or .npy array (a prompt, or a .txt file, for a text model); "
                                        "default: samples of the model's own test data")
    parser.add_argument("--samples", type=int, default=4, help="how many samples of its data (default 4)")
    parser.add_argument("--data-root", default=os.environ.get("ZOO_DATA", "data"),
                        help="the folder that holds the data sets (default: $ZOO_DATA, else ./data)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if an earlier zoo viz wrote it")
    args = parser.parse_args(argv)
    if args.samples < 1:
        raise ValueError(f"--samples must be at least 1, got {args.samples}")

    import zoo
    from zoo.atomic import check_replaceable
    from zoo.release import CONFIG, checkpoint_folder

    check_replaceable(args.out, is_viz_folder, "viz folder", args.overwrite)
    model = zoo.load(args.source)
    if args.input:
        inputs = read_input(model, args.input)
    else:
        if args.source.startswith("hf-hub:"):
            from zoo.hub import download

            folder = download(args.source)
        else:
            folder = Path(args.source) if Path(args.source).is_dir() else checkpoint_folder(args.source)
        config = json.loads((folder / CONFIG).read_text())
        try:
            inputs = data_samples(config, args.data_root, args.samples)
        except FileNotFoundError as error:
            raise FileNotFoundError(f"{error}; or give an input with --input") from None
    path = write_pictures(model, inputs, args.out, args.source, args.overwrite)
    print(f"wrote {path}")
