"""Lightning tasks that train registered models.

The tasks load on first use (as `zoo`'s own names do): the package's modules that need no Lightning
(`zoo.training.evaluate`, behind `zoo evaluate`) would otherwise pay its import, 6-10 s on a 2-core machine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zoo.utils.lazy import lazy_attributes

if TYPE_CHECKING:  # for type checkers and the API reference (mkdocstrings reads the source, not the module)
    from zoo.training.classification import ClassificationTask
    from zoo.training.language_model import LanguageModelTask
    from zoo.training.sequence import SequenceTask

_TASKS = {
    "ClassificationTask": "zoo.training.classification",
    "LanguageModelTask": "zoo.training.language_model",
    "SequenceTask": "zoo.training.sequence",
}

__all__ = ["ClassificationTask", "LanguageModelTask", "SequenceTask", "task_class"]


__getattr__, __dir__ = lazy_attributes(__name__, _TASKS)


def task_class(model_name: str, model_config: dict | None = None) -> type:
    """The task that trains a model (registered, or a checkpoint to start from): language modeling for text
    models, else classification.

    Args:
        model_name: a registered name, a shipped name.tag, a release folder or hf-hub:org/repo.
        model_config: a task's saved model config; where given, it decides without looking at the source.
    """
    from zoo.training.classification import ClassificationTask
    from zoo.training.language_model import LanguageModelTask
    from zoo.training.source import source_family

    if model_config is not None:
        return LanguageModelTask if model_config.get("class") == "TextTransformer" else ClassificationTask
    return LanguageModelTask if source_family(model_name) == "text" else ClassificationTask
