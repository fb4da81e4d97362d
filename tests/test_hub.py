"""The Hub, against a real Hub-compatible server on loopback (olah serving local git repositories).

huggingface_hub is the official client; nothing here is mocked on the download side. olah
has no write endpoints, so `zoo push` is exercised up to its huggingface_hub calls, and
what it would upload is committed into olah's mirror and loaded back.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

import zoo
from zoo.models.hub import validate_repo_id
from zoo.release.push import push

olah = pytest.importorskip("olah", reason="the Hub tests need olah (pip install -e '.[dev]')")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def publish(mirror: Path, repo_id: str, files: dict[str, Path | bytes], message: str = "upload",
            tag: str | None = None, clean: bool = False, branch: str | None = None) -> str:
    """Commit `files` (name -> source file or bytes) into the mirror's git repository; returns the sha."""
    repo = mirror / "models" / repo_id
    git = ["git", "-C", str(repo), "-c", "user.name=zoo", "-c", "user.email=zoo@localhost"]
    if not repo.exists():
        repo.mkdir(parents=True)
        subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    if branch:
        subprocess.run([*git, "checkout", "-q", "-B", branch], check=True)
    if clean:
        for old in repo.iterdir():
            if old.name != ".git":
                old.unlink()
    for name, source in files.items():
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        (repo / name).write_bytes(data)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", message], check=True)
    if tag:
        subprocess.run([*git, "tag", tag], check=True)
    sha = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    if branch:
        subprocess.run([*git, "checkout", "-q", "main"], check=True)
    return sha


def release_files(folder: Path) -> dict[str, Path]:
    return {p.name: p for p in folder.iterdir()}


@pytest.fixture(scope="session")
def hub(tmp_path_factory):
    """An olah server in offline mode over a mirror folder; huggingface_hub pointed at it."""
    root = tmp_path_factory.mktemp("olah")
    mirror, port = root / "mirrors", _free_port()
    mirror.mkdir()
    model = zoo.create("micro-vit-tiny", num_classes=3, label_names=["a", "b", "c"]).eval()
    first = model.save_pretrained(root / "first")
    publish(mirror, "zoo-test/ready", release_files(first))
    config = root / "olah.toml"
    config.write_text(
        f'[basic]\nhost = "127.0.0.1"\nport = {port}\nrepos-path = "{root / "repos"}"\n'
        f'mirrors-path = ["{mirror}"]\nhf-scheme = "http"\nhf-netloc = "127.0.0.1:{_free_port()}"\n'
        f'hf-lfs-netloc = "127.0.0.1:{_free_port()}"\n[accessibility]\noffline = true\n')
    log = open(root / "olah.log", "w")
    server = subprocess.Popen([sys.executable, "-c", "from olah.server import cli; cli()", "-c", str(config)],
                              stdout=log, stderr=subprocess.STDOUT, cwd=root)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{endpoint}/api/models/zoo-test/ready/revision/main", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if server.poll() is not None or time.time() > deadline:
            server.kill()
            pytest.fail(f"olah did not start: {(root / 'olah.log').read_text()[-2000:]}")
        time.sleep(0.3)
    import huggingface_hub.constants as constants

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_ENDPOINT", endpoint)
        mp.setattr(constants, "ENDPOINT", endpoint)
        mp.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        mp.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        yield {"endpoint": endpoint, "mirror": mirror, "root": root, "model": model}
    server.terminate()
    server.wait(10)
    log.close()


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_load_from_hub_is_bit_exact(hub, tmp_path):
    loaded = zoo.load("hf-hub:zoo-test/ready", cache_dir=tmp_path)
    assert not loaded.training and same_weights(loaded, hub["model"])
    assert loaded.config["label_names"] == ["a", "b", "c"]
    # huggingface_hub's cache layout, so every other HF tool sees the same files
    assert list(tmp_path.glob("models--zoo-test--ready/snapshots/*/model.safetensors"))


def test_revisions_and_offline_warm_cache(hub, tmp_path):
    m1 = zoo.create("fused-1d-tiny").eval()
    sha1 = publish(hub["mirror"], "zoo-test/revs", release_files(m1.save_pretrained(tmp_path / "v1")), tag="v1")
    m2 = zoo.create("fused-1d-tiny").eval()
    sha2 = publish(hub["mirror"], "zoo-test/revs", release_files(m2.save_pretrained(tmp_path / "v2")))
    assert sha1 != sha2 and not same_weights(m1, m2)
    cache = tmp_path / "cache"
    assert same_weights(zoo.load("hf-hub:zoo-test/revs", cache_dir=cache), m2)
    assert same_weights(zoo.load(f"hf-hub:zoo-test/revs@{sha1}", cache_dir=cache), m1)
    assert same_weights(zoo.load("hf-hub:zoo-test/revs@v1", cache_dir=cache), m1)
    # the warm cache alone: in-process, and in a fresh process with the network cut off
    assert same_weights(zoo.load("hf-hub:zoo-test/revs", cache_dir=cache, local_files_only=True), m2)
    torch.save(m2.state_dict(), tmp_path / "expected.pt")
    code = ("import sys, torch, zoo; m = zoo.load('hf-hub:zoo-test/revs', cache_dir=sys.argv[1]); "
            "e = torch.load(sys.argv[2]); print(all(torch.equal(v, e[k]) for k, v in m.state_dict().items()))")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": f"http://127.0.0.1:{_free_port()}"}
    out = subprocess.run([sys.executable, "-c", code, str(cache), str(tmp_path / "expected.pt")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-2000:]


def test_missing_repository_and_files(hub, tmp_path):
    with pytest.raises(FileNotFoundError, match="hf-hub:zoo-test/nothing-here"):
        zoo.load("hf-hub:zoo-test/nothing-here", cache_dir=tmp_path)
    folder = zoo.create("fused-1d-tiny").save_pretrained(tmp_path / "f")
    publish(hub["mirror"], "zoo-test/no-weights", {"config.json": folder / "config.json"})
    with pytest.raises(FileNotFoundError, match="has no model.safetensors"):
        zoo.load("hf-hub:zoo-test/no-weights", cache_dir=tmp_path)
    publish(hub["mirror"], "zoo-test/pickled", {"config.json": folder / "config.json",
                                                "pytorch_model.bin": b"not to be unpickled"})
    with pytest.raises(FileNotFoundError, match=r"pickle weights \(pytorch_model.bin\), which zoo never loads"):
        zoo.load("hf-hub:zoo-test/pickled", cache_dir=tmp_path)
    # only JSON and safetensors came off the network
    fetched = {p.name for p in tmp_path.glob("models--*/snapshots/*/*")}
    assert fetched <= {"config.json", "model.safetensors", "README.md"}
    publish(hub["mirror"], "zoo-test/wrong-config", {"config.json": b'{"format_version": 1, "class": "Nope"}',
                                                     "model.safetensors": folder / "model.safetensors"})
    with pytest.raises(ValueError, match="config.json: class 'Nope' is not a registered architecture"):
        zoo.load("hf-hub:zoo-test/wrong-config", cache_dir=tmp_path)


def test_timm_create_model_from_hub(hub, tmp_path):
    import timm

    model = timm.create_model("hf-hub:zoo-test/ready", pretrained=True, cache_dir=tmp_path)
    assert same_weights(model, hub["model"])
    x = torch.randn(2, 1, 28, 28)
    assert torch.equal(model.eval()(x), hub["model"](x))
    # timm's own reading of our config.json: the architecture, the classes, the preprocessing
    cfg = timm.data.resolve_data_config({}, model=model)
    want = hub["model"].data_cfg()
    assert cfg["input_size"] == (1, 28, 28) == want["input_size"]
    # the model's own normalization, not timm's ImageNet defaults (0.485, 0.456, 0.406)
    assert tuple(cfg["mean"]) == tuple(want["mean"]) and tuple(cfg["std"]) == tuple(want["std"])
    assert cfg["crop_pct"] == want["crop_pct"] and cfg["interpolation"] == want["interpolation"]
    assert model.pretrained_cfg["num_classes"] == want["num_classes"]
    retarget = timm.create_model("hf-hub:zoo-test/ready", pretrained=True, num_classes=5, cache_dir=tmp_path)
    assert retarget.num_classes == 5 and torch.equal(retarget.patch_embed.weight, model.patch_embed.weight)


class RecordingApi:
    """Stands in for huggingface_hub.HfApi where olah has no endpoint; commits what it is given."""

    def __init__(self, mirror: Path):
        self.mirror, self.calls = mirror, []

    def create_repo(self, repo_id, **kw):
        self.calls.append(("create_repo", repo_id, kw))

    def create_branch(self, repo_id, **kw):
        self.calls.append(("create_branch", repo_id, kw))

    def upload_folder(self, repo_id, folder_path, allow_patterns, **kw):
        self.calls.append(("upload_folder", repo_id, sorted(allow_patterns), kw))
        files = {name: Path(folder_path) / name for name in allow_patterns}
        self.uploaded = {name: path.read_bytes() for name, path in files.items()}
        return publish(self.mirror, repo_id, files, message=kw["commit_message"], clean=True,
                       branch=kw.get("revision"))


def test_push_uploads_the_release_and_it_loads_back(hub, tmp_path):
    model = zoo.create("fused-2d-tiny").eval()
    folder = model.save_pretrained(tmp_path / "fused-2d-tiny.mine")
    (folder / "stray.pt").write_bytes(b"a pickle that must never travel")
    api = RecordingApi(hub["mirror"])
    push(folder, "zoo-test/pushed", private=True, api=api)
    assert api.calls[0] == ("create_repo", "zoo-test/pushed", {"private": True, "exist_ok": True,
                                                               "repo_type": "model"})
    assert api.calls[1][:3] == ("upload_folder", "zoo-test/pushed", ["README.md", "config.json", "model.safetensors"])
    assert api.uploaded["README.md"].decode().startswith("---\nlibrary_name: zoo\n")
    assert json.loads(api.uploaded["config.json"])["model_name"] == "fused-2d-tiny"
    assert same_weights(zoo.load("hf-hub:zoo-test/pushed", cache_dir=tmp_path / "cache"), model)
    api = RecordingApi(hub["mirror"])
    other = zoo.create("fused-2d-tiny").eval()
    push(other.save_pretrained(tmp_path / "other"), "zoo-test/pushed", revision="experiment", api=api)
    assert api.calls[1] == ("create_branch", "zoo-test/pushed", {"branch": "experiment", "exist_ok": True,
                                                                 "repo_type": "model"})
    assert api.calls[2][3]["revision"] == "experiment"
    assert same_weights(zoo.load("hf-hub:zoo-test/pushed@experiment", cache_dir=tmp_path / "cache"), other)
    assert same_weights(zoo.load("hf-hub:zoo-test/pushed", cache_dir=tmp_path / "cache"), model)


@pytest.mark.parametrize("repo_id", ["../etc", "org/../../x", "org", "org/name/extra", "/abs/path", "org/na me", ""])
def test_repository_ids_are_validated(repo_id, tmp_path):
    with pytest.raises(ValueError, match="expected a Hub repository id like 'org/name'"):
        validate_repo_id(repo_id)
    with pytest.raises(ValueError, match="expected a Hub repository id"):
        zoo.load(f"hf-hub:{repo_id}", cache_dir=tmp_path)


def test_push_cli_never_prints_the_token(tmp_path):
    folder = zoo.create("fused-1d-tiny").save_pretrained(tmp_path / "m")
    secret = "hf_" + "x" * 34
    dead = f"http://127.0.0.1:{_free_port()}"
    env = {**os.environ, "HF_TOKEN": secret, "HF_ENDPOINT": dead, "HF_HUB_DISABLE_TELEMETRY": "1"}
    out = subprocess.run([sys.executable, "-m", "zoo.cli", "push", str(folder), "--repo", "zoo-test/x"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0  # nothing listens there
    assert secret not in out.stdout + out.stderr
    assert not any(secret in p.read_text(errors="ignore") for p in tmp_path.rglob("*") if p.is_file())


@pytest.mark.skipif(not (os.environ.get("HF_TOKEN") and os.environ.get("ZOO_HUB_TEST_REPO")),
                    reason="a real upload needs HF_TOKEN and ZOO_HUB_TEST_REPO (a repository you may write to)")
def test_real_upload_round_trip(tmp_path):
    repo = os.environ["ZOO_HUB_TEST_REPO"]
    model = zoo.create("fused-1d-tiny").eval()
    code = "import sys; from zoo.models.hub import push; print(push(sys.argv[1], sys.argv[2]))"
    env = {k: v for k, v in os.environ.items() if k != "HF_ENDPOINT"}
    subprocess.run([sys.executable, "-c", code, str(model.save_pretrained(tmp_path / "m")), repo], env=env,
                   check=True, timeout=600)
    out = subprocess.run([sys.executable, "-c", f"import zoo; zoo.load('hf-hub:{repo}', cache_dir=r'{tmp_path}')"],
                         env=env, timeout=600)
    assert out.returncode == 0
    shutil.rmtree(tmp_path, ignore_errors=True)
