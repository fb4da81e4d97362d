"""Classification data held in memory as tensors: the shared split logic and the array-backed sets."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset, random_split

from zoo.data.sampling import EpochSampler, RandomShift


class ArrayClassificationData(L.LightningDataModule):
    """Holds out `val_fraction` of the training split with a fixed seed; tests on the official test split.

    Subclasses implement `load(split)` -> (inputs float tensor, labels long tensor) for
    split "train" or "test" (and "val" where the set ships one), and set `info`.

    Inputs are normalized with `info`'s mean and std when `setup` loads them; training batches come in an
    order drawn from (seed, epoch), so a run is repeatable.

    Args:
        root: the folder the data set's files are read from (and downloaded to, where the set downloads);
            "~" is expanded. Default "data".
        batch_size: the samples per batch of every loader, an int >= 1 (default 64).
        val_fraction: the share of the training split held out for validation, strictly between 0 and 1
            (default 0.1); not used by a set with an official validation split.
        seed: the seed of the validation hold-out, the training order and the augmentation, an int >= 0
            (default 0).
        num_workers: the DataLoader worker processes, an int >= 0 (default 0: load in the main process).
    """

    info: dict  # num_classes, in_chans, input_size, mean, std, label_names
    has_official_val = False
    dataset = ""  # the data set's usual name, for model cards
    hub_dataset: str | None = None  # its Hugging Face Hub id, for the model card's metadata
    test_split = "official test split"

    def __init__(self, root: str = "data", batch_size: int = 64, val_fraction: float = 0.1, seed: int = 0,
                 num_workers: int = 0):
        super().__init__()
        if not self.has_official_val:
            check_fraction("val_fraction", val_fraction, "the share of the training split held out for validation")
        self.root = Path(root).expanduser()
        self.batch_size, self.val_fraction, self.seed, self.num_workers = batch_size, val_fraction, seed, num_workers
        self.train_set = self.val_set = self.test_set = None

    @property
    def data_info(self) -> dict:
        return dict(self.info)

    def load(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def describe(self) -> dict:
        """The data set and its splits in the words of a model card (after `setup`)."""
        val = ("the official validation split" if self.has_official_val
               else f"held out from the training split with seed {self.seed}")
        args = {"batch_size": self.batch_size, "val_fraction": self.val_fraction, "seed": self.seed}
        for extra in ("size", "shift", "flip"):
            if hasattr(self, extra):
                args[extra] = getattr(self, extra)
        return {"name": self.dataset, "hub_id": self.hub_dataset,
                "class_path": f"{type(self).__module__}.{type(self).__qualname__}", "init_args": args,
                "splits": f"{len(self.train_set):,} training, {len(self.val_set):,} validation ({val}), "
                          f"{len(self.test_set):,} test ({self.test_split})"}

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        mean = torch.tensor(self.info["mean"]).view(-1, *[1] * (x.dim() - 2))
        std = torch.tensor(self.info["std"]).view(-1, *[1] * (x.dim() - 2))
        return (x - mean) / std

    def train_transform(self, dataset: Dataset) -> Dataset:
        return dataset

    def setup(self, stage: str | None = None):
        if self.train_set is not None:
            return
        x, y = self.load("train")
        if self.has_official_val:
            self.train_set = TensorDataset(self.normalize(x), y)
            self.val_set = TensorDataset(*self._normalized(self.load("val")))
        else:
            full = TensorDataset(self.normalize(x), y)
            n_val = max(1, int(round(len(full) * self.val_fraction)))
            if n_val >= len(full):
                raise ValueError(f"{self.dataset or type(self).__name__}: holding out val_fraction="
                                 f"{self.val_fraction} of {len(full):,} training samples leaves "
                                 f"{max(len(full) - n_val, 0):,} to train on; lower val_fraction or use more data")
            generator = torch.Generator().manual_seed(self.seed)
            self.train_set, self.val_set = random_split(full, [len(full) - n_val, n_val], generator=generator)
        self.test_set = TensorDataset(*self._normalized(self.load("test")))
        sizes = {"training": len(self.train_set), "validation": len(self.val_set), "test": len(self.test_set)}
        if not all(sizes.values()):  # a run on an empty split trains or scores nothing, silently
            raise ValueError(f"{self.dataset or type(self).__name__} under {self.root} gave empty splits: "
                             + ", ".join(f"{n:,} {split}" for split, n in sizes.items()))

    def _normalized(self, xy):
        return self.normalize(xy[0]), xy[1]

    def _loader(self, dataset, shuffle=False):
        sampler = EpochSampler(dataset, self.seed) if shuffle else None
        return DataLoader(dataset, batch_size=self.batch_size, sampler=sampler, num_workers=self.num_workers,
                          persistent_workers=self.num_workers > 0)

    def train_dataloader(self):
        return self._loader(self.train_transform(self.train_set), shuffle=True)

    def val_dataloader(self):
        return self._loader(self.val_set)

    def test_dataloader(self):
        return self._loader(self.test_set)

    def predict_dataloader(self):
        return self._loader(self.test_set)


def check_fraction(name: str, value, meaning: str) -> None:
    """A fraction strictly between 0 and 1 (both ends leave a split empty), else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"{name} must be a number strictly between 0 and 1 ({meaning}), got {value!r}")


def require_file(path: Path, what: str, how: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found at {path}; {how}")
    return path


class Digits(ArrayClassificationData):
    """scikit-learn's 8x8 digits (1797 images, ships with scikit-learn: needs no download).

    It has no official test split, so a fixed 20% (seed 0, stratified by nothing) is the test set.
    Images (1, 8, 8) with pixels in [0, 1] (the set's 0..16 divided by 16), 10 classes.

    Args:
        root: unused (the set ships with scikit-learn); kept for the common signature. Default "data".
        batch_size: the samples per batch of every loader, an int >= 1 (default 64).
        val_fraction: the share of the remaining 80% held out for validation, strictly between 0 and 1
            (default 0.1).
        seed: the seed of the validation hold-out and the training order, an int >= 0 (default 0); the
            test 20% is fixed whatever the seed.
        num_workers: the DataLoader worker processes, an int >= 0 (default 0: load in the main process).
    """

    dataset = "scikit-learn digits"
    test_split = "a fixed 20% of the set, seed 0"
    info = {"num_classes": 10, "in_chans": 1, "input_size": [8, 8], "mean": [0.3], "std": [0.38],
            "label_names": [str(i) for i in range(10)]}

    def load(self, split):
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0
        y = torch.tensor(digits.target, dtype=torch.long)
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
        n_test = len(y) // 5
        part = order[:n_test] if split == "test" else order[n_test:]
        return x[part], y[part]


class MNIST1D(ArrayClassificationData):
    """MNIST-1D (Greydanus 2020): 4000 + 1000 signals of length 40, in `root/mnist1d/mnist1d.npz`.

    Without the file, it is generated with the `mnist1d` package's default arguments
    (`pip install mnist1d`), which reproduce the published data set. Signals (1, 40), 10 classes.

    Args:
        root: the folder holding `mnist1d/mnist1d.npz` (arrays x, y, x_test, y_test); "~" is expanded.
            Default "data".
        batch_size: the samples per batch of every loader, an int >= 1 (default 64).
        shift: augment training signals with random translations of up to this many samples (zero padded),
            an int >= 0 (default 0: none).
        **kwargs (Any): ArrayClassificationData's `val_fraction`, `seed` and `num_workers`.
    """

    dataset = "MNIST-1D"
    info = {"num_classes": 10, "in_chans": 1, "input_size": [40], "mean": [0.0], "std": [1.0],
            "label_names": [str(i) for i in range(10)]}

    def __init__(self, root: str = "data", batch_size: int = 64, shift: int = 0, **kwargs):
        super().__init__(root, batch_size, **kwargs)
        self.shift = shift

    def train_transform(self, dataset):
        return RandomShift(dataset, self.shift, seed=self.seed) if self.shift else dataset

    def _arrays(self):
        path = self.root / "mnist1d" / "mnist1d.npz"
        if path.is_file():
            return dict(np.load(path))
        try:
            from mnist1d.data import get_dataset_args, make_dataset
        except ImportError:
            raise FileNotFoundError(f"MNIST-1D not found at {path}, and the `mnist1d` package that generates it "
                                    "is not installed: `pip install mnist1d`, or point root at a folder that "
                                    "holds mnist1d/mnist1d.npz") from None
        data = make_dataset(get_dataset_args())
        return {"x": data["x"], "y": data["y"], "x_test": data["x_test"], "y_test": data["y_test"]}

    def load(self, split):
        arrays = self._arrays()
        x, y = (arrays["x_test"], arrays["y_test"]) if split == "test" else (arrays["x"], arrays["y"])
        return torch.tensor(x, dtype=torch.float32)[:, None], torch.tensor(y, dtype=torch.long)


class AdrenalMNIST3D(ArrayClassificationData):
    """AdrenalMNIST3D (MedMNIST v2): CT volumes at 28^3 or 64^3, 2 classes, with its official splits.

    Reads MedMNIST's own npz layout, `root/MedMNIST3D/adrenalmnist3d.npz` (or `_64`).
    Volumes (1, size, size, size) with voxels in [0, 1], classes "normal" and "hyperplasia".

    Args:
        root: the folder holding `MedMNIST3D/adrenalmnist3d.npz` (or `adrenalmnist3d_64.npz` at size 64);
            "~" is expanded. Default "data".
        batch_size: the samples per batch of every loader, an int >= 1 (default 32).
        size: the volumes' side in voxels, 28 (default) or 64.
        shift: augment training volumes with random translations of up to this many voxels along every axis
            (zero padded), an int >= 0 (default 0: none).
        flip: augment training volumes with random mirror images along the last axis (default False).
        **kwargs (Any): ArrayClassificationData's `seed` and `num_workers` (the official validation split is used,
            so `val_fraction` is not).
    """

    has_official_val = True
    hub_dataset = "albertvillanova/medmnist-v2"

    def __init__(self, root: str = "data", batch_size: int = 32, size: int = 28, shift: int = 0, flip: bool = False,
                 **kwargs):
        super().__init__(root, batch_size, **kwargs)
        if size not in (28, 64):
            raise ValueError(f"AdrenalMNIST3D comes at size 28 or 64, got {size}")
        self.size, self.shift, self.flip = size, shift, flip
        self.dataset = f"AdrenalMNIST3D at {size}^3 (MedMNIST v2)"
        self.info = {"num_classes": 2, "in_chans": 1, "input_size": [size] * 3, "mean": [0.5], "std": [0.5],
                     "label_names": ["normal", "hyperplasia"]}

    def train_transform(self, dataset):
        return RandomShift(dataset, self.shift, self.flip, seed=self.seed) if self.shift or self.flip else dataset

    def load(self, split):
        name = "adrenalmnist3d.npz" if self.size == 28 else "adrenalmnist3d_64.npz"
        path = require_file(self.root / "MedMNIST3D" / name, "AdrenalMNIST3D",
                            "download it from MedMNIST (the `medmnist` package or zenodo record 10519652) "
                            "into <root>/MedMNIST3D/")
        with np.load(path) as data:
            x = torch.tensor(data[f"{split}_images"], dtype=torch.float32)[:, None] / 255.0
            y = torch.tensor(data[f"{split}_labels"], dtype=torch.long).view(-1)
        return x, y
