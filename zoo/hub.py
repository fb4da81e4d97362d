"""Downloads from the Hugging Face Hub: only JSON and safetensors ever come off the network."""

from __future__ import annotations

import re
from pathlib import Path

from zoo.release import CARD, CONFIG, WEIGHTS

REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a branch, tag or commit: never a path
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def parse_source(source: str) -> tuple[str, str | None]:
    """`hf-hub:org/repo[@revision]` -> (repo_id, revision)."""
    body = source.removeprefix("hf-hub:")
    repo_id, at, revision = body.partition("@")
    validate_repo_id(repo_id)
    if at:
        validate_revision(revision)
    return repo_id, revision or None


def validate_repo_id(repo_id: str) -> str:
    # fullmatch: `$` would let a trailing newline through
    if not isinstance(repo_id, str) or not REPO_ID.fullmatch(repo_id) or ".." in repo_id:
        raise ValueError(f"expected a Hub repository id like 'org/name' (letters, digits, '.', '_', '-'), "
                         f"got {repo_id!r}")
    return repo_id


def validate_revision(revision: str) -> str:
    if not isinstance(revision, str) or not REVISION.fullmatch(revision) or ".." in revision:
        raise ValueError(f"expected a Hub revision (a branch, tag or commit of letters, digits, '.', '_', '-'; "
                         f"no '/' or '..'), got {revision!r}")
    return revision


def _http_error(error, source: str) -> Exception:
    """A one-line error for a failed Hub request that says what happened (never the token)."""
    from huggingface_hub import constants

    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None)
    if status in (401, 403):
        return PermissionError(f"{source}: the Hub at {constants.ENDPOINT} refused access ({status}): the "
                               "repository is private or gated, or the token is not valid for it; pass token=... "
                               "or log in with `hf auth login`")
    if status == 404:
        return FileNotFoundError(f"{source}: not found on {constants.ENDPOINT} (404)")
    return ConnectionError(f"{source}: the Hub at {constants.ENDPOINT} answered {status} "
                           f"{getattr(response, 'reason_phrase', '')}".rstrip() + "; try again later")


def _answer_behind(error: BaseException):
    """The HTTP error with a response somewhere in `error`'s chain of causes, if the Hub answered at all."""
    seen = error.__cause__ or error.__context__
    while seen is not None:
        if getattr(getattr(seen, "response", None), "status_code", None) is not None:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def download(source: str, token: str | bool | None = None, cache_dir: str | None = None,
             local_files_only: bool = False) -> Path:
    """Fetch config.json, model.safetensors and the card through huggingface_hub's cache."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo_id, revision = parse_source(source)
    shown = f"hf-hub:{repo_id}" + (f"@{revision}" if revision else "")
    try:
        folder = Path(snapshot_download(
            repo_id, revision=revision, token=token, cache_dir=cache_dir, local_files_only=local_files_only,
            allow_patterns=[CONFIG, WEIGHTS, CARD],
        ))
        pickled = []
        if not (folder / WEIGHTS).is_file() and not local_files_only:
            from huggingface_hub import HfApi

            files = HfApi().list_repo_files(repo_id, revision=revision, token=token)
            pickled = [f for f in files if f.endswith(PICKLE_SUFFIXES)]
    except GatedRepoError:
        raise PermissionError(f"{shown} is gated: accept its terms on the Hub and pass token=...") from None
    except RepositoryNotFoundError:
        raise FileNotFoundError(f"hf-hub:{repo_id}: no such repository on {constants.ENDPOINT} "
                                "(or it is private or gated: pass token=...)") from None
    except RevisionNotFoundError:
        raise FileNotFoundError(f"hf-hub:{repo_id} has no revision {revision!r}") from None
    except LocalEntryNotFoundError as error:
        answered = _answer_behind(error)  # huggingface_hub falls back to the cache after a bad answer
        if answered is not None:
            raise _http_error(answered, shown) from None
        raise FileNotFoundError(f"{shown} is not in the local cache and the Hub cannot be reached (offline or "
                                "local_files_only): download it once while online") from None
    except HfHubHTTPError as error:  # 401, 500 and the like: one line, no traceback from inside the client
        raise _http_error(error, shown) from None
    root = Path(cache_dir or constants.HF_HUB_CACHE).resolve()
    if not folder.resolve().is_relative_to(root):
        raise ValueError(f"{shown} resolved to {folder}, outside the Hub cache {root}; refusing to load it")
    if not (folder / WEIGHTS).is_file():
        hint = f"; it holds pickle weights ({', '.join(pickled)}), which zoo never loads from the network" \
            if pickled else ""
        raise FileNotFoundError(f"hf-hub:{repo_id} has no {WEIGHTS}{hint}")
    if not (folder / CONFIG).is_file():
        raise FileNotFoundError(f"hf-hub:{repo_id} has no {CONFIG}; it is not a zoo release folder")
    return folder


def release_folder(source, config: str | None = None) -> Path:
    """The release folder behind `source`: a folder, a registered name with weights, or a .ckpt (exported)."""
    from zoo.release import checkpoint_folder

    path = Path(source)
    if path.is_file() and path.suffix == ".ckpt":
        import tempfile

        from zoo.training.export import export_checkpoint

        folder, _ = export_checkpoint(path, Path(tempfile.mkdtemp(prefix="zoo-push-")) / path.stem, config)
        return folder
    if path.is_dir():
        return path
    return checkpoint_folder(str(source))


def upload_files(folder: Path) -> list[str]:
    """What `push` uploads from a release folder: config, weights and card, never anything pickled."""
    missing = [f for f in (CONFIG, WEIGHTS) if not (folder / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{folder} is not a release folder: it lacks {', '.join(missing)}")
    return [f for f in (CONFIG, WEIGHTS, CARD) if (folder / f).is_file()]


def push(source, repo_id: str, *, private: bool = False, revision: str | None = None, token: str | None = None,
         config: str | None = None, commit_message: str | None = None, api=None) -> str:
    """Upload a release folder to the Hub repository `repo_id` (created if needed); returns the commit URL.

    The token comes from `token` or huggingface_hub's usual places (HF_TOKEN, `hf auth login`);
    zoo never prints or stores it.
    """
    validate_repo_id(repo_id)
    if revision is not None:
        validate_revision(revision)
    folder = release_folder(source, config)
    files = upload_files(folder)
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    if revision:
        api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
    commit = api.upload_folder(
        repo_id=repo_id, folder_path=str(folder), allow_patterns=files, revision=revision, repo_type="model",
        commit_message=commit_message or f"Upload {folder.name} with zoo",
    )
    return str(getattr(commit, "commit_url", commit))
