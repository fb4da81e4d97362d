"""What `zoo fit | validate | test | predict` leaves out of its output, unless `--verbose` or ZOO_VERBOSE=1.

A run prints what its user needs: zoo's own lines (the precision chosen, where the release went, with its
metrics), Lightning's model summary, progress bar, metrics tables and the lines that say what happened
(the seed, why fit stopped, the checkpoint a run resumed from). Left out:

- Lightning's advertising tip ("try installing litlogger"): not about the run at all;
- start-up lines that say nothing or repeat another: "TPU available: False" (no such device here),
  "Using bfloat16 Automatic Mixed Precision (AMP)" (the recipe's precision, or zoo's own line on what
  `precision: auto` chose, already says it), "Loading `train_dataloader` to estimate number of stepping
  batches" (Lightning's internals);
- deprecation warnings raised outside zoo: one library telling another (Lightning on torch's API, say)
  about a change the user can do nothing about; zoo's own stay;
- the same said through logging: torch's pytree on torchao's enums (importing Lightning imports both);
- Lightning's warning that the model summary counts bf16 weights as 32-bit: the size it prints is an estimate;
- Lightning's notice, where TensorBoard is not installed, that it logs to CSV files and that `pip install
  lightning[extra]` would add TensorBoard: the run's end line says where the logs went.

Everything else, warnings included, is printed as always. The filters are Lightning's documented way of
shaping its console output (its loggers, Python's warnings filters), held only while the command runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from collections.abc import Iterator

# libraries that say a deprecation through logging rather than warnings: torch's pytree, when importing
# Lightning imports transformers and torchao, says torchao's registering of its enums is deprecated
DEPRECATION_LOGGERS = ("torch.utils._pytree",)
# Lightning's rank_zero_info lines go through lightning_utilities' logger, which lightning.fabric and
# lightning.pytorch each replace by their own on import (whichever was imported last wins): all three.
RANK_ZERO_LOGGERS = ("lightning_utilities.core.rank_zero", "lightning.fabric.utilities.rank_zero",
                     "lightning.pytorch.utilities.rank_zero")
QUIETED_LINES = re.compile("|".join([
    r"💡 Tip:",  # Lightning's advertisement (litlogger, Lightning's platform)
    r"(TPU|HPU|IPU) available: False",
    r"Using (16bit|bfloat16) Automatic Mixed Precision",
    r"Loading `\w+` to estimate number of stepping batches",
]))
DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
# the warnings module matches `module` from the start of the name of the module a warning is attributed to:
# any module but zoo and its submodules
NOT_ZOO = r"(?!zoo(\.|$))"


def verbose_requested(flag: bool = False) -> bool:
    """Whether the user asked for everything: `--verbose`, or ZOO_VERBOSE set to anything but "" or "0"."""
    return flag or os.environ.get("ZOO_VERBOSE", "") not in ("", "0")


class _QuietedLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not QUIETED_LINES.match(record.getMessage())


class _Deprecations(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "deprecated" not in record.getMessage()


# warnings a training run leaves out beyond the deprecations (this module's docstring says why)
TRAINING_WARNINGS = (r"Precision \S+ is not supported by the model summary",
                     r"Starting from v1\.9\.0, `tensorboardX` has been removed")


@contextlib.contextmanager
def _leaving_out(filters: list, messages: tuple[str, ...] = (), before_warnings=None) -> Iterator[None]:
    """Logging filters on their loggers, then (after `before_warnings()`) the warnings filters: library
    deprecations and `messages`; all of it taken away again when the block ends."""
    for logger, line_filter in filters:
        logger.addFilter(line_filter)
    try:
        if before_warnings is not None:
            before_warnings()
        with warnings.catch_warnings():
            for category in DEPRECATIONS:
                warnings.filterwarnings("ignore", category=category, module=NOT_ZOO)
            for message in messages:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        for logger, line_filter in filters:
            logger.removeFilter(line_filter)


def _import_lightning() -> None:
    # Lightning puts its own filter for its deprecations first in line when it is imported: import it before
    # ours are added, so that ours come first
    import lightning.pytorch  # noqa: F401


@contextlib.contextmanager
def quiet_output(enabled: bool = True) -> Iterator[None]:
    """While it is open, leave out the lines and warnings listed in this module's docstring (nothing when
    `enabled` is false). Process-wide, as logging and warnings are: open it around a whole command."""
    if not enabled:
        yield
        return
    # a logger's filters apply to the records it makes itself: each library's own, set before it is imported
    filters = [(logging.getLogger(name), _QuietedLines()) for name in RANK_ZERO_LOGGERS] + \
              [(logging.getLogger(name), _Deprecations()) for name in DEPRECATION_LOGGERS]
    with _leaving_out(filters, TRAINING_WARNINGS, before_warnings=_import_lightning):
        yield


@contextlib.contextmanager
def quiet_deprecations(enabled: bool = True) -> Iterator[None]:
    """For the commands that do not train (evaluate, generate, export, ...): leave out only the deprecations that
    libraries raise about each other, by warning or through logging, and import nothing to do it."""
    if not enabled:
        yield
        return
    with _leaving_out([(logging.getLogger(name), _Deprecations()) for name in DEPRECATION_LOGGERS]):
        yield
