"""Downloads from the Hugging Face Hub: only JSON and safetensors ever come off the network."""

from __future__ import annotations

import re
from pathlib import Path

from zoo.models.arguments import check_budget
from zoo.models.registry import ARCHITECTURES
from zoo.models.release_files import CARD, CONFIG, FLOAT_DTYPES, WEIGHTS, read_config
from zoo.utils.atomic import write_text_atomic

REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a branch, tag or commit: never a path
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
COMMIT = re.compile(r"[0-9a-f]{40}")  # what the Hub must answer for a revision: huggingface_hub makes paths of it
ETAG = re.compile(r"[A-Za-z0-9._-]+")  # names the cached blob file
TIMEOUT = 10.0  # seconds zoo waits for each answer from the Hub


def parse_source(source: str) -> tuple[str, str | None]:
    """`hf-hub:org/repo[@revision]` -> (repo_id, revision)."""
    body = source.removeprefix("hf-hub:")
    repo_id, at, revision = body.partition("@")
    validate_repo_id(repo_id)
    if at:
        validate_revision(revision)
    return repo_id, revision or None


def shorten(text) -> str:
    """What the user gave, cut for an error message: an overlong id is named by its start and its length."""
    shown = repr(text)
    return shown if len(shown) <= 80 else f"{shown[:80]}... ({len(text)} characters)"


def validate_repo_id(repo_id: str) -> str:
    # fullmatch: `$` would let a trailing newline through
    if (not isinstance(repo_id, str) or not REPO_ID.fullmatch(repo_id) or ".." in repo_id
            or max(map(len, repo_id.split("/"))) > 96):  # the Hub's own limit on each name
        raise ValueError(f"expected a Hub repository id like 'org/name' (letters, digits, '.', '_', '-'; at most "
                         f"96 of them each side), "
                         f"got {shorten(repo_id)}")
    return repo_id


def validate_revision(revision: str) -> str:
    if not isinstance(revision, str) or not REVISION.fullmatch(revision) or ".." in revision:
        raise ValueError(f"expected a Hub revision (a branch, tag or commit of letters, digits, '.', '_', '-'; "
                         f"no '/' or '..'), got {shorten(revision)}")
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


def _transport_error(error: BaseException, source: str) -> Exception | None:
    """One line for a Hub that does not answer, or not as HTTP: None if `error` (or its cause) is none of those."""
    import httpx2
    from huggingface_hub import constants

    seen = error
    while seen is not None and not isinstance(seen, httpx2.HTTPError):
        seen = seen.__cause__ or seen.__context__
    where = f"{source}: the Hub at {constants.ENDPOINT}"
    if isinstance(seen, httpx2.TimeoutException):
        return TimeoutError(f"{where} did not answer within {TIMEOUT:g} s (zoo.models.hub.TIMEOUT); try again later")
    if isinstance(seen, httpx2.TooManyRedirects):
        return ConnectionError(f"{where} redirects in a loop")
    if isinstance(seen, httpx2.ConnectError):
        return ConnectionError(f"{where} cannot be reached (nothing answers there, or the network is down)")
    if isinstance(seen, httpx2.HTTPError):
        detail = " ".join(str(seen).split())[:100]
        return ConnectionError(f"{where} broke off its answer ({type(seen).__name__}: {detail}); try again later")
    return None


def _hub_errors(shown: str, revision: str | None = None):
    """huggingface_hub's and httpx's errors as one line each (no chained traceback, never the token)."""
    import contextlib

    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    @contextlib.contextmanager
    def translated():
        try:
            yield
        except GatedRepoError:
            raise PermissionError(f"{shown} is gated: accept its terms on the Hub and pass token=...") from None
        except RepositoryNotFoundError:
            raise FileNotFoundError(f"{shown.partition('@')[0]}: no such repository on {constants.ENDPOINT} "
                                    "(or it is private or gated: pass token=...)") from None
        except RevisionNotFoundError:
            raise FileNotFoundError(f"{shown.partition('@')[0]} has no revision {revision!r}") from None
        except LocalEntryNotFoundError as error:
            answered = _answer_behind(error)  # huggingface_hub falls back to the cache after a bad answer
            if answered is not None:
                raise _http_error(answered, shown) from None
            failed = _transport_error(error, shown)
            if failed is not None:
                raise failed from None
            raise FileNotFoundError(f"{shown} is not in the local cache and the Hub cannot be reached (offline or "
                                    "local_files_only): download it once while online") from None
        except HfHubHTTPError as error:  # 401, 500 and the like: one line, no traceback from inside the client
            raise _http_error(error, shown) from None
        except Exception as error:
            failed = _transport_error(error, shown)
            if failed is None:
                raise
            raise failed from None

    return translated()


def _resolve(api, repo_id: str, revision: str | None, shown: str) -> tuple[str, set[str]]:
    """The commit `revision` names and the files in it, as the Hub answers; refused unless the commit is one
    (40 hexadecimal digits): huggingface_hub makes cache paths of it, and `../../x` would write outside the cache."""
    from huggingface_hub import constants
    from huggingface_hub.errors import HFValidationError

    try:
        info = api.model_info(repo_id, revision=revision or constants.DEFAULT_REVISION, timeout=TIMEOUT)
    except (KeyError, TypeError, AttributeError, ValueError) as error:  # not JSON, or JSON of something else
        if isinstance(error, (OSError, HFValidationError)):  # the first from the network, the second ours
            raise
        raise ValueError(f"{shown}: the Hub at {constants.ENDPOINT} answered something that is not a repository's "
                         f"description ({type(error).__name__}); is HF_ENDPOINT a Hub?") from None
    sha = getattr(info, "sha", None)
    if not isinstance(sha, str) or not COMMIT.fullmatch(sha):
        raise ValueError(f"{shown}: the Hub at {constants.ENDPOINT} answered the commit id {shorten(sha)}, not 40 "
                         "hexadecimal digits; nothing was downloaded")
    return sha, {s.rfilename for s in (info.siblings or []) if isinstance(getattr(s, "rfilename", None), str)}


def _check_file(repo_id: str, filename: str, sha: str, token, shown: str) -> None:
    """Ask for a file's metadata before huggingface_hub writes it: its commit must be the one resolved and
    its ETag (which names the cached blob) a plain name."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url

    meta = get_hf_file_metadata(hf_hub_url(repo_id, filename, revision=sha), token=token, timeout=TIMEOUT)
    if meta.commit_hash != sha:
        raise ValueError(f"{shown}: the Hub at {constants.ENDPOINT} answered {filename} for commit "
                         f"{shorten(meta.commit_hash)}, not the {sha} it asked for; nothing was written")
    if not isinstance(meta.etag, str) or not ETAG.fullmatch(meta.etag) or meta.etag.strip(".") == "":
        raise ValueError(f"{shown}: the Hub at {constants.ENDPOINT} answered {filename} with the ETag "
                         f"{shorten(meta.etag)}, which is not a plain name; nothing was written")


def _check_weights_header(api, repo_id: str, sha: str, parameters: int, shown: str) -> None:
    """Read only model.safetensors' header (a range request): dtypes and size, before the weights are fetched."""
    from huggingface_hub.errors import SafetensorsParsingError

    try:
        header = api.parse_safetensors_file_metadata(repo_id, WEIGHTS, revision=sha, timeout=TIMEOUT)
    except SafetensorsParsingError as error:
        raise ValueError(f"{shown}: {WEIGHTS} is not a safetensors file ({' '.join(str(error).split())[:120]}); "
                         "nothing was downloaded") from None
    values = 0
    for name, info in header.tensors.items():
        if info.dtype not in FLOAT_DTYPES:
            raise ValueError(f"{shown}: {WEIGHTS} stores tensor {name!r} as {info.dtype}; zoo's weights are floating "
                             f"point ({', '.join(FLOAT_DTYPES)}); nothing was downloaded")
        values += info.parameter_count
    if values > parameters:
        raise ValueError(f"{shown}: {WEIGHTS} holds {values:,} values, but the model its {CONFIG} describes has "
                         f"{parameters:,} parameters; nothing was downloaded")


def _fetch_checked(repo_id: str, revision: str | None, token, cache_dir, max_parameters: int | None,
                   shown: str) -> Path:
    """Download a release, checking each answer of the Hub before huggingface_hub acts on it."""
    from huggingface_hub import HfApi, constants, hf_hub_download

    api = HfApi(token=token)
    sha, files = _resolve(api, repo_id, revision, shown)
    if WEIGHTS not in files:
        pickled = [f for f in sorted(files) if f.endswith(PICKLE_SUFFIXES)]
        hint = f"; it holds pickle weights ({', '.join(pickled)}), which zoo never loads from the network" \
            if pickled else ""
        raise FileNotFoundError(f"hf-hub:{repo_id} has no {WEIGHTS}{hint}")
    if CONFIG not in files:
        raise FileNotFoundError(f"hf-hub:{repo_id} has no {CONFIG}; it is not a zoo release folder")

    def fetch(filename: str) -> Path:
        _check_file(repo_id, filename, sha, token, shown)
        # By the commit zoo checked, never by the branch's name: asked by name, the Hub answers the commit again,
        # and a second answer (another commit, a path such as ../..) would reach huggingface_hub unchecked.
        path = Path(hf_hub_download(repo_id, filename, revision=sha, token=token, cache_dir=cache_dir,
                                    etag_timeout=TIMEOUT))
        if path.parent.name != sha:
            raise ConnectionError(f"{shown} moved from commit {sha} to {path.parent.name} while zoo downloaded it; "
                                  "try again")
        return path

    config_file = fetch(CONFIG)
    config = read_config(config_file.read_bytes(), config_file)
    parameters = check_budget(ARCHITECTURES[config["class"]], config["args"], max_parameters)
    _check_weights_header(api, repo_id, sha, parameters, shown)
    folder = fetch(WEIGHTS).parent
    if CARD in files:
        fetch(CARD)
    name = revision or constants.DEFAULT_REVISION
    if name != sha:  # what huggingface_hub would have recorded: the branch's commit, for local_files_only
        _remember_revision(folder, name, sha)
    return folder


def _remember_revision(snapshot: Path, revision: str, sha: str) -> None:
    """Record in the cache, as huggingface_hub does (refs/<revision> holding the commit), that `revision` is at
    commit `sha`, so that an offline load by that name finds the snapshot. Written whole (temporary, rename)."""
    refs = snapshot.parent.parent / "refs"  # <cache>/models--org--repo/snapshots/<sha> -> .../refs
    target = (refs / revision).resolve()
    if not target.is_relative_to(refs.resolve()):  # validate_revision refuses such names; never write outside
        raise ValueError(f"revision {revision!r} would be recorded outside the cache's refs folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(target, sha)


def download(source: str, token: str | bool | None = None, cache_dir: str | None = None,
             local_files_only: bool = False, max_parameters: int | None = None) -> Path:
    """Fetch config.json, model.safetensors and the card through huggingface_hub's cache.

    Online, the revision is first resolved to a commit (checked to be one), the config is read and its
    model's size checked against max_parameters, and the weights' header checked, before the weights come.
    Where the Hub cannot be reached, the cache serves what it holds, as huggingface_hub does.
    Nothing pickled is ever downloaded.

    Args:
        source: "hf-hub:org/repo" or "hf-hub:org/repo@revision" (a branch, tag or commit).
        token: the Hub token: a string, True for the one saved by `hf auth login`, False for none; by default
            (None) huggingface_hub's default (HF_TOKEN or the saved one). Never printed or stored.
        cache_dir: huggingface_hub's cache folder; default None: its default (HF_HUB_CACHE).
        local_files_only: use the cache only, never the network (default False).
        max_parameters: the largest model whose config is accepted, an int; default None: 1e9, or
            $ZOO_MAX_PARAMETERS.

    Returns:
        The release folder inside the cache, holding config.json, model.safetensors and the card if any.
    """
    from huggingface_hub import constants, snapshot_download

    repo_id, revision = parse_source(source)
    shown = f"hf-hub:{repo_id}" + (f"@{revision}" if revision else "")
    if cache_dir is not None and Path(cache_dir).exists() and not Path(cache_dir).is_dir():
        raise NotADirectoryError(f"cache_dir {cache_dir} is a file; expected a folder for huggingface_hub's cache")
    root = Path(cache_dir or constants.HF_HUB_CACHE).resolve()

    def cached() -> Path:
        with _hub_errors(shown, revision):
            return Path(snapshot_download(repo_id, revision=revision, token=token, cache_dir=cache_dir,
                                          local_files_only=True, allow_patterns=[CONFIG, WEIGHTS, CARD]))

    if local_files_only or constants.is_offline_mode():
        folder = cached()
    else:
        try:
            with _hub_errors(shown, revision):
                folder = _fetch_checked(repo_id, revision, token, cache_dir, max_parameters, shown)
        except (ConnectionError, TimeoutError) as unreachable:
            try:
                folder = cached()
            except FileNotFoundError:
                raise unreachable from None
    if not folder.resolve().is_relative_to(root):
        raise ValueError(f"{shown} resolved to {folder}, outside the Hub cache {root}; refusing to load it")
    if not (folder / WEIGHTS).is_file():
        raise FileNotFoundError(f"hf-hub:{repo_id} has no {WEIGHTS}")
    if not (folder / CONFIG).is_file():
        raise FileNotFoundError(f"hf-hub:{repo_id} has no {CONFIG}; it is not a zoo release folder")
    return folder


