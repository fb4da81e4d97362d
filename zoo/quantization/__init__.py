"""Outliers and int8: activation statistics of a trained model, and W8A8 fake quantization.

Follows Bondarenko, Nagel and Blankevoort 2023 ("Quantizable Transformers: removing outliers
by helping attention heads do nothing"), so that the numbers of `bench/outliers.py` sit
beside theirs.
"""

from zoo.quantization.fake_quant import W8A8, fake_quantize_weight
from zoo.quantization.outliers import ActivationStats, pearson_kurtosis, watched_layers

__all__ = ["W8A8", "ActivationStats", "fake_quantize_weight", "pearson_kurtosis", "watched_layers"]
