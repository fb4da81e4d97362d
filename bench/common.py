"""Small helpers shared by the benchmarks: timing, peak memory, table and JSON output."""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import platform
import resource
import stat
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from zoo.training.precision import cpu_flags  # noqa: F401  (the benchmarks report it)
from zoo.utils.atomic import write_bytes_atomic, write_text_atomic

RESULTS = Path(__file__).resolve().parent / "results"


def timeit(fn, min_time: float = 1.0, max_reps: int = 20) -> float:
    """Median seconds per call, after one warm-up call (skipped for calls over 2 s)."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    if first > 2.0:
        return first
    times = []
    while len(times) < max_reps and (sum(times) < min_time or len(times) < 3):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def timeit_pair(baseline, candidate, rounds: int = 200, min_time: float = 1.0) -> tuple[float, float]:
    """Median seconds per call of two functions timed in alternation, so drift hits both alike."""
    a, b = timeit_rotation([baseline, candidate], rounds, min_time)
    return a, b


def timeit_rotation(fns, rounds: int = 200, min_time: float = 1.0) -> list[float]:
    """Median seconds per call of each function, timed in turn round after round (after one warm-up call
    each), so drift hits all alike."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    while len(times[0]) < 5 or (len(times[0]) < rounds and sum(map(sum, times)) < min_time):
        for fn, record in zip(fns, times):
            start = time.perf_counter()
            fn()
            record.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def in_subprocess(script: str, job: dict, timeout: float | None = 900, env: dict | None = None) -> dict:
    """Run `script --worker JOB` in a fresh process, so its peak memory is its own; `env` adds variables;
    timeout None waits as long as it takes."""
    out = subprocess.run(
        [sys.executable, script, "--worker", json.dumps(job)],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
    )
    if out.returncode != 0:
        return {**job, "error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"rc={out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def machine() -> dict:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
    }


def print_table(title: str, rows: list[dict], columns: list[str] | None = None) -> None:
    """Rows as a text table under a heading; columns default to every key of the rows, in first-seen order."""
    if columns is None:
        columns = list(dict.fromkeys(k for row in rows for k in row))
    print(f"\n## {title}")
    cells = [[_fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) if cells else len(c) for i, c in enumerate(columns)]
    print(" | ".join(c.ljust(w) for c, w in zip(columns, widths)))
    print("-|-".join("-" * w for w in widths))
    for row in cells:
        print(" | ".join(x.ljust(w) for x, w in zip(row, widths)))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def write_json(name: str, payload: dict) -> Path:
    """Write bench/results/NAME.json atomically: a temporary file of this writer's own, then a rename."""
    return write_text_atomic(RESULTS / f"{name}.json", json.dumps({"machine": machine(), **payload}, indent=2))


def save_figure(figure, path: Path) -> None:
    """A PNG written whole (write_bytes_atomic), so a reader, or a second process drawing the same picture, never
    meets half a file."""
    png = io.BytesIO()
    figure.savefig(png, format="png", dpi=110, bbox_inches="tight")
    write_bytes_atomic(path, png.getvalue())


def read_runs(path: Path) -> dict:
    """A benchmark's results JSON ({"runs": {...}, ...}), or an empty one where the file is absent. A file that is
    not one (another tool's, or not JSON) is refused, naming it, rather than overwritten or failing deep inside."""
    if not path.exists():
        return {"runs": {}}
    if not path.is_file():
        raise ValueError(f"{path} is a folder or a device, not a results JSON: give --out a file's path")
    try:
        results = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a results JSON of this benchmark ({error}); give --out a new file or "
                         "one it wrote") from None
    if not isinstance(results, dict) or not isinstance(results.get("runs"), dict):
        given = f"an object with keys {sorted(results)[:5]}" if isinstance(results, dict) else type(results).__name__
        raise ValueError(f"{path} is not a results JSON of this benchmark: expected an object with a \"runs\" object, "
                         f"got {given}; give --out a new file or one it wrote")
    return results


def nothing_to_show(path: Path) -> str:
    """The error for a table asked of a results file with no run in it: a mistyped path reads as an empty table."""
    return (f"{path} holds no runs to show{'' if path.exists() else ' (no such file)'}: run the bench first, or give "
            "--out the file it wrote")


@contextlib.contextmanager
def locked(name: str):
    """Hold bench/results/NAME.lock: processes that read, change and rewrite NAME.json take turns."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.lock"
    try:  # never through a link, and never truncated: a lock file's bytes do not matter, a linked file's do
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError:
        if path.is_symlink():
            raise FileExistsError(f"{path} is a symbolic link; the benchmarks lock only a file of their own there: "
                                  "remove the link") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileExistsError(f"{path} is not a regular file; the benchmarks lock only a file of their own there")
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
