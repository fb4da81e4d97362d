"""Lightning data modules on real data sets; each says what a model must fit through `data_info`."""

from zoo.data.arrays import MNIST1D, AdrenalMNIST3D, ArrayClassificationData, Digits
from zoo.data.files import NumpyArrays
from zoo.data.folders import ImageFolder
from zoo.data.huggingface import HuggingFaceImages
from zoo.data.sequences import LongContextText, PixelMNIST, SequenceData
from zoo.data.synthetic import MQAR, InductionHeads, ListOps, SelectiveCopying
from zoo.data.text import CharText
from zoo.data.vision import CIFAR10, MNIST, FashionMNIST

__all__ = ["MNIST1D", "AdrenalMNIST3D", "ArrayClassificationData", "CIFAR10", "CharText", "Digits",
           "FashionMNIST", "HuggingFaceImages", "ImageFolder", "MNIST", "NumpyArrays",
           "MQAR", "InductionHeads", "ListOps", "LongContextText", "PixelMNIST", "SelectiveCopying", "SequenceData"]
