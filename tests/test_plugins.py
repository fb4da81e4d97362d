"""Your own architecture in zoo (issue 25): a registered subclass saves and loads like ours; a release folder of a
class that is not registered is refused naming the module to import; an installed package declares its
architectures under the `zoo.models` entry point and `zoo.load` imports it on first need. Each case runs in
a fresh interpreter, so that what one registers cannot leak into another."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# a user's package: a ViT subclass with an argument of its own and **kwargs passed on
PLUGIN = textwrap.dedent('''
    import torch
    from zoo.models import ImageTransformer
    from zoo.models.registry import register

    class ScaledViT(ImageTransformer):
        def __init__(self, scale: float = 1.0, **kwargs):
            super().__init__(**kwargs)
            self.scale = scale
            self.config = {**self.config, "scale": scale}

        def forward(self, x):
            return super().forward(x) * self.scale

    register("scaled-vit-tiny", "image", ScaledViT, scale=2.0, img_size=28, patch_size=7, in_chans=1,
             num_classes=10, embed_dim=32, depth=1, num_heads=2)
''')


def run(code: str, site, extra_path: str | None = None) -> subprocess.CompletedProcess:
    path = [str(site)] + ([extra_path] if extra_path else [])
    env_code = f"import sys; sys.path[:0] = {path!r}\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", env_code], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The user's package on a path of its own, and a release folder of its model saved in a fresh interpreter
    (one save serves every test: each loads it in an interpreter of its own)."""
    site = tmp_path_factory.mktemp("plugin") / "site"  # its release beside it, in site.parent
    (site / "userzoo").mkdir(parents=True)
    (site / "userzoo" / "__init__.py").write_text("")
    (site / "userzoo" / "models.py").write_text(PLUGIN)
    saved = run(f'''
        import zoo, userzoo.models
        zoo.create("scaled-vit-tiny").save_pretrained({str(site.parent / "release")!r})
    ''', site)
    assert saved.returncode == 0, saved.stderr[-2000:]
    return site


def test_a_registered_subclass_round_trips_through_a_release_folder(site):
    done = run(f'''
        import torch, zoo, userzoo.models
        from safetensors.torch import load_file
        again = zoo.load({str(site.parent / "release")!r})
        assert type(again).__name__ == "ScaledViT" and again.scale == 2.0, again
        plain = zoo.models.ImageTransformer(**{{k: v for k, v in again.config.items() if k != "scale"}})
        plain.load_state_dict(load_file({str(site.parent / "release" / "model.safetensors")!r}))
        # the subclass's own argument took effect: twice the plain ViT's logits (an independent reference)
        x = torch.rand(2, 1, 28, 28)
        torch.testing.assert_close(again(x), 2 * plain.eval()(x))
        print("ok")
    ''', site)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_an_unregistered_class_is_refused_naming_its_module(site):
    loaded = run(f'''
        import sys, zoo
        try:
            zoo.load({str(site.parent / "release")!r})
        finally:  # the module was not imported for the message: zoo never imports a module that a config names
            print("userzoo.models" in sys.modules)
    ''', site)
    assert loaded.returncode != 0 and loaded.stdout.strip() == "False", loaded.stderr[-2000:]
    last = loaded.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: ") and "class 'ScaledViT' is not a registered architecture" in last
    assert "saved from the module 'userzoo.models': import it before zoo.load" in last


def test_an_entry_point_registers_on_first_need(site, tmp_path):
    # an installed distribution's metadata, as pip writes it, declaring the plugin module, on a path of this test's
    # own (the other tests load without it)
    dist = tmp_path / "userzoo-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: userzoo\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[zoo.models]\nuserzoo = userzoo.models\n")
    loaded = run(f'''
        import sys, zoo
        model = zoo.load({str(site.parent / "release")!r})
        print(type(model).__name__, "userzoo.models" in sys.modules)
    ''', site, extra_path=str(tmp_path))
    assert loaded.returncode == 0 and loaded.stdout.strip() == "ScaledViT True", loaded.stderr[-2000:]


def test_two_architectures_cannot_share_a_class_name():
    from torch import nn

    from zoo.models.registry import register

    class ImageTransformer(nn.Module):  # not zoo's, but named as it is
        pass

    with pytest.raises(ValueError, match="another class named ImageTransformer .* is registered"):
        register("impostor-vit", "image", ImageTransformer)
    with pytest.raises(ValueError, match=r"family must be one of \['image', 'fused', 'text'\], got 'audio'"):
        register("audio-net", "audio", nn.Linear)


def test_a_plugin_that_fails_to_import_is_named_and_the_others_still_load(site, tmp_path):
    """An installed plugin whose import raises breaks nothing else: a warning names it, and the folder of a
    class another plugin registers still loads."""
    for name, module in (("broken", "brokenzoo"), ("userzoo", "userzoo.models")):
        dist = tmp_path / f"{name}-1.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        (dist / "entry_points.txt").write_text(f"[zoo.models]\n{name} = {module}\n")
    (tmp_path / "brokenzoo.py").write_text("raise RuntimeError('this plugin is broken')\n")
    loaded = run(f'''
        import warnings, zoo
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = zoo.load({str(site.parent / "release")!r})
        print(type(model).__name__)
        print([str(w.message) for w in caught if "plugin" in str(w.message)])
    ''', site, extra_path=str(tmp_path))
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    name, said = loaded.stdout.strip().splitlines()
    assert name == "ScaledViT"
    assert "plugin 'broken' (brokenzoo, from broken) failed to import" in said and "this plugin is broken" in said


@pytest.mark.parametrize("name", ["probe.net", "org/model", "hf-hub:x", "", "-leading", "a b"])
def test_a_name_that_would_be_read_as_something_else_is_refused(name):
    from torch import nn

    from zoo.models.registry import register

    with pytest.raises(ValueError, match="a model name is letters, digits"):
        register(name, "image", nn.Linear)
