"""Lightning tasks that train registered models."""

from zoo.training.classification import ClassificationTask
from zoo.training.language_model import LanguageModelTask

__all__ = ["ClassificationTask", "LanguageModelTask"]
