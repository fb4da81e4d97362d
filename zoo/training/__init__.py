"""Lightning tasks that train registered models."""

from zoo.training.classification import ClassificationTask
from zoo.training.language_model import LanguageModelTask

__all__ = ["ClassificationTask", "LanguageModelTask", "task_class"]


def task_class(model_name: str) -> type:
    """The task that trains a registered model: language modeling for text models, else classification."""
    from zoo.registry import entry

    return LanguageModelTask if entry(model_name).family == "text" else ClassificationTask
