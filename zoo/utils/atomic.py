"""Files and folders that no reader sees half-written, and that never replace what zoo did not write.

- `write_text_atomic`, `write_bytes_atomic`: a temporary file beside the target, then one rename over it.
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
  replaced; anything else is refused with a message that names the path. An empty folder
  is filled where it is (it may be the caller's `.`), not swapped away.
- Hidden names beside a path start with the path's name, or for a long one (up to the 255
  bytes a name may have) with a hash of it, so that they fit too.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import glob
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

STAGING = ".zoo-staging-"  # hidden siblings `.<name>.zoo-staging-<pid>-<random>`
LOCKS = Path(tempfile.gettempdir()) / "zoo-locks"
READ_ATTEMPTS = 200  # x 10 ms: how long a reader waits for a writer's swap, at most


def hidden_stem(path: Path) -> str:
    """What zoo's hidden siblings of `path` are named after: its name, or for a long name a hash of it, so that
    `.STEM.zoo-staging-PID-HEX` stays within the 255 bytes a file name may have."""
    name = os.fsencode(path.name)
    return path.name if len(name) <= 200 else "zoo-" + hashlib.sha256(name).hexdigest()[:16]


def check_parents(path, what: str) -> None:
    """Refuse, naming the part at fault, a path whose folder cannot be made or written into: a part that is a
    file, a link that loops or leads nowhere, or (the nearest existing folder) one this user cannot write."""
    path = Path(os.path.abspath(path))
    for parent in path.parents:
        try:
            info = parent.stat()
        except (FileNotFoundError, NotADirectoryError):
            if parent.is_symlink():
                raise NotADirectoryError(f"{what} {path}: {parent} is a link to nothing") from None
            continue  # made later; a file further up is named when the loop reaches it
        except OSError as error:  # ELOOP: a link that leads back to itself
            raise NotADirectoryError(f"{what} {path}: {parent} cannot be followed ({error.strerror})") from None
        if not stat.S_ISDIR(info.st_mode):
            raise NotADirectoryError(f"{what} {path}: {parent} is a file, not a folder")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise PermissionError(f"{what} {path}: the folder {parent} is not writable")
        return


def check_writable_folder(path, what: str) -> None:
    """Refuse, naming it, a folder that cannot be made or written into (see check_parents); else nothing."""
    path = Path(os.path.abspath(path))
    try:
        info = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        check_parents(path, what)
        return
    except OSError as error:
        raise NotADirectoryError(f"{what} {path} cannot be followed ({error.strerror})") from None
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(f"{what} {path} is a file, not a folder")
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(f"{what} {path} is not writable")


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it is to set it: put it straight back
    os.umask(mask)
    return mask


def _alive(pid: int) -> bool:
    if os.name != "posix":
        return True  # no harmless probe there: never guess a writer dead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _remove_dead_temporaries(path: Path) -> None:
    """Remove the temporary files that writers of `path` left when they were killed (their pid is gone)."""
    stem = hidden_stem(path)
    pattern = re.compile(rf"\.{re.escape(stem)}\.(\d+)\.[a-z0-9_]+\.tmp")
    for name in os.listdir(path.parent):
        found = pattern.fullmatch(name)
        if found and int(found[1]) != os.getpid() and not _alive(int(found[1])):
            with contextlib.suppress(OSError):
                os.unlink(path.parent / name)


def write_text_atomic(path, text: str) -> Path:
    """`text` written to a temporary file beside `path`, then renamed over it: never half a file.

    A new file gets the usual mode (0o666 less the umask), an existing one keeps its own; the temporary
    file is `.NAME.PID.XXXXXXXX.tmp`, so that a later write removes those of writers that were killed."""
    return _write_atomic(path, text, "w")


def write_bytes_atomic(path, data: bytes) -> Path:
    """`data` written whole, as write_text_atomic writes text (a picture's PNG, say)."""
    return _write_atomic(path, data, "wb")


def _write_atomic(path, data, mode: str) -> Path:
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; expected the path of a file to write")
    check_parents(path, "the file")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        file_mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        file_mode = 0o666 & ~_umask()
    _remove_dead_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{hidden_stem(path)}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, file_mode)
        with os.fdopen(fd, mode) as f:
            f.write(data)
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


def _shared_lock_folder() -> Path | None:
    """$TMPDIR/zoo-locks, where every user's writers lock (sticky and world-writable, like /tmp itself), or None
    where that name is taken by something else: a file, a link, another user's private folder."""
    try:
        LOCKS.mkdir()
        LOCKS.chmod(0o1777)
    except FileExistsError:
        pass
    except OSError:
        return None
    info = os.lstat(LOCKS)
    if stat.S_ISDIR(info.st_mode) and (info.st_uid == os.getuid() or info.st_mode & 0o1002 == 0o1002):
        return LOCKS
    return None


def _own_lock_folder() -> Path:
    own = LOCKS.with_name(f"{LOCKS.name}-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        own.mkdir(mode=0o700)
    info = os.lstat(own)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(f"zoo's lock folders {LOCKS} and {own} are taken by something else (a file, a link "
                              "or another user's folder): remove them, or set TMPDIR to another folder")
    return own


def open_lock(name: str) -> int:
    """A descriptor of the lock file `name` in the lock folder, opened without following links (flock it).

    Where the shared folder is unusable, or `name` there is a link or a file this user may not open (planted
    by someone else), this user's own folder `zoo-locks-UID` is used: every process of the user decides the
    same way, so its writers still take turns."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    shared = _shared_lock_folder()
    if shared is not None:
        try:
            fd = os.open(shared / name, flags, 0o666)
        except OSError:  # ELOOP (a planted link), EACCES (another user's private file)
            pass
        else:
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode):
                if info.st_uid == os.getuid():
                    os.fchmod(fd, 0o666)  # other users' writers of the same path lock it too
                return fd
            os.close(fd)
    return os.open(_own_lock_folder() / name, flags, 0o600)


def lock_name(path) -> str:
    return hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:32] + ".lock"


@contextlib.contextmanager
def locked(path):
    """An exclusive lock for writers of `path`, shared by every process of this machine (held while in the
    `with` block; the lock file lives in zoo's lock folder, never beside `path`)."""
    if os.name != "posix":
        from filelock import FileLock

        LOCKS.mkdir(parents=True, exist_ok=True)
        with FileLock(str(LOCKS / lock_name(path))):
            yield
        return
    import fcntl

    fd = open_lock(lock_name(path))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _staging_siblings(path: Path) -> list[Path]:
    return [Path(p) for p in glob.glob(str(path.parent / f".{glob.escape(hidden_stem(path))}{STAGING}*"))]


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
    if path.name in ("", ".", ".."):  # `.` and the like: the folder they name, which has a name
        path = Path(os.path.abspath(path))
    check_replaceable(path, ours, what, overwrite)
    check_parents(path, f"the {what}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path):
        check_replaceable(path, ours, what, overwrite)  # again: another writer may have come first
        for stale in _staging_siblings(path):  # only locked writers stage, so these are a dead one's
            shutil.rmtree(stale, ignore_errors=True)
        staging = path.with_name(f".{hidden_stem(path)}{STAGING}{os.getpid()}-{secrets.token_hex(4)}")
        staging.mkdir()
        try:
            fill(staging)
            if not path.exists():
                os.rename(staging, path)
            elif not any(path.iterdir()):  # an empty folder (maybe someone's `.`): filled, not swapped away
                for entry in staging.iterdir():
                    os.rename(entry, path / entry.name)
            elif not _exchange(staging, path):
                old = path.with_name(f".{hidden_stem(path)}{STAGING}{os.getpid()}-old")
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


def _read_once(path: Path, names: list[str], read: Callable) -> dict:
    if os.open not in os.supports_dir_fd or not hasattr(os, "O_DIRECTORY"):
        out = {}
        for name in names:
            with open(path / name, "rb") as f:
                out[name] = read(name, f)
        return out
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
            out[name] = read(name, f)
    return out


def read_folder(path, names: list[str], read: Callable | None = None) -> dict:
    """The bytes of `names` in folder `path`, all from one version of it, while writers may swap it.
    `read(name, file)`, if given, reads each open file instead (e.g. only a header, keeping a dup of its fd)."""
    path = Path(path)
    for attempt in range(READ_ATTEMPTS):
        try:
            return _read_once(path, names, read or (lambda name, f: f.read()))
        except FileNotFoundError:
            # Gone while we opened it: a writer swapped a new version in (or is between its two
            # renames). Read the new one; anything else is really missing.
            swapping = all((path / n).is_file() for n in names) or _staging_siblings(path)
            if not swapping or attempt == READ_ATTEMPTS - 1:
                raise
            time.sleep(0.01)
    raise AssertionError("unreachable")


def write_json_atomic(path, data) -> Path:
    """`data` as indented JSON, written whole (write_text_atomic)."""
    return write_text_atomic(path, json.dumps(data, indent=2) + "\n")
