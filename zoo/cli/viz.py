"""`zoo viz SOURCE --out DIR`: every picture that applies to a model, as PNG files and the numbers behind
each as .npz, for samples of its own data or an input file.

DIR gets the pictures of the model itself (filters, positions, its learned mask) and one
folder per input, sample-0, sample-1, ..., with the pictures of its attention. The folder
is built beside DIR and moved there whole (zoo/utils/atomic.py), and only an absent or empty
folder, or one this command wrote (with --overwrite), is ever replaced.
"""

from __future__ import annotations

import json
import math
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from zoo.release import check
from zoo.utils.atomic import marked_folder, replace_folder

MARKER = "viz.json"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def is_viz_folder(path) -> bool:
    return marked_folder(path, MARKER, "zoo-viz")


MAX_ARRAY_ELEMENTS = 100_000_000  # a .npy input's budget, checked on its header before its data is read
FILE_SUFFIXES = (".txt", ".npy", *IMAGE_SUFFIXES)


def read_input(model: nn.Module, given: str) -> torch.Tensor:
    """--input as one input the model takes: an image file or a .npy array (through model.preprocess), or,
    for a text model, a prompt. --input names a file when it ends in .txt, .npy or an image suffix, or when
    such a file exists; a missing file is an error, never read as a prompt. Anything else is the prompt itself."""
    path = Path(given)
    is_file = path.suffix.lower() in FILE_SUFFIXES or _is_file(path)
    if is_file and not _is_file(path):
        takes = ("a prompt, a .txt file holding one or a .npy array of token ids" if hasattr(model, "vocab_size")
                 else f"an image file or a .npy array of shape {tuple(model.input_shape)}")
        raise FileNotFoundError(f"--input {given}: no such file; {type(model).__name__} takes {takes}")
    if hasattr(model, "vocab_size"):
        return _token_ids(model, given, path if is_file else None)
    if path.suffix.lower() == ".npy":
        return model.preprocess(read_npy(path))
    if path.suffix.lower() in IMAGE_SUFFIXES:
        return model.preprocess(read_image(path))
    raise ValueError(f"--input {given}: expected an image ({', '.join(IMAGE_SUFFIXES)}) or a .npy array")


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a prompt too long to be a file name
        return False


def _token_ids(model: nn.Module, given: str, path: Path | None) -> torch.Tensor:
    """A text model's prompt as token ids (1, length), at most pictures' MAX_TOKENS of them."""
    from zoo.viz import MAX_TOKENS

    if path is not None and path.suffix.lower() == ".npy":
        ids = read_npy(path)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError(f"--input {given}: a text model takes token ids as a 1-D integer array, "
                             f"got shape {ids.shape} of {ids.dtype}")
        ids = ids.tolist()
    else:
        if path is not None and path.suffix.lower() != ".txt":
            raise ValueError(f"--input {given}: {type(model).__name__} is a text model; it takes a prompt, a .txt "
                             "file or a .npy array of token ids")
        text = given
        if path is not None:
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"--input {given} is not UTF-8 text: byte {e.start:,} is "
                                 f"{e.object[e.start:e.start + 1]!r} ({e.reason})") from None
        if model.tokenizer is None:
            raise ValueError("this text model has no tokenizer: give token ids as a .npy array")
        ids = model.tokenizer.encode(text)
    if not ids:
        raise ValueError(f"--input {given!r} is an empty prompt; give the text whose attention to draw")
    if len(ids) > MAX_TOKENS:  # the pictures hold (layers, heads, L, L) maps: L is bounded
        print(f"zoo viz: the prompt has {len(ids):,} tokens; the pictures use its first {MAX_TOKENS:,}",
              file=sys.stderr)
        ids = ids[:MAX_TOKENS]
    return torch.as_tensor([ids])


def read_npy(path: Path) -> np.ndarray:
    """A numeric .npy array, its header checked (magic, dtype, size against the file and MAX_ARRAY_ELEMENTS)
    before its data is read; never unpickled."""
    from zoo.data.files import npy_header

    with open(path, "rb") as f:
        shape, dtype = npy_header(f, os.fstat(f.fileno()).st_size, path, MAX_ARRAY_ELEMENTS)
        if dtype.hasobject:
            raise ValueError(f"{path} holds Python objects (dtype {dtype}); zoo reads numeric arrays only, never "
                             "pickled data: save the numbers with np.save(path, array.astype(np.float32))")
        if math.prod(shape) == 0:
            raise ValueError(f"{path} holds an empty array of shape {shape}")
        f.seek(0)
        return np.load(f, allow_pickle=False)


def read_image(path: Path):
    """The decoded image at `path`, refused in one line when it cannot be read: not an image, truncated, damaged,
    empty, or larger than PIL's guard against decompression bombs."""
    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)  # the warning's size is already too big
            with Image.open(path) as image:
                image.load()
                if 0 in image.size:
                    raise ValueError(f"{path} is an empty image ({image.width} x {image.height} pixels)")
                return image.copy()  # closing the file discards the decoded pixels of `image` itself
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ValueError(f"{path} is too large to read as an image: {e}") from None
    except (OSError, SyntaxError, ValueError, EOFError) as e:  # PIL's words for a damaged or foreign file
        if "empty image" in str(e):
            raise
        raise ValueError(f"{path} is not a readable image: {e}") from None


def _save(figure, numbers: dict, folder: Path, name: str) -> None:
    figure.savefig(folder / f"{name}.png", dpi=110, bbox_inches="tight")
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
    parser.add_argument("--input", help="an image or .npy array file; for a text model, the prompt itself, or a "
                                        ".txt file holding it (or a .npy of token ids). A value ending in .txt, "
                                        ".npy or an image suffix, or naming an existing file, is read as a file, "
                                        "and a missing one is an error. Prompts longer than "
                                        "zoo.viz.MAX_TOKENS (1,024) tokens are cut to their first 1,024: the "
                                        "pictures hold a map of tokens x tokens per layer and head. Default: "
                                        "samples of the model's own test data")
    parser.add_argument("--samples", type=int, default=4, help="how many samples of its data (default 4)")
    parser.add_argument("--data-root", default=os.environ.get("ZOO_DATA", "data"),
                        help="the folder that holds the data sets (default: $ZOO_DATA, else ./data)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if an earlier zoo viz wrote it")
    args = parser.parse_args(argv)
    if args.samples < 1:
        raise ValueError(f"--samples must be at least 1, got {args.samples}")

    from zoo.models.pretrained import load
    from zoo.models.registry import checkpoint_folder
    from zoo.models.release_files import CONFIG
    from zoo.utils.atomic import check_replaceable

    check_replaceable(args.out, is_viz_folder, "viz folder", args.overwrite)
    model = load(args.source)
    if args.input is not None:
        inputs = read_input(model, args.input)
    else:
        if args.source.startswith("hf-hub:"):
            from zoo.models.hub import download

            folder = download(args.source)
        else:
            folder = Path(args.source) if Path(args.source).is_dir() else checkpoint_folder(args.source)
        config = json.loads((folder / CONFIG).read_text())
        try:
            inputs = check.data_samples(config, args.data_root, args.samples)
        except FileNotFoundError as error:
            raise FileNotFoundError(f"{error}; or give an input with --input") from None
    path = write_pictures(model, inputs, args.out, args.source, args.overwrite)
    print(f"wrote {path}")
