"""Nothing from outside runs code or writes outside its place (issue 21; docs/robustness.md, "Code execution").

Every test here hands zoo a hostile or broken source: a checkpoint whose pickle would run a
command (over HTTP and on disk), a fake Hub on loopback that answers with a path for a commit,
with `{}`, with garbage, a redirect loop, a short body, or not at all, and timm arguments that
would fetch pickles. Each asserts the one-line error (no newline, no chained traceback), its
type, and that nothing was executed, downloaded or written where it should not be.
"""

import http.server
import json
import os
import struct
import threading
import time

import pytest
import torch

import zoo
from zoo.cli import main
from zoo.training.checkpoint_io import read_checkpoint

QUICKSTART = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
              "--trainer.precision", "32-true", "--trainer.enable_progress_bar", "false"]


def one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text and "Traceback" not in text, text
    return text


class Marker:
    """Unpickling this creates `path` (builtins.open in write mode): the file appears iff the pickle ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def serve(handler_class):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


class Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass


# ---- 1. checkpoints are read weights-only, never from a URL ------------------------------------


@pytest.fixture
def fit_args(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))  # where torch.hub would cache a URL
    config = os.path.join(os.path.dirname(__file__), "..", "recipes", "quickstart.yaml")
    return ["fit", "--config", config, *QUICKSTART, "--trainer.default_root_dir", str(tmp_path / "runs"),
            "--export.dirpath", str(tmp_path / "export")]


def test_a_checkpoint_url_is_refused_before_it_is_fetched(fit_args, tmp_path):
    marker = tmp_path / "executed"
    evil = tmp_path / "served" / "evil.ckpt"
    evil.parent.mkdir()
    torch.save({"state_dict": {}, "payload": Marker(marker)}, evil)
    requests = []

    class Handler(Quiet):
        def do_GET(self):
            requests.append(self.path)
            body = evil.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server, url = serve(Handler)
    try:
        with pytest.raises((ValueError, SystemExit)) as err:
            main([*fit_args, "--ckpt_path", f"{url}/evil.ckpt"])
    finally:
        server.shutdown()
    assert "does not read checkpoints from URLs" in one_line(err.value)
    assert "download it yourself" in str(err.value)
    assert requests == [] and not marker.exists()
    assert not (tmp_path / "torch-home").exists()  # nothing cached to be unpickled by the next run
    with pytest.raises(ValueError, match="from URLs"):  # the route itself, whatever the CLI makes of it
        read_checkpoint(f"{url}/evil.ckpt")


@pytest.mark.parametrize("kind", ["pickle", "text", "empty", "list"])
def test_a_local_checkpoint_that_is_not_one_is_refused_in_one_line(fit_args, tmp_path, kind):
    marker = tmp_path / "executed"
    path = tmp_path / f"{kind}.ckpt"
    if kind == "pickle":
        torch.save({"state_dict": {}, "hyper_parameters": {"model_name": "micro-vit-tiny"},
                    "payload": Marker(marker)}, path)
    elif kind == "list":
        torch.save([1, 2, 3], path)
    else:
        path.write_text("not a checkpoint\n" if kind == "text" else "")
    expected = {"pickle": "not a checkpoint zoo can read safely: .*would call io.open",
                "text": "is not a PyTorch checkpoint", "empty": "is not a PyTorch checkpoint",
                "list": "not a Lightning checkpoint: it holds a list"}[kind]
    with pytest.raises(ValueError, match=expected) as err:
        read_checkpoint(path)
    one_line(err.value)
    for argv in ([*fit_args, "--ckpt_path", str(path)], ["export", str(path), str(tmp_path / "out")],
                 ["push", str(path), "--repo", "org/name"]):
        with pytest.raises((ValueError, SystemExit)) as err:
            main(argv)
        assert str(path) in one_line(err.value), argv
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_checkpoint_zoo_wrote_still_resumes(fit_args, tmp_path):
    from zoo.training.precision import Trainer

    main(fit_args)
    last = next((tmp_path / "runs").rglob("last.ckpt"))
    assert read_checkpoint(last)["global_step"] == 2
    main([*fit_args, "--trainer.max_epochs", "2", "--ckpt_path", "last"])
    assert read_checkpoint(last)["global_step"] == 4  # resumed at step 2, not started over
    assert type(Trainer(logger=False).strategy.checkpoint_io).__name__ == "SafeCheckpointIO"


# ---- 2, 5 and 6. what the Hub answers is checked before anything is written --------------------

SHA = "0123456789abcdef0123456789abcdef01234567"


def release_bytes(tmp_path, name: str = "fused-1d-tiny") -> dict[str, bytes]:
    folder = zoo.create(name).save_pretrained(tmp_path / "release")
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def safetensors_header(tensors: dict[str, tuple[str, list[int]]]) -> bytes:
    """A safetensors file's length and header only (the data is never served): name -> (dtype, shape)."""
    size = {"F32": 4, "I8": 1}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        end = offset + size[dtype] * int(torch.tensor(shape).prod())
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    """A Hub on loopback serving `hub["files"]` at commit `hub["sha"]`, or misbehaving as `hub["mode"]` says;
    it records every request (method, path, Range)."""
    import huggingface_hub.constants as constants

    import zoo.models.hub

    hub = {"sha": SHA, "files": {}, "mode": "hub", "requests": []}

    class Handler(Quiet):
        def answer(self, body: bytes, status: int = 200, headers: dict | None = None):
            self.send_response(status)
            for key, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self):
            hub["requests"].append((self.command, self.path, self.headers.get("Range")))
            mode = hub["mode"]
            if mode == "silent":
                time.sleep(20)  # far longer than the timeout: a call that waited it out would show
                return
            if mode == "empty":
                return self.answer(b"{}", headers={"Content-Type": "application/json"})
            if mode == "garbage":
                return self.answer(bytes(range(256)) * 4)
            if mode == "loop":
                return self.answer(b"", 302, {"Location": self.path})
            if mode == "short":
                self.send_response(200)
                self.send_header("Content-Length", "100000")
                self.end_headers()
                self.wfile.write(b'{"sha": "')
                return
            if self.path.startswith("/api/models/") and "/tree/" in self.path:  # what snapshot_download lists
                tree = [{"type": "file", "path": name, "size": len(body), "oid": "0" * 40}
                        for name, body in hub["files"].items()]
                return self.answer(json.dumps(tree).encode(), headers={"Content-Type": "application/json"})
            if self.path.startswith("/api/models/"):
                siblings = [{"rfilename": name} for name in hub["files"]]
                return self.answer(json.dumps({"id": "org/repo", "sha": hub["sha"], "siblings": siblings}).encode(),
                                   headers={"Content-Type": "application/json"})
            name = self.path.rsplit("/", 1)[-1]
            if name not in hub["files"]:
                return self.answer(b"", 404, {"X-Error-Code": "EntryNotFound"})
            body = hub["files"][name]
            etag = hub.get("etag", f"abc123-{name}")
            commit = hub.get("file_sha", hub["sha"])
            if "branch_sha" in hub and f"/resolve/{hub['sha']}/" not in self.path:  # asked by a branch's name
                commit = hub["branch_sha"]
            status, headers = 200, {"X-Repo-Commit": commit, "ETag": f'"{etag}"'}
            if self.headers.get("Range"):  # bytes=A-B
                first, last = map(int, self.headers["Range"].removeprefix("bytes=").split("-"))
                body, status = body[first:last + 1], 206
            self.answer(body, status, headers)

        do_HEAD = do_GET

    server, endpoint = serve(Handler)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(zoo.models.hub, "TIMEOUT", 0.5)
    hub["endpoint"] = endpoint
    yield hub
    server.shutdown()


def written(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_a_fake_hub_serves_a_release(fake_hub, tmp_path):
    """The fake Hub is a Hub: a release it serves loads, weights equal to the saved ones (the tests below change
    one thing each)."""
    fake_hub["files"] = release_bytes(tmp_path)
    model = zoo.load("hf-hub:org/repo", cache_dir=tmp_path / "cache")
    saved = zoo.load(tmp_path / "release")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), saved.state_dict().values()))
    assert (tmp_path / "cache" / "models--org--repo" / "snapshots" / SHA / "model.safetensors").is_file()


@pytest.mark.parametrize("sha", ["../../x", "../../../../tmp/x", "main", SHA.upper(), SHA + "\n", ""])
def test_a_commit_id_that_is_a_path_is_refused_before_anything_is_written(fake_hub, tmp_path, sha):
    fake_hub["files"], fake_hub["sha"] = release_bytes(tmp_path), sha
    (tmp_path / "sandbox").mkdir()
    before = written(tmp_path)
    with pytest.raises(ValueError, match="answered the commit id .* not 40 hexadecimal digits") as err:
        zoo.load("hf-hub:org/repo", cache_dir=tmp_path / "sandbox" / "cache")
    one_line(err.value)
    assert written(tmp_path) == before  # nothing in the cache, nothing outside it
    assert not [r for r in fake_hub["requests"] if "/resolve/" in r[1]]  # the description only: no file


def test_files_are_fetched_by_the_checked_commit_never_by_the_branch_name(fake_hub, tmp_path):
    """A Hub that answers a good commit to zoo's question and `../..` when a file is asked for by branch: zoo
    asks for every file by the commit it checked, so the second answer is never asked for, and the branch is
    recorded in the cache for an offline load by name."""
    from zoo.models.hub import download

    fake_hub["files"], fake_hub["branch_sha"] = release_bytes(tmp_path), "../../x"
    model = zoo.load("hf-hub:org/repo", cache_dir=tmp_path / "cache")
    assert type(model).__name__ == zoo.load(tmp_path / "release").__class__.__name__
    fetched = [path for _, path, _ in fake_hub["requests"] if "/resolve/" in path]
    assert fetched and all(f"/resolve/{SHA}/" in path for path in fetched), fetched
    assert (tmp_path / "cache" / "models--org--repo" / "refs" / "main").read_text() == SHA
    folder = download("hf-hub:org/repo", cache_dir=tmp_path / "cache", local_files_only=True)
    assert folder.name == SHA


@pytest.mark.parametrize("answer,expected", [({"file_sha": "f" * 40}, "answered config.json for commit 'f{40}'"),
                                             ({"file_sha": "../../x"}, "for commit '../../x'"),
                                             ({"etag": "../../../escaped"}, "ETag .* not a plain name")])
def test_a_file_answered_for_another_commit_or_with_a_path_for_etag_is_refused(fake_hub, tmp_path, answer, expected):
    fake_hub["files"] = release_bytes(tmp_path)
    fake_hub.update(answer)  # the description is right; the file's own headers are not
    (tmp_path / "sandbox").mkdir()
    before = written(tmp_path)
    with pytest.raises(ValueError, match=expected) as err:
        zoo.load("hf-hub:org/repo", cache_dir=tmp_path / "sandbox" / "cache")
    one_line(err.value)
    assert written(tmp_path) == before


@pytest.mark.parametrize("mode,error,expected", [
    ("empty", ValueError, "answered something that is not a repository's description"),
    ("garbage", ValueError, "answered something that is not a repository's description"),
    ("loop", ConnectionError, "redirects in a loop"),
    ("short", ConnectionError, "broke off its answer"),
    ("silent", TimeoutError, "did not answer within 0.5 s"),
])
def test_a_hub_that_answers_badly_is_named_in_one_line(fake_hub, tmp_path, mode, error, expected):
    fake_hub["mode"] = mode
    started = time.monotonic()
    with pytest.raises(error, match=expected) as err:
        zoo.load("hf-hub:org/repo", cache_dir=tmp_path / "cache", token="hf_secret_token_123")
    assert fake_hub["endpoint"] in one_line(err.value) and "hf_secret" not in str(err.value)
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert time.monotonic() - started < 10  # a silent Hub is left after the timeout, not waited for
    assert not (tmp_path / "cache").exists() or written(tmp_path / "cache") == []


def test_nothing_listening_is_one_line(monkeypatch, tmp_path):
    import socket

    import huggingface_hub.constants as constants

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens on it
        s.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    with pytest.raises(ConnectionError, match=f"the Hub at {endpoint} cannot be reached") as err:
        zoo.load("hf-hub:org/repo", cache_dir=tmp_path / "cache")
    one_line(err.value)
    from zoo.release.push import check_hub

    with pytest.raises(ConnectionError, match="cannot be reached"):
        check_hub(what="export.push_to")


def test_long_ids_are_cut_and_a_cache_dir_that_is_a_file_is_refused(tmp_path):
    long = "org/" + "a" * 10_000
    with pytest.raises(ValueError) as err:
        zoo.load(f"hf-hub:{long}", cache_dir=tmp_path)
    assert len(one_line(err.value)) < 300 and "(10004 characters)" in str(err.value)
    with pytest.raises(ValueError, match="characters\\)"):
        zoo.load(f"hf-hub:org/repo@{'r' * 5000}/", cache_dir=tmp_path)
    cache = tmp_path / "cache"
    cache.write_text("a file")
    with pytest.raises(NotADirectoryError, match="cache_dir .* is a file") as err:
        zoo.load("hf-hub:org/repo", cache_dir=cache)
    one_line(err.value)
    assert cache.read_text() == "a file"


def test_push_refused_by_the_hub_is_one_line_before_any_export(fake_hub, tmp_path, monkeypatch):
    fake_hub["mode"] = "empty"

    class Refusing(Quiet):
        def do_GET(self):
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": "Invalid credentials in Authorization header"}')

        do_POST = do_HEAD = do_GET

    import huggingface_hub.constants as constants

    server, endpoint = serve(Refusing)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    folder = zoo.create("fused-1d-tiny").save_pretrained(tmp_path / "release")
    try:
        with pytest.raises(SystemExit) as err:
            main(["push", str(folder), "--repo", "org/name"])
    finally:
        server.shutdown()
    assert one_line(err.value).startswith("zoo push: error: hf-hub:org/name: the Hub at")
    assert "refused access (401)" in str(err.value)


# ---- 6. a weights file's header is checked before the weights are fetched ----------------------


@pytest.mark.parametrize("header,expected", [
    ({"big": ("F32", [100_000_000])}, "holds 100,000,000 values, but the model .* has [0-9,]+ parameters"),
    ({"norm.weight": ("I8", [16])}, "stores tensor 'norm.weight' as I8"),
])
def test_weights_are_checked_by_their_header_before_they_are_downloaded(fake_hub, tmp_path, header, expected):
    files = release_bytes(tmp_path)
    files["model.safetensors"] = safetensors_header(header)  # the 400 MB body is never there to be sent
    fake_hub["files"] = files
    with pytest.raises(ValueError, match=expected) as err:
        zoo.load("hf-hub:org/repo", cache_dir=tmp_path / "cache")
    one_line(err.value)
    weights = [r for r in fake_hub["requests"] if r[1].endswith("/model.safetensors")]
    assert weights and all(r[0] == "GET" and r[2] for r in weights)  # only range requests for the header
    assert not list((tmp_path / "cache").rglob("model.safetensors"))


def test_the_config_is_held_to_max_parameters_before_the_weights_come(fake_hub, tmp_path):
    fake_hub["files"] = release_bytes(tmp_path)
    with pytest.raises(ValueError, match="more than the limit of 1,000") as err:
        zoo.load("hf-hub:org/repo", cache_dir=tmp_path / "cache", max_parameters=1000)
    one_line(err.value)
    assert not [r for r in fake_hub["requests"] if r[1].endswith("/model.safetensors")]


# ---- 3 and 4. timm: only safetensors off the network, finite weights, whole-number indices -----


def test_timm_checkpoint_path_takes_finite_safetensors_only(tmp_path):
    import timm
    from safetensors.torch import save_file

    model = timm.create_model("fused_2d_tiny")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    name = next(iter(state))
    marker = tmp_path / "executed"
    torch.save({"state_dict": state, "payload": Marker(marker)}, tmp_path / "weights.pth")
    with pytest.raises(ValueError, match="checkpoint_path .*weights.pth is not a .safetensors file") as err:
        timm.create_model("fused_2d_tiny", checkpoint_path=str(tmp_path / "weights.pth"))
    one_line(err.value)
    assert not marker.exists()
    state[name][0] = float("nan")
    save_file(state, tmp_path / "nan.safetensors")
    with pytest.raises(ValueError, match=f"tensor '{name}' holds NaN") as err:
        timm.create_model("fused_2d_tiny", checkpoint_path=str(tmp_path / "nan.safetensors"))
    one_line(err.value)
    state[name][0] = 0.25
    save_file(state, tmp_path / "good.safetensors")
    loaded = timm.create_model("fused_2d_tiny", checkpoint_path=str(tmp_path / "good.safetensors"))
    assert loaded.state_dict()[name].flatten()[0] == 0.25  # the route still loads what it should


def test_timm_never_fetches_a_pickle(tmp_path, fake_hub):
    import timm

    overlay = {"file": None, "url": f"{fake_hub['endpoint']}/weights.pth"}
    with pytest.raises(ValueError, match="only as safetensors, got url=") as err:
        timm.create_model("fused_2d_tiny", pretrained=True, pretrained_cfg_overlay=overlay)
    one_line(err.value)
    assert fake_hub["requests"] == []
    # an hf_hub_id goes through zoo.models.hub, whose checks apply: a commit id that is a path is refused first
    fake_hub["files"], fake_hub["sha"] = release_bytes(tmp_path, "fused-2d-tiny"), "../../x"
    with pytest.raises(ValueError, match="not 40 hexadecimal digits"):
        timm.create_model("fused_2d_tiny", pretrained=True, cache_dir=tmp_path / "cache",
                          pretrained_cfg_overlay={"file": None, "hf_hub_id": "org/repo"})
    assert not [r for r in fake_hub["requests"] if "/resolve/" in r[1]]  # no file was asked for
    fake_hub["sha"] = SHA  # and a good one loads the release's weights
    model = timm.create_model("fused_2d_tiny", pretrained=True, cache_dir=tmp_path / "cache",
                              pretrained_cfg_overlay={"file": None, "hf_hub_id": "org/repo"})
    saved = zoo.load(tmp_path / "release")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.state_dict().items())


@pytest.mark.parametrize("value", [0.5, 1.7, "1", True, [1, 0.5], None])
def test_timm_indices_are_whole_numbers(value):
    import timm

    if value is not None:
        with pytest.raises(TypeError, match="out_indices must be an int or a sequence of ints") as err:
            timm.create_model("micro_vit_tiny", features_only=True, out_indices=value)
        one_line(err.value)
    model = timm.create_model("micro_vit_tiny")
    x = torch.randn(1, *model.pretrained_cfg["input_size"])
    if value is None:  # the same picks by int and by list, as timm's convention says: the last n blocks
        depth = len(model.feature_info)
        by_count = model.forward_intermediates(x, indices=2, intermediates_only=True)
        by_list = model.forward_intermediates(x, indices=[depth - 2, depth - 1], intermediates_only=True)
        assert all(torch.equal(a, b) for a, b in zip(by_count, by_list))
        return
    with pytest.raises(TypeError, match="indices must be an int or a sequence of ints") as err:
        model.forward_intermediates(x, indices=value)
    one_line(err.value)


# ---- 7. a push after training is checked before training ---------------------------------------


def test_push_to_an_unreachable_hub_fails_in_setup_before_training(fit_args, tmp_path, monkeypatch):
    import socket

    import huggingface_hub.constants as constants

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    with pytest.raises((ConnectionError, SystemExit)) as err:
        main([*fit_args, "--export.push_to", "org/name"])
    assert f"export.push_to org/name: the Hub at {endpoint} cannot be reached" in one_line(err.value)
    assert not list((tmp_path / "runs").rglob("*.ckpt")) and not (tmp_path / "export").exists()  # never trained


@pytest.mark.parametrize("make", [
    lambda folder: folder.mkdir(),  # an empty folder
    lambda folder: (folder.mkdir(), (folder / "config.json").write_text("{}"),
                    (folder / "model.safetensors").write_bytes(b"")),  # files of those names, no release
])
def test_push_of_a_folder_that_is_no_release_never_asks_the_hub(make, tmp_path, monkeypatch):
    """Refused from the folder alone, in one line: the Hub is not asked (the check would fail the test)."""
    import zoo.release.push as push_module

    def asked(*args, **kwargs):
        raise AssertionError("the Hub was asked before the folder was checked")

    monkeypatch.setattr(push_module, "check_hub", asked)
    make(tmp_path / "not-a-release")
    with pytest.raises(SystemExit) as err:
        main(["push", str(tmp_path / "not-a-release"), "--repo", "org/name"])
    assert one_line(err.value).startswith("zoo push: error: ")
