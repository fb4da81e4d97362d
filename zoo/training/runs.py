"""One run per checkpoint folder: a `zoo fit` holds its folder while it runs, and its loggers' versions are
chosen under a lock, so that two runs started together never write into each other's files."""

from __future__ import annotations

import contextlib
import os
import sys

from zoo.utils.atomic import check_writable_folder, lock_name, locked, open_lock


def claim_run(trainer) -> None:
    """Before a fit writes anything: hold its checkpoint folder for as long as it runs (a second run on the
    same folder is refused at once, naming the first), and give each logger that has no version yet the
    next free one, chosen under a lock and made at once, so that two runs started together never share one.
    Undone by release_run; calling it again is a no-op."""
    import fcntl

    from lightning.pytorch.utilities import rank_zero_only

    if getattr(trainer, "_zoo_run_lock", None) is not None:
        return
    if rank_zero_only.rank != 0:  # the other processes of one distributed run: rank 0 holds it for them all
        trainer._zoo_run_lock = -1
        return
    check_writable_folder(trainer.default_root_dir, "trainer.default_root_dir")
    for logger in getattr(trainer, "loggers", ()):
        if getattr(logger, "_version", 0) is None and hasattr(logger, "_get_next_version"):
            root = os.path.realpath(logger.root_dir)
            os.makedirs(root, exist_ok=True)
            with locked(root):
                logger._version = logger._get_next_version()
                os.makedirs(logger.log_dir, exist_ok=True)  # taken: the next run's count starts above it
    folder = getattr(trainer.checkpoint_callback, "dirpath", None)
    if folder is None:
        trainer._zoo_run_lock = -1  # checkpoints go to the logger's own version folder
        return
    fd = open_lock("run-" + lock_name(folder))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.pread(fd, 1000, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise FileExistsError(f"another run ({other}) is writing checkpoints to {folder}; wait for it to end, or "
                              "give this one its own --trainer.default_root_dir or --checkpoint.dirpath") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}: {' '.join(['zoo', *sys.argv[1:]])[:300]}".encode(), 0)
    trainer._zoo_run_lock = fd


def release_run(trainer) -> None:
    fd = getattr(trainer, "_zoo_run_lock", None)
    trainer._zoo_run_lock = None
    if fd is not None and fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)
