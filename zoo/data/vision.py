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
        try:
            return cls(str(self.root), train=train, download=False)
        except RuntimeError:
            if not self.download:
                raise FileNotFoundError(f"{self.dataset_name} not found under {self.root} and download=False; "
                                        f"set data.root to the folder that holds {self.dataset_name}/") from None
        try:
            return cls(str(self.root), train=train, download=True)
        except Exception as err:  # offline, or the mirror is down
            raise FileNotFoundError(f"{self.dataset_name} is not under {self.root} and could not be downloaded "
                                    f"({type(err).__name__}: {err}); set data.root to a folder that holds it") from err

    def load(self, split):
        ds = self._dataset(train=split == "train")
        x = torch.as_tensor(ds.data)
        x = x.permute(0, 3, 1, 2) if x.dim() == 4 else x[:, None]  # CIFAR is stored (N, H, W, C)
        return x.float() / 255.0, torch.as_tensor(ds.targets, dtype=torch.long)


class MNIST(_Torchvision):
    dataset_name = dataset = "MNIST"
    hub_dataset = "ylecun/mnist"
    info = {"num_classes": 10, "in_chans": 1, "input_size": [28, 28], "mean": [0.1307], "std": [0.3081],
            "label_names": [str(i) for i in range(10)]}


class FashionMNIST(MNIST):
    dataset_name, dataset = "FashionMNIST", "Fashion-MNIST"
    hub_dataset = "zalando-datasets/fashion_mnist"
    info = {"num_classes": 10, "in_chans": 1, "input_size": [28, 28], "mean": [0.2860], "std": [0.3530],
            "label_names": ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker",
                            "Bag", "Ankle boot"]}


class CIFAR10(_Torchvision):
    dataset_name, dataset = "CIFAR10", "CIFAR-10"
    default_shift, default_flip = 4, True
    hub_dataset = "uoft-cs/cifar10"
    info = {"num_classes": 10, "in_chans": 3, "input_size": [32, 32], "mean": [0.4914, 0.4822, 0.4465],
            "std": [0.2470, 0.2435, 0.2616],
            "label_names": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                            "truck"]}
