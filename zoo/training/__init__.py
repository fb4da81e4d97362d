"""Lightning tasks that train registered models."""

from zoo.training.classification import ClassificationTask
from zoo.training.language_model import LanguageModelTask
from zoo.training.sequence import SequenceTask

__all__ = ["ClassificationTask", "LanguageModelTask", "SequenceTask", "task_class"]


def task_class(model_name: str, model_config: dict | None = None) -> type:
    """The task that trains a model (registered, or a checkpoint to start from): language modeling for text
    models, else classification.

    Args:
        model_name: a registered name, a shipped name.tag, a release folder or hf-hub:org/repo.
        model_config: a task's saved model config; where given, it decides without looking at the source.
    """
    from zoo.training.source import source_family

    if model_config is not None:
        return LanguageModelTask if model_config.get("class") == "TextTransformer" else ClassificationTask
    return LanguageModelTask if source_family(model_name) == "text" else ClassificationTask
