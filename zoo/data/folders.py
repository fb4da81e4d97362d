"""Bring your own images: a folder of class folders (torchvision's ImageFolder layout), held as tensors.

Images are read as `model.classify` reads a PIL image (`zoo.models.classifier`): 8-bit and
16-bit pixels scaled to [0, 1], alpha dropped, gray or RGB; and resized, where `img_size`
asks, with the same antialiased bilinear filter. So a released model sees at inference what
it saw in training.

Folders are walked without following links out of a class folder: torchvision's walk follows every
link, so a loop (`cat/loop -> cat`) read the folder 40 times over, and a link to the root read every
other class's images again under this one's label.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torchvision.datasets.folder import IMG_EXTENSIONS

from zoo.data.files import MAX_IMAGE_SIZE, YourData, check_image_size
from zoo.models.classifier import PIL_16_BIT, _from_pil, to_unit_range

GRAY_MODES = ("1", "L", "LA", "F", *PIL_16_BIT)  # PIL modes with one channel (and perhaps alpha)
# the names, in any case, that mark a subfolder of the root as a split rather than a class
SPLIT_NAMES = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}
SPLIT_WORDS = {"train": "training", "val": "validation", "test": "test"}

log = logging.getLogger(__name__)

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
        if max(width, height) > MAX_IMAGE_SIZE:  # held as they are, they would have to fit in memory at this size
            raise ValueError(f"{where} holds images of {width}x{height} (width x height), more than the "
                             f"{MAX_IMAGE_SIZE} pixels a side zoo holds an image at; pass img_size (at most "
                             f"{MAX_IMAGE_SIZE}) to resize them")
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


def _inside(path: str, folder: str) -> bool:
    """Whether `path`, its links resolved, lies strictly inside `folder` (a resolved path)."""
    real = os.path.realpath(path)
    return real != folder and os.path.commonpath([real, folder]) == folder


def class_folders(folder: Path, skipped: list[str]) -> list[str]:
    """The names of `folder`'s class folders, sorted: its subfolders, less hidden ones and links. A link to a
    folder is another class's images under this name, the tree again (a loop), or images from outside it;
    it is added to `skipped`."""
    names = []
    for entry in os.scandir(folder):
        if entry.name.startswith("."):
            continue
        if entry.is_symlink():
            if entry.is_dir():
                skipped.append(entry.path)
        elif entry.is_dir():
            names.append(entry.name)
    return sorted(names)


def class_images(folder: str, skipped: list[str]) -> list[str]:
    """The images under one class folder, in torchvision's order (make_dataset: folders by path, then files by
    name), so that the splits of a folder without links are what they were. A link is followed only to a file
    inside the class folder: links to folders (a loop, the root, another class) and links to files elsewhere
    (another class's image, a file outside the tree) are added to `skipped`."""
    inside, walked = os.path.realpath(folder), []
    for root, dirs, files in os.walk(folder):  # links to folders are listed in dirs and never entered
        skipped += [os.path.join(root, d) for d in dirs if os.path.islink(os.path.join(root, d))]
        walked.append((root, files))
    images = []
    for root, files in sorted(walked):
        for name in sorted(files):
            path = os.path.join(root, name)
            if not _is_image(path):
                continue
            if os.path.islink(path) and not _inside(path, inside):
                skipped.append(path)
            else:
                images.append(path)
    return images


def _holds_folders_only(folder: str) -> bool:
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return False
    return (any(e.is_dir() and not e.name.startswith(".") for e in entries)
            and not any(e.is_file() and _is_image(e.path) for e in entries))


def split_folders(root: Path) -> dict[str, str]:
    """{split: subfolder} where `root` is laid out as root/train/<class>/..., root/test/<class>/...: every
    visible subfolder is named as a split (train; val, valid or validation; test; in any case) and holds
    folders and no images of its own. Else {}: root holds the class folders (a class may be called "test").
    A ValueError where the layout is a split one but names no training folder, or one split twice."""
    try:
        entries = [e for e in os.scandir(root) if not e.name.startswith(".") and e.is_dir()]
    except OSError:  # no such folder: refused by the caller, naming it
        return {}
    found: dict[str, list[str]] = {}
    for entry in entries:
        split = SPLIT_NAMES.get(entry.name.lower())
        if split is None or not _holds_folders_only(entry.path):
            return {}
        found.setdefault(split, []).append(entry.name)
    for split, names in found.items():
        if len(names) > 1:
            raise ValueError(f"{root} holds two {SPLIT_WORDS[split]} folders, {' and '.join(sorted(names))}; "
                             f"pass {split}=<the one to use> (and the other splits' folders)")
    if found and "train" not in found:
        raise ValueError(f"{root} holds split folders ({', '.join(sorted(n for [n] in found.values()))}) but no "
                         "training folder; pass train=<the folder of training class folders> (and val=, test=)")
    return {split: name for split, [name] in found.items()}


class ImageFolder(YourData):
    """Images in class folders, `root/<class>/<image>` (torchvision's ImageFolder layout), held as tensors.

    The class names are the folder names, in sorted order; hidden files and folders are
    skipped; images are the files torchvision's ImageFolder reads (.png, .jpg, .bmp, .tif, ...).
    `train`, `val`, `test` name subfolders of `root` laid out the same way; without `val`
    (`test`), the validation (test) samples are held out from the training folder as the
    built-in sets do. Where none of the three is given and every subfolder of `root` is named
    as a split (train; val, valid or validation; test; in any case) and holds folders rather
    than images, those are the splits (`root/train/cat/1.png`, `root/test/cat/2.png`), not
    classes named "train" and "test"; without a training folder among them, or with two
    folders for one split, it is refused. Links are followed only to files inside their own
    class folder: links to folders (a loop, the root, another class) and links to files
    elsewhere (another class's image, a file outside the tree) are skipped with a warning. Every
    image must have one size unless `img_size` is given (at most 4096, as is an image's own
    size); the channel count is 1 if every image is gray, else 3 (gray images repeated, alpha
    dropped). Everything is decoded once into memory: N x C x H x W float32 must fit.
    """

    def __init__(self, root: str = "data", batch_size: int = 64, img_size: int | list[int] | None = None,
                 train: str = "", val: str | None = None, test: str | None = None, test_fraction: float = 0.2,
                 mean: list[float] | None = None, std: list[float] | None = None, val_fraction: float = 0.1,
                 seed: int = 0, num_workers: int = 0):
        """Scans the folders and reads every image's header; the pixels are read at `data_info` or `setup`.

        Args:
            root: the data set's folder.
            batch_size: samples per batch.
            img_size: resize every image to this (an integer, or [height, width], at most 4096); needed where
                sizes differ.
            train: the subfolder of root with the training class folders ("" for root itself, or for the
                split folders root holds, when val and test are not given either).
            val: a subfolder with validation class folders; without it, val_fraction is held out.
            test: a subfolder with test class folders; without it, test_fraction is held out.
            test_fraction: the share of the training folder held out for testing (seed 0) where there is no test.
            mean: one per channel, with std; else both are measured on the training images.
            std: one per channel, with mean.
            val_fraction: the share of the training split held out for validation with `seed`.
            seed: the validation split's and the data order's seed.
            num_workers: data loader processes.
        """
        check_image_size(img_size, "ImageFolder")  # before the scan: a size that cannot be held is known now
        if train == "" and val is None and test is None:
            found = split_folders(Path(root).expanduser())
            if found:
                train, val, test = found["train"], found.get("val"), found.get("test")
                log.info("ImageFolder: %s holds split folders, read as train=%r, val=%r, test=%r", root, train,
                         val, test)
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
        self.skipped: list[str] = []  # links not followed, named in one warning
        self.classes = self._classes(folders["train"])
        self.samples = {split: self._samples(split, folder) for split, folder in folders.items()}
        self._warn_skipped()
        self.in_chans, self.size = image_layout(self._sources(), img_size, str(self.root))

    def _warn_skipped(self) -> None:
        if self.skipped:
            shown = [os.path.relpath(path, self.root) for path in self.skipped]
            log.warning("ImageFolder skipped %d symbolic link%s under %s that lead%s out of a class folder or back "
                        "into the tree (a link is followed only to a file inside its own class folder): %s%s",
                        len(shown), "s" if len(shown) > 1 else "", self.root, "" if len(shown) > 1 else "s",
                        ", ".join(shown[:10]), ", ..." if len(shown) > 10 else "")

    def _skipped_note(self) -> str:
        n = len(self.skipped)
        return (f" ({n} symbolic link{'s' if n > 1 else ''} skipped: zoo follows a link only to a file inside its "
                "own class folder)" if n else "")

    def _classes(self, folder: Path) -> list[str]:
        classes = class_folders(folder, self.skipped)
        if not classes:
            loose = any(_is_image(e.path) for e in os.scandir(folder) if e.is_file())
            raise ValueError(f"{folder} holds {'images but ' if loose else ''}no class folders; expected one folder "
                             f"of images per class, {folder}/<class>/<image> (e.g. {folder}/cat/001.png)"
                             + self._skipped_note())
        return classes

    def _samples(self, split: str, folder: Path) -> list[tuple[str, int]]:
        present = set(self.classes) if split == "train" else set(class_folders(folder, self.skipped))
        if split != "train":
            extra = sorted(present - set(self.classes))
            if extra:
                raise ValueError(f"the {split} folder {folder} has classes the training folder has not: "
                                 f"{', '.join(extra)}; the training classes are {', '.join(self.classes)}")
        samples = [(path, label) for label, name in enumerate(self.classes) if name in present
                   for path in class_images(os.path.join(folder, name), self.skipped)]
        found = {label for _, label in samples}
        empty = [c for i, c in enumerate(self.classes) if i not in found]
        if split == "train" and empty:
            raise ValueError(f"{folder} has class folders without images: {', '.join(empty)}; expected files "
                             f"ending in {', '.join(IMG_EXTENSIONS)} in each" + self._skipped_note())
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

