"""Bring your own arrays: a `.npz` file or a folder of `.npy` files, and the rules all your-data modules share.

Every module here (and `ImageFolder`, `HuggingFaceImages`) splits like the built-in sets: a
test split the data ships is used as it is, else a fixed `test_fraction` is held out with
seed 0 (so runs of every seed are scored on the same samples); a validation split the data
ships is used as it is, else `val_fraction` of the rest is held out with `seed`. Inputs are
read as `model.preprocess` reads them at inference (`zoo.models.classifier.to_unit_range`),
and normalized by the mean and std given, or else measured on the training split before
the validation samples are held out (as MNIST's usual constants are).
"""

from __future__ import annotations

import math
import os
import zipfile
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from zoo.data.arrays import ArrayClassificationData, check_fraction
from zoo.models.classifier import to_unit_range
from zoo.utils.checks import integer

SPATIAL_DIMS = {"signal": 1, "image": 2, "volume": 3}
# the largest side an image is held at: 4096 x 4096 RGB is 200 MB of float32 an image, and every image of a set
# is held in memory at once; a larger img_size would only fail (or exhaust memory) when the pixels are read
MAX_IMAGE_SIZE = 4096


def npy_header(file, size: int, where, max_elements: int | None = None) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype an open .npy stream of `size` bytes declares, read before any of its data, and
    refused in one line when it is not a .npy header, declares more than `max_elements` values, or more data
    than the stream holds (a header can claim petabytes in a few bytes). Object arrays are left to the
    caller, or to np.load(allow_pickle=False), to refuse."""
    try:
        version = np.lib.format.read_magic(file)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read_header is None:
            raise ValueError(f"format version {version[0]}.{version[1]}, zoo reads versions 1.0 and 2.0")
        shape, _, dtype = read_header(file)
    except (ValueError, EOFError) as e:
        raise ValueError(f"{where} is not a readable .npy file: {str(e).splitlines()[0]}") from None
    if not dtype.hasobject:
        count = math.prod(shape)
        if max_elements is not None and count > max_elements:
            raise ValueError(f"{where} declares an array of shape {shape} ({count:,} values), more than the "
                             f"{max_elements:,} zoo reads as one input")
        need = file.tell() + count * dtype.itemsize
        if size < need:
            raise ValueError(f"{where} is truncated: its header declares {need:,} bytes, the file holds {size:,}")
    return shape, dtype


class YourData(ArrayClassificationData):
    """All of a source read once into tensors. Subclasses set `dataset`, `has_official_val` (before
    calling this `__init__`), `has_official_test`, and implement `read()` -> (splits, label_names) with
    splits {"train": (x, y), optionally "val" and "test"}: x float (N, C, *size), y long."""

    has_official_test = False

    def __init__(self, root, batch_size: int, val_fraction: float, seed: int, num_workers: int,
                 test_fraction: float, mean: list[float] | None, std: list[float] | None):
        super().__init__(root, batch_size, val_fraction=val_fraction, seed=seed, num_workers=num_workers)
        if not self.has_official_test:
            check_fraction("test_fraction", test_fraction, "the share of the data held out for testing, seed 0")
        if (mean is None) != (std is None):
            raise ValueError(f"give both mean and std, or neither (to measure them); got mean={mean!r}, std={std!r}")
        self.test_fraction, self.mean, self.std = test_fraction, mean, std

    def read(self) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], list[str]]:
        raise NotImplementedError

    @cached_property
    def _data(self):
        splits, label_names = self.read()
        if "test" not in splits:
            x, y = splits["train"]
            n_test = max(1, round(len(y) * self.test_fraction))
            if n_test >= len(y):
                raise ValueError(f"{self.dataset}: holding out test_fraction={self.test_fraction} of "
                                 f"{len(y):,} samples leaves {len(y) - n_test:,} to train on; lower test_fraction "
                                 "or use more data")
            order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
            splits["train"] = x[order[n_test:]], y[order[n_test:]]
            splits["test"] = x[order[:n_test]], y[order[:n_test]]
        return splits, label_names

    @cached_property
    def info(self) -> dict:
        splits, label_names = self._data
        x = splits["train"][0]
        chans = x.shape[1]
        if self.mean is None:
            # one channel at a time in float64: exact sums, and one channel's copy in memory, not the set's
            stats = [torch.std_mean(x[:, c].double(), dim=None, correction=0) for c in range(chans)]
            mean, std = [float(m) for _, m in stats], [float(s) for s, _ in stats]
            for c, (m, s) in enumerate(zip(mean, std)):
                if s == 0:  # dividing by it would make every input inf or NaN
                    raise ValueError(f"{self.dataset}: channel {c} of the training inputs is constant ({m:.6g}), "
                                     "so its std is 0; pass mean and std to normalize by")
            mean, std = [round(m, 6) for m in mean], [round(s, 6) for s in std]
        else:
            mean, std = check_stats(self.mean, self.std, chans)
        return {"num_classes": len(label_names), "in_chans": chans, "input_size": list(x.shape[2:]),
                "mean": mean, "std": std, "label_names": list(label_names)}

    def load(self, split):
        return self._data[0][split]

    def recorded_args(self) -> dict:
        """The arguments, beyond the shared ones, that rebuild this module (`zoo check`)."""
        return {"test_fraction": self.test_fraction, "mean": self.mean, "std": self.std}

    def describe(self) -> dict:
        info = self.info
        val = ("the data's own validation split" if self.has_official_val
               else f"held out from the training split with seed {self.seed}")
        test = ("the data's own test split" if self.has_official_test
                else f"a fixed {self.test_fraction:.0%} of the data, seed 0")
        stats = ("the mean and std given" if self.mean is not None
                 else f"mean {info['mean']} and std {info['std']} measured on the training split (validation "
                      "samples included, test samples not)")
        args = {"batch_size": self.batch_size, "val_fraction": self.val_fraction, "seed": self.seed,
                **self.recorded_args()}
        return {"name": self.dataset, "hub_id": self.hub_dataset,
                "class_path": f"{type(self).__module__}.{type(self).__qualname__}", "init_args": args,
                "splits": f"{len(self.train_set):,} training, {len(self.val_set):,} validation ({val}), "
                          f"{len(self.test_set):,} test ({test}); {info['in_chans']} x "
                          f"{' x '.join(map(str, info['input_size']))} inputs, {info['num_classes']} classes, "
                          f"normalized by {stats}"}


def check_stats(mean, std, chans: int) -> tuple[list[float], list[float]]:
    """Given mean and std: one finite number per channel, std > 0."""
    for name, values in (("mean", mean), ("std", std)):
        if (not isinstance(values, (list, tuple)) or len(values) != chans
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                           for v in values)):
            raise ValueError(f"{name} must be a list of {chans} finite numbers (one per channel), got {values!r}")
    if not all(s > 0 for s in std):
        raise ValueError(f"std must be > 0 for every channel, got {list(std)}")
    return [float(m) for m in mean], [float(s) for s in std]


def check_image_size(img_size, owner: str = "the data") -> tuple[int, int] | None:
    """None, an int (square) or [height, width], each in [1, MAX_IMAGE_SIZE]; `owner` names who checks."""
    if img_size is None:
        return None
    sizes = [img_size] * 2 if not isinstance(img_size, (list, tuple)) else list(img_size)
    if len(sizes) != 2:
        raise ValueError(f"img_size must be one integer or [height, width], got {img_size!r}")
    return tuple(integer(s, "img_size", owner, maximum=MAX_IMAGE_SIZE) for s in sizes)


def check_labels(labels: dict[str, np.ndarray], num_classes: int | None, source: str) -> int:
    """Integer labels 0..K-1 in every split, each class present in training unless `num_classes` is given;
    returns K."""
    for name, y in labels.items():
        if y.dtype.kind not in "iu":
            hint = " (convert whole numbers with y.astype(int))" if y.dtype.kind == "f" else ""
            raise ValueError(f"{source}: {name} must hold integer class labels 0..K-1, got dtype {y.dtype}{hint}")
        if y.size and y.min() < 0:
            raise ValueError(f"{source}: {name} holds the label {y.min()}; class labels run 0..K-1")
    train = next(iter(labels.values()))
    if num_classes is not None:
        k = integer(num_classes, "num_classes", source, minimum=2)
    else:
        k = int(train.max()) + 1 if train.size else 0
        present = set(np.unique(train).tolist())
        # the first few gaps lie below len(present) + 10, however large the largest label
        missing = [i for i in range(min(k, len(present) + 10)) if i not in present]
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
            raise ValueError(f"{source}: the training labels run up to {k - 1} but never use {shown}; labels must "
                             f"be 0..K-1 with every class present (renumber them), or pass num_classes={k} if "
                             "some classes have no training samples")
    for name, y in labels.items():
        if y.size and y.max() >= k:
            raise ValueError(f"{source}: {name} holds the label {y.max()}, but there are {k} classes (0..{k - 1}); "
                             "pass num_classes to say how many there are")
    if k < 2:
        raise ValueError(f"{source}: the labels name {k} class{'es' if k != 1 else ''}; classification needs 2 or more")
    return k


class NumpyArrays(YourData):
    """Arrays from a `.npz` file, or from a folder of `.npy` files named like its keys (`x.npy`, `y.npy`, ...).

    Accepted keys: `x` and `y`, or `x_train` and `y_train`; optionally `x_val` and `y_val` (a
    validation split), `x_test` and `y_test` (a test split); other keys are ignored. Inputs
    are channels first: signals (N, C, L) or (N, L), images (N, C, H, W) or (N, H, W), volumes
    (N, C, D, H, W) or (N, D, H, W); `kind` ("signal", "image" or "volume") says which where the
    rank leaves it open (3 or 4 dimensions). Values are read as `model.classify` reads them:
    uint8 / 255, uint16 / 65535, floating point as it is (images in [0, 1]). Labels are
    integers 0..K-1, shape (N,) or (N, 1). Files are read with `allow_pickle=False`.
    """

    def __init__(self, path: str = "data/arrays.npz", batch_size: int = 64, kind: str | None = None,
                 num_classes: int | None = None, label_names: list[str] | None = None, test_fraction: float = 0.2,
                 mean: list[float] | None = None, std: list[float] | None = None, val_fraction: float = 0.1,
                 seed: int = 0, num_workers: int = 0):
        """Finds the keys; the arrays are read and checked at `data_info` or `setup`.

        Args:
            path: the .npz file, or the folder of .npy files.
            batch_size: samples per batch.
            kind: "signal", "image" or "volume"; needed where the rank leaves it open.
            num_classes: the number of classes, where the training labels do not use every class.
            label_names: one name per class (else "0", "1", ...).
            test_fraction: the share held out for testing (seed 0) where there is no x_test.
            mean: one per channel, with std; else both are measured on the training inputs.
            std: one per channel, with mean.
            val_fraction: the share of the training split held out for validation with `seed`.
            seed: the validation split's and the data order's seed.
            num_workers: data loader processes.
        """
        self.path = Path(path).expanduser()
        if kind is not None and kind not in SPATIAL_DIMS:
            raise ValueError(f"kind must be one of {', '.join(SPATIAL_DIMS)} or None, got {kind!r}")
        self.kind, self.num_classes, self.label_names = kind, num_classes, label_names
        self.keys = self._split_keys()
        self.has_official_val, self.has_official_test = "val" in self.keys, "test" in self.keys
        self.dataset = f"the arrays in {self.path.name}"
        super().__init__(self.path.parent, batch_size, val_fraction, seed, num_workers, test_fraction, mean, std)

    def _available(self) -> list[str]:
        if self.path.is_dir():
            return sorted(p.stem for p in self.path.glob("*.npy"))
        if self.path.is_file():
            if self.path.suffix == ".npy":
                raise ValueError(f"{self.path} is one .npy array; put x.npy and y.npy in a folder and pass the "
                                 "folder, or save them together with np.savez(path, x=..., y=...)")
            try:
                with np.load(self.path, allow_pickle=False) as arrays:
                    return sorted(arrays.files)
            except (ValueError, OSError) as err:
                raise ValueError(f"{self.path} is not a .npz file numpy can read ({err})") from None
        raise FileNotFoundError(f"no .npz file or folder of .npy files at {self.path}; set data.init_args.path")

    def _split_keys(self) -> dict[str, tuple[str, str]]:
        have = self._available()
        expected = ("expected x and y, or x_train and y_train (optionally also x_val and y_val, "
                    "x_test and y_test)")
        held = f"{self.path} holds {', '.join(have) or 'no arrays'}"
        train = [pair for pair in (("x", "y"), ("x_train", "y_train")) if pair[0] in have or pair[1] in have]
        if len(train) != 1:
            raise ValueError(f"{held}; {expected}" + (", not both pairs" if train else ""))
        keys = {"train": train[0]}
        for split in ("val", "test"):
            pair = (f"x_{split}", f"y_{split}")
            if pair[0] in have or pair[1] in have:
                keys[split] = pair
        for x_key, y_key in keys.values():
            if x_key not in have or y_key not in have:
                raise ValueError(f"{held}: {x_key} and {y_key} go together, one is missing; {expected}")
        return keys

    def _array(self, key: str) -> np.ndarray:
        if self.path.is_dir():
            with open(self.path / f"{key}.npy", "rb") as f:
                return self._checked_load(f, os.fstat(f.fileno()).st_size, self.path / f"{key}.npy", key)
        with zipfile.ZipFile(self.path) as archive, archive.open(f"{key}.npy") as f:
            return self._checked_load(f, archive.getinfo(f"{key}.npy").file_size, f"{self.path}: {key}", key)

    def _checked_load(self, file, size: int, where, key: str) -> np.ndarray:
        npy_header(file, size, where)  # before numpy allocates what the header declares
        file.seek(0)
        try:
            return np.load(file, allow_pickle=False)
        except ValueError as err:  # object arrays: reading them would unpickle
            raise ValueError(f"{self.path}: {key} could not be read without unpickling ({err}); "
                             "save plain numeric arrays") from None

    def read(self):
        arrays = {split: (self._array(x_key), self._array(y_key)) for split, (x_key, y_key) in self.keys.items()}
        x_train = arrays["train"][0]
        kind = self.kind or {2: "signal", 5: "volume"}.get(x_train.ndim)
        if kind is None:
            raise ValueError(f"{self.path}: {self.keys['train'][0]} has shape {x_train.shape}, which could be "
                             + ("(N, C, L) signals or (N, H, W) images" if x_train.ndim == 3 else
                                "(N, C, H, W) images or (N, D, H, W) volumes" if x_train.ndim == 4 else
                                "nothing zoo reads")
                             + "; pass kind: signal, image or volume")
        spatial = SPATIAL_DIMS[kind]
        labels = {}
        for split, (x, y) in arrays.items():
            x_key, y_key = self.keys[split]
            if x.ndim not in (spatial + 1, spatial + 2):
                dims = {"signal": "L", "image": "H, W", "volume": "D, H, W"}[kind]
                raise ValueError(f"{self.path}: {x_key} has shape {x.shape}; {kind}s are (N, C, {dims}) "
                                 f"or (N, {dims})")
            if y.ndim == 2 and y.shape[1] == 1:
                y = y[:, 0]
            if y.ndim != 1:
                raise ValueError(f"{self.path}: {y_key} has shape {y.shape}; labels are one integer per sample, (N,)")
            if len(x) != len(y):
                raise ValueError(f"{self.path}: {x_key} has {len(x):,} samples but {y_key} has {len(y):,} labels; "
                                 "they must match one to one")
            labels[y_key] = y
        k = check_labels(labels, self.num_classes, str(self.path))
        names = self.label_names if self.label_names is not None else [str(i) for i in range(k)]
        if not isinstance(names, (list, tuple)) or len(names) != k or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{self.path}: label_names must be {k} strings, one per class, got {names!r}")
        splits = {}
        for split, (x, _) in arrays.items():
            x_key, y_key = self.keys[split]
            if x.dtype.kind not in "biuf":
                raise ValueError(f"{self.path}: {x_key} has dtype {x.dtype}; expected numbers")
            try:
                inputs = to_unit_range(torch.from_numpy(np.ascontiguousarray(x)), pixels=kind == "image")
            except ValueError as err:
                raise ValueError(f"{self.path}: {x_key}: {err}") from None
            if inputs.dim() == spatial + 1:
                inputs = inputs[:, None]
            if inputs.shape[1:] != splits.get("train", (inputs,))[0].shape[1:]:
                raise ValueError(f"{self.path}: {x_key} has samples of shape {tuple(inputs.shape[1:])}, the "
                                 f"training inputs {tuple(splits['train'][0].shape[1:])}; every split must match")
            splits[split] = inputs, torch.from_numpy(labels[y_key].astype(np.int64))
        return splits, names

    def recorded_args(self):
        return {"kind": self.kind, "num_classes": self.num_classes, "label_names": self.label_names,
                **super().recorded_args()}

    def describe(self):
        return {**super().describe(), "file": self.path.name}
