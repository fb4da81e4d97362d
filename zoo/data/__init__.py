"""Lightning data modules on real data sets; each says what a model must fit through `data_info`.

The modules load on first use (as `zoo`'s own names do): the package's plain reader of text files
(`zoo.data.text_files`, behind `zoo evaluate`) would otherwise pay Lightning's import, 6-10 s on a 2-core machine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zoo.utils.lazy import lazy_attributes

if TYPE_CHECKING:  # for type checkers and the API reference (mkdocstrings reads the source, not the module)
    from zoo.data.arrays import MNIST1D, AdrenalMNIST3D, ArrayClassificationData, Digits
    from zoo.data.files import NumpyArrays
    from zoo.data.folders import ImageFolder
    from zoo.data.huggingface import HuggingFaceImages
    from zoo.data.sequences import LongContextText, PixelMNIST, SequenceData
    from zoo.data.synthetic import MQAR, InductionHeads, ListOps, SelectiveCopying
    from zoo.data.text import CharText
    from zoo.data.vision import CIFAR10, MNIST, FashionMNIST

_MODULES = {
    "zoo.data.arrays": ("MNIST1D", "AdrenalMNIST3D", "ArrayClassificationData", "Digits"),
    "zoo.data.files": ("NumpyArrays",),
    "zoo.data.folders": ("ImageFolder",),
    "zoo.data.huggingface": ("HuggingFaceImages",),
    "zoo.data.sequences": ("LongContextText", "PixelMNIST", "SequenceData"),
    "zoo.data.synthetic": ("MQAR", "InductionHeads", "ListOps", "SelectiveCopying"),
    "zoo.data.text": ("CharText",),
    "zoo.data.vision": ("CIFAR10", "MNIST", "FashionMNIST"),
}
_HOME = {name: module for module, names in _MODULES.items() for name in names}

__all__ = ["MNIST1D", "AdrenalMNIST3D", "ArrayClassificationData", "CIFAR10", "CharText", "Digits",
           "FashionMNIST", "HuggingFaceImages", "ImageFolder", "MNIST", "NumpyArrays",
           "MQAR", "InductionHeads", "ListOps", "LongContextText", "PixelMNIST", "SelectiveCopying", "SequenceData"]


__getattr__, __dir__ = lazy_attributes(__name__, _HOME)
