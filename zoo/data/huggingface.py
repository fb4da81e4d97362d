"""Bring your own images from a Hugging Face `datasets` data set: a folder saved with `save_to_disk`, or a Hub id.

Needs the optional `datasets` package (`pip install 'attention-zoo[hf]'`). Images are read
as `ImageFolder` reads them (`zoo.data.folders`), labels from a ClassLabel or integer column.
"""

from __future__ import annotations

import io
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from zoo.data.files import YourData, check_labels
from zoo.data.folders import image_layout, read_images

VAL_NAMES = ("validation", "valid", "val")  # the names data sets give their validation split


class HuggingFaceImages(YourData):
    """An image classification data set of the `datasets` library, held as tensors.

    path: a folder written by `Dataset.save_to_disk` or `DatasetDict.save_to_disk` (read with
    `load_from_disk`, offline), or else a Hub data set id, downloaded into `root/huggingface`
    (unless `download` is false). Its splits are "train", "validation" (or "valid", "val")
    and "test"; a missing validation or test split is held out as the built-in sets do, and
    a single saved `Dataset` is the training split. `image_column` must be an Image column;
    `label_column` a ClassLabel (its names become the label names) or integers 0..K-1.
    """

    def __init__(self, path: str = "data/my-dataset", root: str = "data", batch_size: int = 64,
                 image_column: str = "image", label_column: str = "label", img_size: int | list[int] | None = None,
                 test_fraction: float = 0.2, mean: list[float] | None = None, std: list[float] | None = None,
                 val_fraction: float = 0.1, seed: int = 0, num_workers: int = 0, download: bool = True):
        """Opens a local folder at once (memory-mapped) to check its splits and columns; a Hub data set is
        loaded at `data_info` or `setup`.

        Args:
            path: a folder written by save_to_disk, or a Hub data set id.
            root: where a Hub data set is cached (root/huggingface).
            batch_size: samples per batch.
            image_column: the Image column.
            label_column: the ClassLabel or integer column.
            img_size: resize every image to this (an integer, or [height, width]); needed where sizes differ.
            test_fraction: the share held out for testing (seed 0) where there is no test split.
            mean: one per channel, with std; else both are measured on the training images.
            std: one per channel, with mean.
            val_fraction: the share of the training split held out for validation with `seed`.
            seed: the validation split's and the data order's seed.
            num_workers: data loader processes.
            download: false to refuse, rather than download, what is not a local folder.
        """
        try:
            import datasets  # noqa: F401
        except ImportError:
            raise ImportError("HuggingFaceImages needs the `datasets` package: pip install 'attention-zoo[hf]'") \
                from None
        self.local = Path(path).expanduser()
        self.path, self.download = path, download
        self.image_column, self.label_column, self.img_size = image_column, label_column, img_size
        if self.local.is_dir():
            self.dataset, self.hub_dataset = f"the Hugging Face data set saved in {self.local.name}", None
        elif self.local.exists():
            raise NotADirectoryError(f"{self.local} is a file; path must be a folder written by save_to_disk, or a "
                                     "Hub data set id")
        else:
            from huggingface_hub.utils import HFValidationError, validate_repo_id

            try:
                validate_repo_id(path)
            except HFValidationError:
                raise FileNotFoundError(f"no folder at {self.local}, and {path!r} is not a Hub data set id either; "
                                        "set path to a folder written by save_to_disk, or to an id like "
                                        "'org/name'") from None
            self.dataset = self.hub_dataset = path
        super().__init__(root, batch_size, val_fraction, seed, num_workers, test_fraction, mean, std)
        if self.local.is_dir():  # cheap (memory-mapped): refuse a wrong folder or column now
            _ = self.splits

    @cached_property
    def splits(self) -> dict:
        """{"train": Dataset, optionally "val", "test"}, with the columns checked."""
        import datasets

        if self.local.is_dir():
            try:
                loaded = datasets.load_from_disk(str(self.local))
            except FileNotFoundError as err:
                raise FileNotFoundError(f"{self.local} is not a folder written by save_to_disk ({err})") from None
        elif not self.download:
            raise FileNotFoundError(f"{self.path} is not a local folder, and download=False; set path to a folder "
                                    "written by save_to_disk")
        else:
            try:
                loaded = datasets.load_dataset(self.path, cache_dir=str(self.root / "huggingface"))
            except Exception as err:  # offline, no such data set, a private one
                reason = (str(err).strip().splitlines() or [""])[0]
                raise FileNotFoundError(f"could not load {self.path!r} from the Hub ({type(err).__name__}: "
                                        f"{reason}); set path to a local folder written by save_to_disk") from None
        parts = {"train": loaded} if isinstance(loaded, datasets.Dataset) else dict(loaded)
        if "train" not in parts:
            raise ValueError(f"{self.path} has the splits {', '.join(parts)}; expected a 'train' split "
                             f"(and optionally {', '.join(map(repr, VAL_NAMES))} and 'test')")
        splits = {"train": parts["train"]}
        val = next((name for name in VAL_NAMES if name in parts), None)
        if val:
            splits["val"] = parts[val]
        if "test" in parts:
            splits["test"] = parts["test"]
        for split, part in splits.items():
            for column in (self.image_column, self.label_column):
                if column not in part.column_names:
                    raise ValueError(f"{self.path}: the {split} split has no column {column!r}; its columns are "
                                     f"{', '.join(part.column_names)} (set image_column and label_column)")
            if not isinstance(part.features[self.image_column], datasets.Image):
                raise ValueError(f"{self.path}: column {self.image_column!r} holds {part.features[self.image_column]}, "
                                 "not images (an Image feature); for arrays, use zoo.data.NumpyArrays")
        self.has_official_val, self.has_official_test = "val" in splits, "test" in splits
        return splits

    def _label_names(self) -> list[str]:
        import datasets

        feature = self.splits["train"].features[self.label_column]
        labels = {f"the {split} split's {self.label_column!r}": np.asarray(part[self.label_column])
                  for split, part in self.splits.items()}
        if isinstance(feature, datasets.ClassLabel):
            check_labels(labels, feature.num_classes, self.path)
            return list(feature.names)
        if not (isinstance(feature, datasets.Value) and feature.dtype.startswith(("int", "uint"))):
            raise ValueError(f"{self.path}: column {self.label_column!r} holds {feature}; expected a ClassLabel or "
                             f"integers 0..K-1 (dataset.class_encode_column({self.label_column!r}) makes one)")
        return [str(i) for i in range(check_labels(labels, None, self.path))]

    def read(self):
        import datasets
        from PIL import Image

        names = self._label_names()
        sources = {}
        for split, part in self.splits.items():
            raw = part.cast_column(self.image_column, datasets.Image(decode=False))[self.image_column]
            sources[split] = [(f"{self.path} {split} image {i}", lambda item=item: Image.open(
                io.BytesIO(item["bytes"]) if item["bytes"] else item["path"])) for i, item in enumerate(raw)]
        chans, size = image_layout(sources, self.img_size, self.path)
        splits = {}
        for split, part in self.splits.items():
            labels = torch.as_tensor(np.asarray(part[self.label_column]), dtype=torch.long)
            splits[split] = read_images(sources[split], chans, size), labels
        return splits, names

    def recorded_args(self):
        args = {"image_column": self.image_column, "label_column": self.label_column, "img_size": self.img_size,
                **super().recorded_args()}
        return args if self.local.is_dir() else {"path": self.path, **args}

    def describe(self):
        described = super().describe()
        return {**described, "file": self.local.name} if self.local.is_dir() else described
