"""Bring your own images: a folder of class folders (torchvision's ImageFolder layout), held as tensors.

Images are read as `model.classify` reads a PIL image (`zoo.models.classifier`): 8-bit and
16-bit pixels scaled to [0, 1], alpha dropped, gray or RGB; and resized, where `img_size`
asks, with the same antialiased bilinear filter. So a released model sees at inference what
it saw in training.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

from zoo.data.files import YourData, check_image_size
from zoo.models.classifier import PIL_16_BIT, _from_pil, to_unit_range

GRAY_MODES = ("1", "L", "LA", "F", *PIL_16_BIT)  # PIL modes with one channel (and perhaps alpha)

# an image's name for messages, and how to open it (a PIL image, read lazily)
Source = tuple[str, Callable]


def image_layout(images: dict[str, list[Source]], img_size, where: str) -> tuple[int, tuple[int, int]]:
    """(channels, (height, width)) from the images' headers: 1 if every image is gray, else 3; the
    images' one size, or `img_size`; a ValueError naming two images that differ when no size is given."""
    from PIL.Image import DecompressionBombError

    size = check_image_size(img_size)
    modes, sizes = set(), {}
    for name, open_image in (item for items in images.values() for item in items):
        try:
            with open_image() as image:
                modes.add(image.mode)
                sizes.setdefault(image.size, name)
        except (OSError, DecompressionBombError) as err:  # the second is PIL's refusal of a huge image
            raise ValueError(f"{name} is not an image PIL can read ({err})") from None
        if size is None and len(sizes) > 1:
            (w1, h1), (w2, h2) = list(sizes)[:2]
            raise ValueError(f"{where} holds images of different sizes: {sizes[(w1, h1)]} is {w1}x{h1} and "
                             f"{sizes[(w2, h2)]} is {w2}x{h2} (width x height); pass img_size (one integer, or "
                             "[height, width]) to resize them all to one size")
    if size is None:
        width, height = next(iter(sizes))
        size = (height, width)
    return (1 if modes <= set(GRAY_MODES) else 3), size


def read_images(sources: list[Source], chans: int, size: tuple[int, int]) -> torch.Tensor:
    """The images as one float tensor (N, chans, *size), as `model.preprocess` would read each."""
    out = torch.empty(len(sources), chans, *size)
    for i, (name, open_image) in enumerate(sources):
        try:
            with open_image() as image:
                x = to_unit_range(torch.from_numpy(_from_pil(image, chans)), pixels=True)
        except (OSError, ValueError) as err:
            raise ValueError(f"{name}: {err}") from None
        x = x if x.dim() == 3 else x[None]
        if tuple(x.shape[1:]) != size:
            x = F.interpolate(x[None], size=size, mode="bilinear", antialias=True, align_corners=False)[0]
        out[i] = x
    return out


def _is_image(path: str) -> bool:
    return not os.path.basename(path).startswith(".") and path.lower().endswith(IMG_EXTENSIONS)


class ImageFolder(YourData):
    """Images in class folders, `root/<class>/<image>` (torchvision's ImageFolder layout), held as tensors.

    The class names are the folder names, in sorted order; hidden files and folders are
    skipped; images are the files torchvision's ImageFolder reads (.png, .jpg, .bmp, .tif, ...).
    `train`, `val`, `test` name subfolders of `root` laid out the same way; without `val`
    (`test`), the validation (test) samples are held out from the training folder as the
    built-in sets do. Every image must have one size unless `img_size` is given; the
    channel count is 1 if every image is gray, else 3 (gray images repeated, alpha dropped).
    Everything is decoded once into memory: N x C x H x W float32 must fit.
    """

    def __init__(self, root: str = "data", batch_size: int = 64, img_size: int | list[int] | None = None,
                 train: str = "", val: str | None = None, test: str | None = None, test_fraction: float = 0.2,
                 mean: list[float] | None = None, std: list[float] | None = None, val_fraction: float = 0.1,
                 seed: int = 0, num_workers: int = 0):
        """Scans the folders and reads every image's header; the pixels are read at `data_info` or `setup`.

        Args:
            root: the data set's folder.
            batch_size: samples per batch.
            img_size: resize every image to this (an integer, or [height, width]); needed where sizes differ.
            train: the subfolder of root with the training class folders ("" for root itself).
            val: a subfolder with validation class folders; without it, val_fraction is held out.
            test: a subfolder with test class folders; without it, test_fraction is held out.
            test_fraction: the share of the training folder held out for testing (seed 0) where there is no test.
            mean: one per channel, with std; else both are measured on the training images.
            std: one per channel, with mean.
            val_fraction: the share of the training split held out for validation with `seed`.
            seed: the validation split's and the data order's seed.
            num_workers: data loader processes.
        """
        self.has_official_val, self.has_official_test = val is not None, test is not None
        self.dataset = f"the image folder {Path(root).expanduser().resolve().name}"
        super().__init__(root, batch_size, val_fraction, seed, num_workers, test_fraction, mean, std)
        self.train, self.val, self.test, self.img_size = train, val, test, img_size
        folders = {split: self.root / sub for split, sub in (("train", train), ("val", val), ("test", test))
                   if sub is not None}
        for split, folder in folders.items():
            if not folder.is_dir():
                raise (NotADirectoryError if folder.exists() else FileNotFoundError)(
                    f"the {split} folder {folder} {'is not a folder' if folder.exists() else 'does not exist'}; "
                    f"expected class folders of images, {folder}/<class>/<image>")
            if split != "train" and folders["train"].resolve() in folder.resolve().parents:
                raise ValueError(f"the {split} folder {folder} lies inside the training folder {folders['train']}, "
                                 f"where it would be read as a class; give the training images a folder of their "
                                 f"own and pass train=<that folder>")
        self.classes = self._classes(folders["train"])
        self.samples = {split: self._samples(split, folder) for split, folder in folders.items()}
        self.in_chans, self.size = image_layout(self._sources(), img_size, str(self.root))

    def _classes(self, folder: Path) -> list[str]:
        classes = sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
        if not classes:
            loose = any(_is_image(e.path) for e in os.scandir(folder) if e.is_file())
            raise ValueError(f"{folder} holds {'images but ' if loose else ''}no class folders; expected one folder "
                             f"of images per class, {folder}/<class>/<image> (e.g. {folder}/cat/001.png)")
        return classes

    def _samples(self, split: str, folder: Path) -> list[tuple[str, int]]:
        if split != "train":
            extra = sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith(".")
                           and e.name not in self.classes)
            if extra:
                raise ValueError(f"the {split} folder {folder} has classes the training folder has not: "
                                 f"{', '.join(extra)}; the training classes are {', '.join(self.classes)}")
        samples = make_dataset(str(folder), {c: i for i, c in enumerate(self.classes)}, is_valid_file=_is_image,
                               allow_empty=True)
        found = {label for _, label in samples}
        empty = [c for i, c in enumerate(self.classes) if i not in found]
        if split == "train" and empty:
            raise ValueError(f"{folder} has class folders without images: {', '.join(empty)}; expected files "
                             f"ending in {', '.join(IMG_EXTENSIONS)} in each")
        return samples

    def _sources(self) -> dict[str, list[Source]]:
        from PIL import Image

        return {split: [(path, lambda path=path: Image.open(path)) for path, _ in samples]
                for split, samples in self.samples.items()}

    def read(self):
        splits = {}
        for split, sources in self._sources().items():
            labels = torch.tensor([label for _, label in self.samples[split]], dtype=torch.long)
            splits[split] = read_images(sources, self.in_chans, self.size), labels
        return splits, self.classes

    def recorded_args(self):
        return {"img_size": self.img_size, "train": self.train, "val": self.val, "test": self.test,
                **super().recorded_args()}

