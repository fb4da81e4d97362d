"""The docs site built once per test run (`mkdocs build --strict`, 12-15 s on 2 cores), for the tests that read it:
tests/test_docs.py checks its API and CLI reference, tests/test_site.py opens every page in Chromium.

Built under a lock in a folder all of the run's pytest-xdist workers share (each worker's own base folder lies
inside it), so the second test to ask waits for the first build and reads it; a test file run alone builds it
itself. Within one run the sources do not change, so the build cannot be stale; nothing outlives the run's folder.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Build:
    site: Path
    returncode: int
    stderr: str


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=config.parent, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True,
                          text=True, timeout=300)


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder this test run alone has, shared by its xdist workers (each one's base folder is inside it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def the_strict_site(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """The repository's site, built --strict once in this run (the first caller builds, the others wait and read)."""
    folder = run_folder(tmp_path_factory) / "zoo-site"
    folder.mkdir(exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = folder / "result.json"
        if not result.exists():
            shutil.rmtree(folder / "site", ignore_errors=True)
            done = build(REPO / "mkdocs.yml", folder / "site")
            result.write_text(json.dumps({"returncode": done.returncode, "stderr": done.stderr}))
        saved = json.loads(result.read_text())
    return Build(folder / "site", saved["returncode"], saved["stderr"])
