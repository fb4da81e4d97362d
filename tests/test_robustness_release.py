"""Safe at the boundaries of issue 21 (docs/robustness.md): configs, weights files, data modules, viz and report inputs.

Every test here feeds zoo a bad file or setting, made in tmp_path, and asserts one of two
outcomes: the right answer (checked against an independent reference), or a ValueError /
TypeError / OSError in one line whose message names what to change, raised before the work
(no tensor data, image pixels or array values read, nothing trained or drawn).
"""

import json
import struct
import zlib

import numpy as np
import pytest
import torch

import zoo
from zoo.cli import main

GIB = 1 << 30


@pytest.fixture
def release(tmp_path):
    return zoo.create("gpt-tiny", depth=1).save_pretrained(tmp_path / "m")


def one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message and error.value.__cause__ is None, message
    return message


# ---- configs ------------------------------------------------------------------------------------


def test_a_deeply_nested_config_is_refused_in_one_line(release):
    config = release / "config.json"
    config.write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(ValueError, match="config.json nests its JSON too deeply") as err:
        zoo.load(release)
    one_line(err)
    nested = 1
    for _ in range(35):
        nested = [nested]
    config.write_text(json.dumps({"format_version": 1, "x": nested}))
    with pytest.raises(ValueError, match=r"nests its JSON 33 levels deep at x\[0\]"):
        zoo.load(release)
    assert not zoo.models.release_files.is_release_folder(release)


def test_a_5000_digit_integer_in_config_is_refused_naming_the_field(release):
    config = json.loads((release / "config.json").read_text())
    text = json.dumps({**config, "args": {**config["args"], "embed_dim": 7}}).replace('"embed_dim": 7',
                                                                                      '"embed_dim": ' + "9" * 5000)
    (release / "config.json").write_text(text)
    with pytest.raises(ValueError, match=r"config.json: args.embed_dim is an integer of 5,000 digits; .* at most "
                                         r"100 digits") as err:
        zoo.load(release)
    one_line(err)
    big = json.dumps({**config, "args": {**config["args"], "embed_dim": 10**60}})  # long, but readable: the budget
    (release / "config.json").write_text(big)
    with pytest.raises(ValueError, match="embed_dim must be between 1 and"):
        zoo.load(release)


# ---- weights files ------------------------------------------------------------------------------


def test_100000_unexpected_tensors_are_listed_ten_and_counted(release):
    from safetensors.torch import load_file, save

    weights = release / "model.safetensors"
    data = save(load_file(str(weights)))
    length = int.from_bytes(data[:8], "little")
    header, body = json.loads(data[8:8 + length]), data[8 + length:]
    for i in range(100_000):  # one float each, after the model's own tensors
        start = len(body) + 4 * i
        header[f"extra.{i:06d}"] = {"dtype": "F32", "shape": [1], "data_offsets": [start, start + 4]}
    weights.write_bytes(safetensors_header(header) + body + bytes(400_000))
    with pytest.raises(ValueError) as err:
        zoo.load(release)
    message = str(err.value)
    assert len(message) < 1000, len(message)
    assert "unexpected (100,000): " + "; ".join(f"extra.{i:06d}" for i in range(10)) + "; and 99,990 more" in message


def safetensors_header(tensors: dict) -> bytes:
    """The 8-byte length and the JSON header of a safetensors file (padded to 8 bytes, as safetensors writes it)."""
    header = json.dumps(tensors).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header


def test_a_header_claiming_6_gib_is_refused_from_the_header(release, monkeypatch):
    weights = release / "model.safetensors"
    claimed = {"tok_embed.weight": {"dtype": "F32", "shape": [GIB * 6 // 4], "data_offsets": [0, 6 * GIB]}}
    weights.write_bytes(safetensors_header(claimed) + b"only a few bytes")
    with pytest.raises(ValueError, match=r"truncated or not a safetensors file: its header declares "
                                         r"6,442,450,944 bytes of tensors, the file holds 16 after the header") as err:
        zoo.load(release)
    one_line(err)


def test_a_6_gib_weights_file_is_judged_by_its_header_and_only_fitting_tensors_are_mapped(release, monkeypatch):
    """A sparse file that really holds 6 GiB (of zeros) beyond the model's own tensors: strict loading refuses it from
    the header, without touching the data; strict=False maps only the tensors that fit."""
    from safetensors.torch import load_file, save

    original = {k: v.clone() for k, v in load_file(str(release / "model.safetensors")).items()}  # not the mapped file
    data = save(original)
    length = int.from_bytes(data[:8], "little")
    header, body = json.loads(data[8:8 + length]), data[8 + length:]
    header["huge"] = {"dtype": "F32", "shape": [6 * GIB // 4], "data_offsets": [len(body), len(body) + 6 * GIB]}
    weights = release / "model.safetensors"
    with open(weights, "wb") as f:
        f.write(safetensors_header(header) + body)
        f.truncate(f.tell() + 6 * GIB)  # sparse: no disk, no memory
    monkeypatch.setattr(zoo.models.pretrained, "read_tensors",
                        lambda *a: pytest.fail("tensor data read before the refusal"))
    with pytest.raises(ValueError, match=r"unexpected \(1\): huge") as err:
        zoo.load(release)
    assert "missing" not in str(err.value) and "shape mismatch" not in str(err.value)
    monkeypatch.undo()
    model = zoo.load(release, strict=False)
    loaded = model.state_dict()
    for name, tensor in original.items():
        assert torch.equal(loaded[name], tensor), name


def test_weights_load_bit_for_bit_through_the_mapped_route(tmp_path):
    model = zoo.create("micro-vit-tiny", depth=2)
    folder = model.save_pretrained(tmp_path / "m")
    loaded = zoo.load(folder).state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded[name], tensor), name


def test_header_offsets_that_disagree_with_the_shape_are_refused(release):
    bad = {"norm.weight": {"dtype": "F32", "shape": [64], "data_offsets": [0, 4]}}
    (release / "model.safetensors").write_bytes(safetensors_header(bad) + bytes(4))
    with pytest.raises(ValueError, match=r"tensor 'norm.weight' declares shape \[64\] and data offsets \[0, 4\]"):
        zoo.load(release)


# ---- data modules -------------------------------------------------------------------------------


@pytest.mark.parametrize("fraction", [1.5, 1.0, 0, 0.0, -0.1, True, "0.1", float("nan")])
def test_val_fraction_outside_0_1_is_refused_at_construction(fraction):
    from zoo.data import MNIST, Digits

    for cls in (Digits, MNIST):
        with pytest.raises(ValueError, match=r"val_fraction must be a number strictly between 0 and 1 .* got "):
            cls(val_fraction=fraction)


def test_splits_that_come_out_empty_are_refused_in_setup_with_the_sizes():
    from zoo.data import ArrayClassificationData, Digits

    data = Digits(val_fraction=0.9999)  # 1,438 training samples: all of them would validate
    with pytest.raises(ValueError, match=r"val_fraction=0.9999 of 1,438 training samples leaves 0 to train on"):
        data.setup()

    class NoTest(ArrayClassificationData):
        info = Digits.info

        def load(self, split):
            n = 0 if split == "test" else 20
            return torch.zeros(n, 1, 8, 8), torch.zeros(n, dtype=torch.long)

    with pytest.raises(ValueError, match="gave empty splits: 18 training, 2 validation, 0 test"):
        NoTest().setup()


def test_text_data_refuses_bad_fractions_short_texts_and_non_utf8(tmp_path):
    from zoo.data import CharText

    text = tmp_path / "input.txt"
    text.write_text("to be or not to be " * 20)  # 380 characters
    for fraction in (1.0, 0, 1.5):
        with pytest.raises(ValueError, match="train_fraction must be a number strictly between 0 and 1"):
            CharText(path=str(text), train_fraction=fraction)
    with pytest.raises(ValueError, match=r"gives 342 training and 38 validation tokens .* more than "
                                         r"context_length=64"):
        CharText(path=str(text))
    assert len(CharText(path=str(text), context_length=16).val_tokens) == 38
    text.write_bytes("caf\u00e9".encode("latin-1"))
    with pytest.raises(ValueError, match=r"input.txt is not UTF-8 text: byte 3 is b'\\xe9'") as err:
        CharText(path=str(text))
    one_line(err)


def test_a_missing_data_root_is_one_line_and_nothing_is_created(tmp_path):
    from functools import partial

    from zoo.data import CIFAR10, MNIST, AdrenalMNIST3D, PixelMNIST

    (tmp_path / "empty").mkdir()
    for root in (tmp_path / "absent", tmp_path / "empty"):
        for cls, name in ((MNIST, "MNIST"), (CIFAR10, "CIFAR10"), (partial(PixelMNIST, permute=True), "MNIST")):
            with pytest.raises(FileNotFoundError, match=f"{name} not found under {root} and download=False; set "
                                                        "data.root .* data.download=true") as err:
                cls(root=str(root), download=False).setup()
            one_line(err)
    assert not (tmp_path / "absent").exists() and list((tmp_path / "empty").iterdir()) == []
    with pytest.raises(FileNotFoundError, match="AdrenalMNIST3D not found at .*MedMNIST3D/adrenalmnist3d.npz; "
                                                "download it from MedMNIST") as err:
        AdrenalMNIST3D(root=str(tmp_path / "absent")).setup()
    one_line(err)


# ---- zoo viz inputs -----------------------------------------------------------------------------


def viz(*args):
    main(["viz", *map(str, args)])


def png(width: int, height: int, pixels: bytes = b"") -> bytes:
    """A grayscale PNG whose header claims width x height, holding `pixels` (a bomb's header needs no pixels)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(pixels)) + chunk(b"IEND", b""))


def test_decompression_bombs_are_refused_with_their_size(tmp_path):
    for width, height in ((20_000, 20_000), (100_000, 100_000), (10_000, 10_000)):
        bomb = tmp_path / f"bomb{width}.png"
        bomb.write_bytes(png(width, height))
        with pytest.raises(SystemExit, match=rf"bomb{width}.png is too large to read as an image: Image size "
                                             rf"\({width * height} pixels\) exceeds limit of \d+ pixels") as err:
            viz("vit-tiny.mnist", "--out", tmp_path / "out", "--input", bomb)
        assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_damaged_and_foreign_images_are_one_line(tmp_path):
    from PIL import Image

    from zoo.cli.viz import read_image

    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (28, 28), dtype=np.uint8)).save(tmp_path / "good.png")
    Image.fromarray(rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)).save(tmp_path / "good.jpg")
    good_png, good_jpg = (tmp_path / "good.png").read_bytes(), (tmp_path / "good.jpg").read_bytes()
    assert np.array_equal(np.asarray(read_image(tmp_path / "good.png")), np.asarray(Image.open(tmp_path / "good.png")))
    bad_crc = bytearray(good_png)
    bad_crc[29] ^= 0xFF  # the IHDR chunk's checksum
    files = {"cut.png": good_png[: len(good_png) // 2], "cut.jpg": good_jpg[: len(good_jpg) // 2],
             "crc.png": bytes(bad_crc), "text.png": b"this is text, not an image\n", "empty.png": b"",
             "zero.png": png(0, 0)}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(SystemExit, match=rf"{name} is not a readable image: \w") as err:
            viz("vit-tiny.mnist", "--out", tmp_path / "out", "--input", tmp_path / name)
        assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_npy_inputs_are_checked_on_their_header(tmp_path):
    from zoo.cli.viz import read_npy

    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000000), }"
    header += " " * (-(10 + len(header) + 1) % 64) + "\n"
    (tmp_path / "huge.npy").write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    (tmp_path / "magic.npy").write_bytes(b"hello, this is not numpy")
    np.save(tmp_path / "empty.npy", np.zeros((0, 0), np.float32))
    np.save(tmp_path / "ok.npy", np.arange(28 * 28, dtype=np.float32).reshape(28, 28) / 784)
    (tmp_path / "cut.npy").write_bytes((tmp_path / "ok.npy").read_bytes()[:-5])
    cases = {"huge": r"declares an array of shape \(1000000, 1000000000\) \(1,000,000,000,000,000 values\), more "
                     r"than the 100,000,000",
             "objects": r"holds Python objects \(dtype object\); zoo reads numeric arrays only",
             "magic": r"is not a readable .npy file: the magic string is not correct",
             "empty": r"holds an empty array of shape \(0, 0\)",
             "cut": r"is truncated: its header declares 3,264 bytes, the file holds 3,259"}
    for name, message in cases.items():
        with pytest.raises(SystemExit, match=message) as err:
            viz("vit-tiny.mnist", "--out", tmp_path / "out", "--input", tmp_path / f"{name}.npy")
        assert "\n" not in str(err.value)
    assert np.array_equal(read_npy(tmp_path / "ok.npy"), np.arange(784, dtype=np.float32).reshape(28, 28) / 784)


def test_text_prompts_files_and_their_limits(tmp_path, capsys):
    from zoo.cli.viz import read_input
    from zoo.viz import MAX_TOKENS, pictures

    model = zoo.load("micro-gpt-tiny.shakespeare")
    (tmp_path / "prompt.txt").write_text("ROMEO: to be")
    assert read_input(model, str(tmp_path / "prompt.txt")).tolist() == [model.tokenizer.encode("ROMEO: to be")]
    assert read_input(model, "ROMEO").tolist() == [model.tokenizer.encode("ROMEO")]  # no such file: a prompt
    with pytest.raises(SystemExit, match=r"--input '' is an empty prompt"):
        viz("micro-gpt-tiny.shakespeare", "--out", tmp_path / "out", "--input", "")
    with pytest.raises(SystemExit, match=r"--input prompt.txt: no such file; TextTransformer takes a prompt, a .txt"):
        viz("micro-gpt-tiny.shakespeare", "--out", tmp_path / "out", "--input", "prompt.txt")
    (tmp_path / "latin1.txt").write_bytes("ROMEO: caf\u00e9".encode("latin-1"))
    with pytest.raises(SystemExit, match=r"latin1.txt is not UTF-8 text: byte 10 is b'\\xe9' \("):
        viz("micro-gpt-tiny.shakespeare", "--out", tmp_path / "out", "--input", tmp_path / "latin1.txt")
    assert not (tmp_path / "out").exists()
    long = "ROMEO: to be or not to be. " * 800  # 21,600 characters, one token each
    ids = read_input(model, long)
    assert ids.tolist() == [model.tokenizer.encode(long)[:MAX_TOKENS]] and MAX_TOKENS == 1024
    assert "the prompt has 21,600 tokens; the pictures use its first 1,024" in capsys.readouterr().err
    with pytest.raises(ValueError, match="pictures take prompts of 1 to 1,024 tokens .* got 1,025"):
        pictures(model, torch.zeros(1, MAX_TOKENS + 1, dtype=torch.long))


# ---- zoo report --bench --------------------------------------------------------------------------


def test_report_refuses_foreign_or_malformed_benchmark_files(tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    cases = {"attention.json": ('{"train": [1, 2', r"is not valid JSON \(Expecting .* line 1, column 16\); expected "
                                                  r"a JSON object as a bench/\*.py script writes it"),
             "models.json": ("[1, 2, 3]", "holds a JSON list; expected a JSON object"),
             "deploy.json": ('{"inference": [{"model": "x"}]}', r"does not hold the results of bench/deploy.py \(a "
                                                                   r"row lacks the field 'batch'\)"),
             "viz.json": (b'{"machine": "\xff"}', "is not UTF-8 text")}
    for name, (content, message) in cases.items():
        for other in bench.iterdir():
            other.unlink()
        file = bench / name
        file.write_bytes(content if isinstance(content, bytes) else content.encode())
        with pytest.raises(SystemExit, match=f"{file}.* {message}") as err:
            main(["report", "--out", str(tmp_path / "report"), "--bench", str(bench)])
        assert "\n" not in str(err.value)
    assert not (tmp_path / "report").exists()
