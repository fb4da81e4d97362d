"""Files and folders that no reader sees half-written, and that never replace what zoo did not write.

- `write_text_atomic`: a temporary file beside the target, then one rename over it.
- `replace_folder`: a whole folder built in a hidden staging folder beside its place, then
  swapped in. Writers of one path take turns (a lock under the system's temporary folder,
  so nothing is left beside the user's files); a staging folder left by a killed writer is
  removed by the next one. On Linux the swap is one atomic exchange of the two names
  (renameat2 RENAME_EXCHANGE), so the path always names a complete folder; elsewhere it is
  two renames, and `read_folder` waits out the instant between them.
- `read_folder`: the bytes of several files of one folder, all from the same version of it:
  the folder is opened once and its files through that handle, and a version removed while
  it was being opened is simply read again from the new one.
- Only an absent path, an empty folder, or a folder that `ours` recognises is ever
  replaced; anything else is refused with a message that names the path.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import glob
import hashlib
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

STAGING = ".zoo-staging-"  # hidden siblings `.<name>.zoo-staging-<pid>-<random>`
LOCKS = Path(tempfile.gettempdir()) / "zoo-locks"
READ_ATTEMPTS = 200  # x 10 ms: how long a reader waits for a writer's swap, at most


def write_text_atomic(path, text: str) -> Path:
    """`text` written to a temporary file beside `path`, then renamed over it: never half a file."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; expected the path of a file to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def appendable_jsonl(path, what: str) -> Path:
    """`path` as a JSON-lines file to append to, refused now (not after an epoch of training) where it
    cannot be one, or where it already holds something that is not JSON lines: never write into a
    file zoo did not write."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{what} {path} is a folder; give a file name inside it, e.g. {path / 'log.jsonl'}")
    if any(parent.exists() and not parent.is_dir() for parent in path.parents):
        raise NotADirectoryError(f"{what} {path}: a part of its folder is a file")
    if path.is_file() and not _starts_as_json_lines(path):
        raise FileExistsError(f"{what} {path} exists and is not a JSON-lines file; zoo appends only to its "
                              "own logs, so give a new file name")
    return path


def _starts_as_json_lines(path: Path, window: int = 1 << 16) -> bool:
    """Whether the file is empty or its first non-blank line is a JSON object (judged within its first
    `window` bytes: a line longer than that counts when it opens with "{")."""
    with open(path, "rb") as f:
        head = f.read(window)
    lines = head.split(b"\n")
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        if number == len(lines) - 1 and len(head) == window:  # cut off by the window, not by a newline
            return line.lstrip().startswith(b"{")
        try:
            return isinstance(json.loads(line), dict)
        except ValueError:
            return False
    return True


def _lock(path: Path):
    """An exclusive lock for writers of `path`, shared by every process of this machine."""
    from filelock import FileLock

    if not LOCKS.is_dir():
        LOCKS.mkdir(parents=True, exist_ok=True)
        try:
            LOCKS.chmod(0o1777)  # every user's writers lock here, like /tmp itself
        except OSError:
            pass
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]
    return FileLock(str(LOCKS / f"{key}.lock"))


def _staging_siblings(path: Path) -> list[Path]:
    return [Path(p) for p in glob.glob(str(path.parent / f".{glob.escape(path.name)}{STAGING}*"))]


def marked_folder(path, marker: str, kind: str, allowed: tuple[str, ...] | None = None) -> bool:
    """Whether `path` is a folder zoo wrote: its JSON `marker` file says {"format": kind}, and (with
    `allowed`) it holds nothing but those names."""
    path = Path(path)
    try:
        if allowed is not None and not {p.name for p in path.iterdir()} <= set(allowed):
            return False
        return json.loads((path / marker).read_text()).get("format") == kind
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return False


def check_replaceable(path, ours: Callable[[Path], bool], what: str, overwrite: bool = True) -> None:
    """Refuse, naming `path`, unless it is absent, an empty folder, or (with overwrite) one that `ours` accepts."""
    path = Path(path)
    if path.is_symlink():
        raise FileExistsError(f"{path} is a symbolic link; zoo writes a {what} only to a real path: "
                              "choose another path")
    if not path.exists():
        return
    if not path.is_dir():
        raise FileExistsError(f"{path} is a file; zoo writes a {what} only where nothing is, or over a {what} it "
                              "wrote itself: choose another path, or move the file away yourself")
    entries = sorted(p.name for p in path.iterdir())
    if not entries:
        return
    if not ours(path):
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise FileExistsError(f"{path} holds files that are not a zoo {what} ({shown}); zoo never replaces what it "
                              "did not write: choose another path, or empty it yourself")
    if not overwrite:
        raise FileExistsError(f"{path} already holds a {what}: pass --overwrite (overwrite=True) to replace it, "
                              "or choose another path")


def replace_folder(path, fill: Callable[[Path], None], ours: Callable[[Path], bool], what: str,
                   overwrite: bool = True) -> Path:
    """Build a folder with `fill(staging)` and put it at `path` in one step (see the module docstring)."""
    path = Path(path)
    check_replaceable(path, ours, what, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock(path):
        check_replaceable(path, ours, what, overwrite)  # again: another writer may have come first
        for stale in _staging_siblings(path):  # only locked writers stage, so these are a dead one's
            shutil.rmtree(stale, ignore_errors=True)
        staging = path.with_name(f".{path.name}{STAGING}{os.getpid()}-{secrets.token_hex(4)}")
        staging.mkdir()
        try:
            fill(staging)
            if not path.exists():
                os.rename(staging, path)
            elif not _exchange(staging, path):
                old = path.with_name(f".{path.name}{STAGING}{os.getpid()}-old")
                os.rename(path, old)
                os.rename(staging, path)
                shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # after an exchange it holds the old version
    return path


@functools.cache
def _renameat2():
    """libc's renameat2, or None (not Linux, or glibc before 2.28)."""
    if not sys.platform.startswith("linux"):
        return None
    return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names of two folders atomically (Linux renameat2); False where that is not available."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # a file system without exchange
        return False
    raise OSError(code, os.strerror(code), str(b))


def _read_once(path: Path, names: list[str]) -> dict[str, bytes]:
    if os.open not in os.supports_dir_fd or not hasattr(os, "O_DIRECTORY"):
        return {name: (path / name).read_bytes() for name in names}
    folder = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:  # open every file through the one folder handle first: then all come from one version
        handles = {}
        try:
            for name in names:
                handles[name] = os.open(name, os.O_RDONLY, dir_fd=folder)
        except BaseException:
            for fd in handles.values():
                os.close(fd)
            raise
    finally:
        os.close(folder)
    out = {}
    for name, fd in handles.items():
        with os.fdopen(fd, "rb") as f:
            out[name] = f.read()
    return out


def read_folder(path, names: list[str]) -> dict[str, bytes]:
    """The bytes of `names` in folder `path`, all from one version of it, while writers may swap it."""
    path = Path(path)
    for attempt in range(READ_ATTEMPTS):
        try:
            return _read_once(path, names)
        except FileNotFoundError:
            # Gone while we opened it: a writer swapped a new version in (or is between its two
            # renames). Read the new one; anything else is really missing.
            swapping = all((path / n).is_file() for n in names) or _staging_siblings(path)
            if not swapping or attempt == READ_ATTEMPTS - 1:
                raise
            time.sleep(0.01)
    raise AssertionError("unreachable")
