"""A module put in evaluation mode for a while, and given back in the mode it had."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn


@contextlib.contextmanager
def evaluating(module: nn.Module) -> Iterator[nn.Module]:
    """`with evaluating(model):` runs the block with dropout off and norms frozen (module.eval()), then restores
    training mode if the module was training, also when the block raises: an evaluation in the middle of
    training (a metric at export, a callback's measure) must not leave the model in another mode."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)
