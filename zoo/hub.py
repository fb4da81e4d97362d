"""Downloads from the Hugging Face Hub: only JSON and safetensors ever come off the network."""

from __future__ import annotations

import re
from pathlib import Path

from zoo.release import CARD, CONFIG, WEIGHTS

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def parse_source(source: str) -> tuple[str, str | None]:
    """`hf-hub:org/repo[@revision]` -> (repo_id, revision)."""
    body = source.removeprefix("hf-hub:")
    repo_id, _, revision = body.partition("@")
    validate_repo_id(repo_id)
    return repo_id, revision or None


def validate_repo_id(repo_id: str) -> str:
    if not REPO_ID.match(repo_id) or ".." in repo_id:
        raise ValueError(f"expected a Hub repository id like 'org/name' (letters, digits, '.', '_', '-'), "
                         f"got {repo_id!r}")
    return repo_id


def download(source: str, token: str | bool | None = None, cache_dir: str | None = None,
             local_files_only: bool = False) -> Path:
    """Fetch config.json, model.safetensors and the card through huggingface_hub's cache."""
    from huggingface_hub import snapshot_download

    repo_id, revision = parse_source(source)
    folder = Path(snapshot_download(
        repo_id, revision=revision, token=token, cache_dir=cache_dir, local_files_only=local_files_only,
        allow_patterns=[CONFIG, WEIGHTS, CARD],
    ))
    if not (folder / WEIGHTS).is_file():
        hint = ""
        if not local_files_only:
            from huggingface_hub import HfApi

            files = HfApi().list_repo_files(repo_id, revision=revision, token=token)
            pickled = [f for f in files if f.endswith(PICKLE_SUFFIXES)]
            if pickled:
                hint = f"; it holds pickle weights ({', '.join(pickled)}), which zoo never loads from the network"
        raise FileNotFoundError(f"hf-hub:{repo_id} has no {WEIGHTS}{hint}")
    if not (folder / CONFIG).is_file():
        raise FileNotFoundError(f"hf-hub:{repo_id} has no {CONFIG}; it is not a zoo release folder")
    return folder
