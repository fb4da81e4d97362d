"""torchvision's MNIST, Fashion-MNIST and CIFAR-10, held as tensors (no PIL per sample)."""

from __future__ import annotations

import torch

from zoo.data.arrays import ArrayClassificationData
from zoo.data.sampling import RandomShift


class _Torchvision(ArrayClassificationData):
    dataset_name: str

    default_shift, default_flip = 2, False  # the set's usual augmentation, where the recipe says nothing

    def __init__(self, root: str = "data", batch_size: int = 128, download: bool = True, augment: bool = True,
                 shift: int | None = None, flip: bool | None = None, **kwargs):
        super().__init__(root, batch_size, **kwargs)
        shift = self.default_shift if shift is None else shift
        flip = self.default_flip if flip is None else flip
        if isinstance(shift, bool) or not isinstance(shift, int) or shift < 0:
            raise ValueError(f"shift must be a whole number of pixels >= 0, got {shift!r}")
        self.download, self.augment, self.shift, self.flip = download, augment, shift, bool(flip)

    def train_transform(self, dataset):
        """Random translations by up to `shift` pixels and, with `flip`, left-right mirror images."""
        if not self.augment or (self.shift == 0 and not self.flip):
            return dataset
        return RandomShift(dataset, self.shift, flip=self.flip, seed=self.seed)

    def _dataset(self, train: bool):
        import torchvision

        cls = getattr(torchvision.datasets, self.dataset_name)
        try:  # without download, torchvision creates nothing under the root
            return cls(str(self.root), train=train, download=False)
        except RuntimeError:
            if not self.download:
                raise FileNotFoundError(f"{self.dataset_name} not found under {self.root} and download=False; set "
                                        f"data.root to the folder that holds {self.dataset_name}/, or "
                                        "data.download=true to fetch it with torchvision") from None
        try:
            return cls(str(self.root), train=train, download=True)
        except Exception as err:  # offline, or the mirror is down
            reason = (str(err).strip().splitlines() or [""])[0]  # torchvision lists every mirror it tried
            raise FileNotFoundError(f"{self.dataset_name} is not under {self.root} and could not be downloaded "
                                    f"({type(err).__name__}: {reason}); set data.root to a folder that holds "
                                    f"{self.dataset_name}/") from None

    def load(self, split):
        ds = self._dataset(train=split == "train")
        x = torch.as_tensor(ds.data)
        x = x.permute(0, 3, 1, 2) if x.dim() == 4 else x[:, None]  # CIFAR is stored (N, H, W, C)
        return x.float() / 255.0, torch.as_tensor(ds.targets, dtype=torch.long)


class MNIST(_Torchvision):
    """MNIST: 60,000 training and 10,000 test handwritten digits, images (1, 28, 28) with pixels in [0, 1].

    Read (and downloaded) with torchvision and held in memory as tensors; validation is held out from the
    training split with `seed`.

    Args:
        root: the folder holding torchvision's `MNIST/` folder, where it is downloaded if missing and
            `download` is True; "~" is expanded. Default "data".
        batch_size: the samples per batch of every loader, an int >= 1 (default 128).
        download: fetch the set with torchvision when it is not under root (default True); False refuses
            with a FileNotFoundError instead.
        augment: apply the training augmentation (`shift`, `flip`) to training batches (default True).
        shift: random translations of training images by up to this many pixels (zero padded), an int >= 0;
            default None: 2.
        flip: random left-right mirror images of training images; default None: False.
        **kwargs (Any): ArrayClassificationData's `val_fraction`, `seed` and `num_workers`.
    """

    dataset_name = dataset = "MNIST"
    hub_dataset = "ylecun/mnist"
    info = {"num_classes": 10, "in_chans": 1, "input_size": [28, 28], "mean": [0.1307], "std": [0.3081],
            "label_names": [str(i) for i in range(10)]}


class FashionMNIST(MNIST):
    """Fashion-MNIST: 60,000 training and 10,000 test images of clothing, (1, 28, 28) in [0, 1], 10 classes.

    Read (and downloaded) with torchvision and held in memory as tensors; validation is held out from the
    training split with `seed`.

    Args:
        root: the folder holding torchvision's `FashionMNIST/` folder, where it is downloaded if missing and
            `download` is True; "~" is expanded. Default "data".
        batch_size: the samples per batch of every loader, an int >= 1 (default 128).
        download: fetch the set with torchvision when it is not under root (default True); False refuses
            with a FileNotFoundError instead.
        augment: apply the training augmentation (`shift`, `flip`) to training batches (default True).
        shift: random translations of training images by up to this many pixels (zero padded), an int >= 0;
            default None: 2.
        flip: random left-right mirror images of training images; default None: False.
        **kwargs (Any): ArrayClassificationData's `val_fraction`, `seed` and `num_workers`.
    """

    dataset_name, dataset = "FashionMNIST", "Fashion-MNIST"
    hub_dataset = "zalando-datasets/fashion_mnist"
    info = {"num_classes": 10, "in_chans": 1, "input_size": [28, 28], "mean": [0.2860], "std": [0.3530],
            "label_names": ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                            "Bag", "Ankle boot"]}


class CIFAR10(_Torchvision):
    """CIFAR-10: 50,000 training and 10,000 test color images, (3, 32, 32) with pixels in [0, 1], 10 classes.

    Read (and downloaded) with torchvision and held in memory as tensors; validation is held out from the
    training split with `seed`.

    Args:
        root: the folder holding torchvision's `cifar-10-batches-py/` folder, where it is downloaded if missing and
            `download` is True; "~" is expanded. Default "data".
        batch_size: the samples per batch of every loader, an int >= 1 (default 128).
        download: fetch the set with torchvision when it is not under root (default True); False refuses
            with a FileNotFoundError instead.
        augment: apply the training augmentation (`shift`, `flip`) to training batches (default True).
        shift: random translations of training images by up to this many pixels (zero padded), an int >= 0;
            default None: 4.
        flip: random left-right mirror images of training images; default None: True.
        **kwargs (Any): ArrayClassificationData's `val_fraction`, `seed` and `num_workers`.
    """

    dataset_name, dataset = "CIFAR10", "CIFAR-10"
    default_shift, default_flip = 4, True
    hub_dataset = "uoft-cs/cifar10"
    info = {"num_classes": 10, "in_chans": 3, "input_size": [32, 32], "mean": [0.4914, 0.4822, 0.4465],
            "std": [0.2470, 0.2435, 0.2616],
            "label_names": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                            "truck"]}
