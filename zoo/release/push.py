"""Uploads to the Hugging Face Hub: a release folder's config, weights and card, never anything pickled."""

from __future__ import annotations

from pathlib import Path

from zoo.models.hub import TIMEOUT, _hub_errors, validate_repo_id, validate_revision
from zoo.models.registry import checkpoint_folder
from zoo.models.release_files import CARD, CONFIG, WEIGHTS, read_config

# A .ckpt source needs Lightning (zoo.release.export, zoo.training): imported there, so that pushing a release
# folder does not pay its ~4 s import.


def release_folder(source, config: str | None = None) -> Path:
    """The release folder behind `source`: a folder, a registered name with weights, or a .ckpt (exported)."""
    path = Path(source)
    if path.is_file() and path.suffix == ".ckpt":
        import tempfile

        from zoo.release.export import export_checkpoint

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


def _checked_release(source, config: str | None) -> tuple[Path, list[str]]:
    """The release folder behind `source` and the files to upload, its config.json read and checked."""
    folder = release_folder(source, config)
    files = upload_files(folder)
    read_config((folder / CONFIG).read_bytes(), folder / CONFIG)
    return folder, files


def push(source, repo_id: str, *, private: bool = False, revision: str | None = None, token: str | None = None,
         config: str | None = None, commit_message: str | None = None, api=None) -> str:
    """Upload a release folder to the Hub repository `repo_id` (created if needed); returns the commit URL.

    The token comes from `token` or huggingface_hub's usual places (HF_TOKEN, `hf auth login`);
    zoo never prints or stores it. Only config.json, model.safetensors and README.md are uploaded.

    Args:
        source (str | os.PathLike): what to upload: a release folder, a registered model name with shipped
            weights ("name" or "name.tag"), or a zoo Lightning checkpoint (.ckpt), exported to a temporary
            release folder first.
        repo_id: the Hub repository, "org/name"; created (as a model repository) if it does not exist.
        private: create the repository private (default False); an existing one keeps its visibility.
        revision: the branch to commit to, created if needed; default None: the default branch.
        token: the Hub token; default None: huggingface_hub's usual places.
        config: for a .ckpt source, the recipe it was trained with, so that the card gets test metrics
            measured at export; default None.
        commit_message: the commit's message; default None: "Upload <folder name> with zoo".
        api (huggingface_hub.HfApi | None): an `HfApi` to use instead of a new one (tests pass a fake); default None.

    Returns:
        The commit's URL.
    """
    validate_repo_id(repo_id)
    if revision is not None:
        validate_revision(revision)
    shown = f"hf-hub:{repo_id}"
    exported = Path(source).suffix == ".ckpt" and Path(source).is_file()
    if exported:  # refused in one line before the Hub is asked
        from zoo.training.checkpoint_io import read_checkpoint

        read_checkpoint(source)
    else:  # a folder that is no release, or an unknown name, is refused before the Hub is asked too
        folder, files = _checked_release(source, config)
    if api is None:
        from huggingface_hub import HfApi

        check_hub(token, shown)  # before a .ckpt is exported: the Hub answers, and takes the token
        api = HfApi(token=token)
    if exported:
        folder, files = _checked_release(source, config)
    with _hub_errors(shown, revision):
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if revision:
            api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
        commit = api.upload_folder(
            repo_id=repo_id, folder_path=str(folder), allow_patterns=files, revision=revision, repo_type="model",
            commit_message=commit_message or f"Upload {folder.name} with zoo",
        )
    return str(getattr(commit, "commit_url", commit))


def check_hub(token: str | bool | None = None, what: str = "zoo") -> None:
    """Fail in one line, within TIMEOUT, where the Hub does not answer or refuses the token (an answer to
    whoami): before long work that ends in an upload."""
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    with _hub_errors(what):
        response = get_session().get(f"{constants.ENDPOINT}/api/whoami-v2", headers=build_hf_headers(token=token),
                                     timeout=TIMEOUT)
        hf_raise_for_status(response)
