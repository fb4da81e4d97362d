"""Bring your own data: ImageFolder, NumpyArrays and HuggingFaceImages on tiny data sets made here.

Each sample carries its serial number in its first value, so that a split can be read back
and checked against the files: splits disjoint, covering every sample, the same for the
same seed, with the labels of their class folders; mean and std against numpy's over the
training files; and bad data refused at construction with a message that names the file,
key or column and what was expected.
"""

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import zoo
from zoo.cli import main
from zoo.data import HuggingFaceImages, ImageFolder, NumpyArrays
from zoo.training.checkpoint_io import read_checkpoint
from zoo.training.classification import fit_to_data


def image(serial: int, size=(8, 8), mode="L", fill=None) -> Image.Image:
    """Noise (or `fill`) with the serial number in the top-left pixel of the first channel."""
    rng = np.random.default_rng(serial)
    chans = 3 if mode == "RGB" else 1
    pixels = np.full((*size, chans), fill, np.uint8) if fill is not None else \
        rng.integers(0, 256, (*size, chans), dtype=np.uint8)
    pixels[0, 0, 0] = serial
    return Image.fromarray(pixels[..., 0] if chans == 1 else pixels, mode)


def image_folder(root, classes=("cat", "dog"), per_class=10, start=0, **kwargs) -> dict[int, str]:
    """PNGs in root/<class>/; returns {serial: class}."""
    made = {}
    for c in classes:
        (root / c).mkdir(parents=True)
        for _ in range(per_class):
            serial = start + len(made)
            image(serial, **kwargs).save(root / c / f"{serial:03d}.png")
            made[serial] = c
    return made


def serials(data, dataset) -> list[int]:
    """The serial numbers of a normalized split, read back through the module's mean and std."""
    info = data.data_info
    first = torch.stack([x.flatten()[0] for x, _ in dataset])
    return (first * info["std"][0] + info["mean"][0]).mul(255).round().int().tolist()


def splits(data) -> dict[str, list[int]]:
    data.setup("fit")
    return {name: serials(data, getattr(data, f"{name}_set")) for name in ("train", "val", "test")}


def test_image_folder_splits_are_disjoint_cover_every_image_and_follow_the_seed(tmp_path):
    made = image_folder(tmp_path / "pets", per_class=20)
    first, again, other = (splits(ImageFolder(str(tmp_path / "pets"), seed=seed)) for seed in (0, 0, 1))
    assert first == again
    parts = [set(first[name]) for name in ("train", "val", "test")]
    assert sorted(set().union(*parts)) == sorted(made) and sum(map(len, parts)) == len(made)
    assert (len(parts[0]), len(parts[1]), len(parts[2])) == (29, 3, 8)  # 20% test, then 10% of the rest
    assert first["test"] == other["test"] and first["val"] != other["val"]  # the test split is fixed

    data = ImageFolder(str(tmp_path / "pets"))
    data.setup("fit")
    names = data.data_info["label_names"]
    for x, y in data.train_set:
        assert names[int(y)] == made[serials(data, [(x, y)])[0]]


def test_image_folder_measures_mean_and_std_on_the_training_images(tmp_path):
    made = image_folder(tmp_path / "pets", per_class=10)
    data = ImageFolder(str(tmp_path / "pets"))
    info = data.data_info
    split = splits(data)
    pixels = np.stack([np.asarray(Image.open(tmp_path / "pets" / made[s] / f"{s:03d}.png"), np.float64) / 255
                       for s in split["train"] + split["val"]])
    assert info == {"num_classes": 2, "in_chans": 1, "input_size": [8, 8], "mean": pytest.approx([pixels.mean()]),
                    "std": pytest.approx([pixels.std()]), "label_names": ["cat", "dog"]}
    assert "measured on the training split" in data.describe()["splits"]
    given = ImageFolder(str(tmp_path / "pets"), mean=[0.5], std=[0.25])
    given.setup("fit")
    assert given.data_info["mean"] == [0.5] and "the mean and std given" in given.describe()["splits"]


def test_image_folder_detects_rgb_resizes_and_takes_separate_val_and_test_folders(tmp_path):
    image_folder(tmp_path / "set" / "train", per_class=6, mode="RGB", size=(16, 16))
    image_folder(tmp_path / "set" / "val", per_class=2, start=100, size=(16, 16))  # gray: repeated to RGB
    image_folder(tmp_path / "set" / "test", classes=("dog",), per_class=3, start=200, size=(16, 16), fill=51)
    data = ImageFolder(str(tmp_path / "set"), img_size=8, train="train", val="val", test="test")
    info = data.data_info
    assert info["in_chans"] == 3 and info["input_size"] == [8, 8] and info["label_names"] == ["cat", "dog"]
    data.setup("fit")
    assert (len(data.train_set), len(data.val_set), len(data.test_set)) == (12, 4, 3)
    x, y = data.test_set[0]
    mean, std = torch.tensor(info["mean"]).view(3, 1, 1), torch.tensor(info["std"]).view(3, 1, 1)
    raw = x * std + mean  # a constant 51/255 image, but for its serial pixel, stays constant when resized
    assert int(y) == 1 and torch.allclose(raw[:, 2:, 2:], torch.full((3, 6, 6), 0.2), atol=1e-5)
    assert "the data's own test split" in data.describe()["splits"]


def test_a_model_fitted_to_the_folder_preprocesses_a_file_as_it_was_trained_on(tmp_path):
    made = image_folder(tmp_path / "pets", per_class=3, mode="RGB", size=(12, 12))
    data = ImageFolder(str(tmp_path / "pets"), img_size=6, test_fraction=0.5, val_fraction=0.5)
    model = zoo.create("micro-vit-tiny", **fit_to_data("micro-vit-tiny", {"patch_size": 3}, data.data_info))
    data.setup("fit")
    files = []
    for serial, label in made.items():
        with Image.open(tmp_path / "pets" / label / f"{serial:03d}.png") as file:
            files.append(model.preprocess(file)[0])
    for x, _ in [*data.train_set, *data.val_set, *data.test_set]:  # resized: serials blur, so match whole images
        assert sum(torch.allclose(f, x, atol=1e-5) for f in files) == 1


def test_image_folder_reads_16_bit_images_at_their_depth(tmp_path):
    (tmp_path / "deep" / "a").mkdir(parents=True)
    (tmp_path / "deep" / "b").mkdir()
    for i, value in enumerate([0, 1000, 30000, 65535]):
        Image.fromarray(np.full((4, 4), value, np.uint16)).save(tmp_path / "deep" / "ab"[i % 2] / f"{i}.png")
    data = ImageFolder(str(tmp_path / "deep"), test_fraction=0.25, val_fraction=0.34)
    values = np.array([0, 1000, 30000, 65535]) / 65535
    data.setup("fit")
    seen = sorted(round(float(x[0, 0, 0] * data.data_info["std"][0] + data.data_info["mean"][0]), 5)
                  for x, _ in [*data.train_set, *data.val_set, *data.test_set])
    assert data.data_info["in_chans"] == 1 and seen == pytest.approx(sorted(values), abs=1e-5)


def test_image_folder_refuses_mixed_sizes_without_img_size(tmp_path):
    image_folder(tmp_path / "pets", per_class=2)
    image(50, size=(12, 10)).save(tmp_path / "pets" / "dog" / "big.png")
    with pytest.raises(ValueError, match=r"different sizes: .*big\.png is 10x12 .*pass img_size"):
        ImageFolder(str(tmp_path / "pets"))
    assert ImageFolder(str(tmp_path / "pets"), img_size=[6, 8]).data_info["input_size"] == [6, 8]


def test_image_folder_refuses_folders_without_images(tmp_path):
    with pytest.raises(FileNotFoundError, match="the train folder .*nowhere does not exist"):
        ImageFolder(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"holds no class folders; expected one folder of images per class"):
        ImageFolder(str(tmp_path / "empty"))
    (tmp_path / "loose").mkdir()
    image(1).save(tmp_path / "loose" / "1.png")
    with pytest.raises(ValueError, match="holds images but no class folders"):
        ImageFolder(str(tmp_path / "loose"))
    image_folder(tmp_path / "pets", per_class=2)
    (tmp_path / "pets" / "emu").mkdir()
    (tmp_path / "pets" / "emu" / "notes.txt").write_text("no images here")
    with pytest.raises(ValueError, match="class folders without images: emu"):
        ImageFolder(str(tmp_path / "pets"))
    (tmp_path / "pets" / "emu" / "fake.png").write_text("not a png")
    with pytest.raises(ValueError, match=r"fake\.png is not an image PIL can read"):
        ImageFolder(str(tmp_path / "pets"))


def test_image_folder_refuses_a_test_folder_inside_the_training_folder_and_unknown_classes(tmp_path):
    image_folder(tmp_path / "pets", per_class=2)
    image_folder(tmp_path / "pets" / "cat" / "held", classes=("cat",), per_class=1, start=10)
    with pytest.raises(ValueError, match="would be read as a class"):
        ImageFolder(str(tmp_path / "pets"), test="cat/held")
    image_folder(tmp_path / "more", classes=("cat", "emu"), per_class=1, start=20)
    with pytest.raises(ValueError, match="has classes the training folder has not: emu"):
        ImageFolder(str(tmp_path), train="pets", test="more")


def signals(n=40, chans=2, length=12, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, chans, length)).astype(np.float32)
    x[:, 0, 0] = np.arange(n) / 255  # the serial, read back by `serials`
    return x, np.arange(n) % classes


def test_numpy_arrays_from_an_npz_split_like_the_image_folder(tmp_path):
    x, y = signals()
    np.savez(tmp_path / "sig.npz", x=x, y=y)
    data = NumpyArrays(str(tmp_path / "sig.npz"), kind="signal")  # (N, C, L): or (N, H, W) images
    info = data.data_info
    assert info["num_classes"] == 3 and info["in_chans"] == 2 and info["input_size"] == [12]
    split = splits(data)
    assert sorted(sum(split.values(), [])) == list(range(40)) and len(split["test"]) == 8
    assert split == splits(NumpyArrays(str(tmp_path / "sig.npz"), kind="signal"))
    train_rows = x[split["train"] + split["val"]]
    assert info["mean"] == pytest.approx(train_rows.mean(axis=(0, 2)).tolist(), abs=1e-5)
    assert info["std"] == pytest.approx(train_rows.std(axis=(0, 2)).tolist(), abs=1e-5)
    assert data.describe()["file"] == "sig.npz"
    np.savez(tmp_path / "one.npz", x=x[:, 0], y=y * 2)  # (N, L): signals without being told; classes 1, 3 unused
    one = NumpyArrays(str(tmp_path / "one.npz"), num_classes=5).data_info
    assert one["input_size"] == [12] and one["in_chans"] == 1 and one["label_names"] == ["0", "1", "2", "3", "4"]


def test_numpy_arrays_with_their_own_test_split_images_and_volumes(tmp_path):
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (30, 6, 6), dtype=np.uint8)
    np.savez(tmp_path / "img.npz", x_train=images[:20], y_train=(np.arange(20) % 2)[:, None],
             x_test=images[20:], y_test=np.arange(10) % 2)
    data = NumpyArrays(str(tmp_path / "img.npz"), kind="image", label_names=["no", "yes"])
    assert data.data_info["in_chans"] == 1 and data.data_info["input_size"] == [6, 6]
    assert data.data_info["mean"] == pytest.approx([images[:20].mean() / 255], abs=1e-6)  # uint8 read as /255
    data.setup("fit")
    assert (len(data.train_set) + len(data.val_set), len(data.test_set)) == (20, 10)
    x, y = data.test_set[3]
    restored = x * data.data_info["std"][0] + data.data_info["mean"][0]
    assert torch.allclose(restored[0], torch.tensor(images[23] / 255, dtype=torch.float32), atol=1e-5)

    (tmp_path / "vol").mkdir()
    np.save(tmp_path / "vol" / "x.npy", rng.random((12, 1, 4, 4, 4), dtype=np.float32))
    np.save(tmp_path / "vol" / "y.npy", np.arange(12) % 2)
    volumes = NumpyArrays(str(tmp_path / "vol"))  # a folder of .npy files
    assert volumes.data_info["input_size"] == [4, 4, 4] and volumes.data_info["in_chans"] == 1


@pytest.mark.parametrize("arrays, kwargs, message", [
    ({"images": np.zeros((4, 3)), "labels": np.zeros(4, int)}, {},
     "holds images, labels; expected x and y, or x_train and y_train"),
    ({"x": np.zeros((4, 3))}, {}, "x and y go together, one is missing"),
    ({"x": np.zeros((4, 3)), "y": np.array([0.0, 1.0, 0.0, 1.0])}, {}, "must hold integer class labels 0..K-1, "
                                                                       "got dtype float64"),
    ({"x": np.zeros((4, 3)), "y": np.array([1, 2, 3, 3])}, {}, "never use 0; labels must be 0..K-1"),
    ({"x": np.zeros((4, 3)), "y": np.array([0, 1, 1, 10**12])}, {}, "never use 2, 3, 4, 5"),  # at once
    ({"x": np.zeros((4, 3)), "y": np.array([0, 1, -1, 1])}, {}, "holds the label -1"),
    ({"x": np.zeros((5, 3)), "y": np.array([0, 1, 0, 1])}, {}, "x has 5 samples but y has 4 labels"),
    ({"x": np.zeros((4, 2, 3, 3)), "y": np.array([0, 1, 0, 1])}, {},
     r"could be \(N, C, H, W\) images or \(N, D, H, W\) volumes; pass kind"),
    ({"x": np.zeros((4, 3)), "y": np.array([0, 1, 0, 1]), "x_test": np.zeros((2, 3)), "y_test": np.array([0, 2])},
     {}, "holds the label 2, but there are 2 classes"),
    ({"x": np.full((4, 3), 300, np.int32), "y": np.array([0, 1, 0, 1])}, {}, "x: integer pixels are read as 8-bit"),
    ({"x": np.full((4, 3), np.nan), "y": np.array([0, 1, 0, 1])}, {}, "x: the input holds NaN"),
    ({"x": np.zeros((4, 3)), "y": np.array([0, 1, 0, 1])}, {"label_names": ["a"]}, "label_names must be 2 strings"),
])
def test_numpy_arrays_refuse_what_they_cannot_read(tmp_path, arrays, kwargs, message):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match=message):
        _ = NumpyArrays(str(tmp_path / "bad.npz"), **kwargs).data_info


class Planted:
    """Unpickling this object would create a file: the proof that nothing was unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_numpy_arrays_never_unpickle(tmp_path):
    marker = tmp_path / "unpickled"
    np.savez(tmp_path / "obj.npz", x=np.array([Planted(marker)] * 4, dtype=object), y=np.array([0, 1, 0, 1]))
    with pytest.raises(ValueError, match="could not be read without unpickling"):
        _ = NumpyArrays(str(tmp_path / "obj.npz")).data_info
    assert not marker.exists()
    np.save(tmp_path / "one.npy", np.zeros(3))
    with pytest.raises(ValueError, match="one .npy array; put x.npy and y.npy in a folder"):
        NumpyArrays(str(tmp_path / "one.npy"))


def saved_hf_dataset(path, test=True):
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"img": datasets.Image(), "kind": datasets.ClassLabel(names=["cat", "dog"])})
    rows = lambda start, n: {"img": [image(start + i, mode="RGB") for i in range(n)],  # noqa: E731
                             "kind": [i % 2 for i in range(n)]}
    parts = {"train": datasets.Dataset.from_dict(rows(0, 20), features=features)}
    if test:
        parts["test"] = datasets.Dataset.from_dict(rows(100, 6), features=features)
    datasets.DatasetDict(parts).save_to_disk(str(path))


def test_hugging_face_images_from_a_saved_folder(tmp_path):
    saved_hf_dataset(tmp_path / "hf")
    data = HuggingFaceImages(str(tmp_path / "hf"), image_column="img", label_column="kind")
    info = data.data_info
    assert info["label_names"] == ["cat", "dog"] and info["in_chans"] == 3 and info["input_size"] == [8, 8]
    split = splits(data)
    assert sorted(split["train"] + split["val"]) == list(range(20)) and sorted(split["test"]) == list(range(100, 106))
    assert not set(split["train"]) & set(split["val"])
    assert data.describe()["file"] == "hf" and "the data's own test split" in data.describe()["splits"]


def test_hugging_face_images_refuse_wrong_columns_and_missing_folders(tmp_path):
    saved_hf_dataset(tmp_path / "hf", test=False)
    with pytest.raises(ValueError, match="has no column 'image'; its columns are img, kind"):
        HuggingFaceImages(str(tmp_path / "hf"))
    with pytest.raises(ValueError, match="column 'kind' holds .*not images"):
        HuggingFaceImages(str(tmp_path / "hf"), image_column="kind", label_column="kind")
    with pytest.raises(FileNotFoundError, match="is not a Hub data set id either"):
        HuggingFaceImages(str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="download=False"):  # never reaches the network
        _ = HuggingFaceImages("someone/some-images", download=False).data_info


def test_zoo_fit_trains_on_an_image_folder(tmp_path):
    image_folder(tmp_path / "pets", per_class=8)
    main(["fit", "--model", "zoo.training.ClassificationTask", "--model.init_args.model_name", "micro-vit-tiny",
          "--model.init_args.model_overrides", "{patch_size: 4, embed_dim: 16, depth: 1, num_heads: 2}",
          "--data", "zoo.data.ImageFolder", "--data.init_args.root", str(tmp_path / "pets"),
          "--data.init_args.batch_size", "4", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
          "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false",
          "--trainer.default_root_dir", str(tmp_path / "runs")])
    checkpoint = read_checkpoint(tmp_path / "runs" / "checkpoints" / "micro-vit-tiny" / "last.ckpt")
    fitted = checkpoint["hyper_parameters"]["data_info"]
    assert fitted["label_names"] == ["cat", "dog"] and fitted["in_chans"] == 1 and fitted["input_size"] == [8, 8]
    head = [v for k, v in checkpoint["state_dict"].items() if k.endswith("head.weight")]
    assert head and head[0].shape[0] == 2


@pytest.mark.parametrize("form", ["folder", "npz"])
def test_arrays_whose_header_claims_petabytes_are_refused_from_the_header(tmp_path, form):
    """A .npy header can declare any shape in a few bytes: refused before numpy allocates it."""
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False,
                                                   "shape": (10**9, 1, 1000, 1000)})
    labels = io.BytesIO()
    np.save(labels, np.zeros(3, dtype=np.int64))
    if form == "folder":
        path = tmp_path / "arrays"
        path.mkdir()
        (path / "x.npy").write_bytes(header.getvalue())
        (path / "y.npy").write_bytes(labels.getvalue())
    else:
        path = tmp_path / "arrays.npz"
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("x.npy", header.getvalue())
            archive.writestr("y.npy", labels.getvalue())
    data = NumpyArrays(path=str(path), kind="image")
    with pytest.raises(ValueError, match=r"is truncated: its header declares 4,000,000,000,000,\d+ bytes"):
        data.setup("fit")


# ---- a data set's own split folders; links out of, or back into, a class folder ----------------


def test_image_folder_uses_the_split_folders_it_finds_under_the_root(tmp_path):
    """root/train/<class>, root/test/<class> passed as the root: the splits, not two classes "train" and "test"."""
    made = image_folder(tmp_path / "set" / "train", per_class=6)
    held = image_folder(tmp_path / "set" / "test", per_class=2, start=100)
    data = ImageFolder(str(tmp_path / "set"))
    assert data.data_info["label_names"] == ["cat", "dog"]
    assert data.recorded_args()["train"] == "train" and data.recorded_args()["test"] == "test"
    split = splits(data)
    assert sorted(split["test"]) == sorted(held) and sorted(split["train"] + split["val"]) == sorted(made)
    assert "the data's own test split" in data.describe()["splits"]

    image_folder(tmp_path / "set" / "Valid", per_class=1, start=200)  # any case; valid, val or validation
    data = ImageFolder(str(tmp_path / "set"))
    assert data.recorded_args()["val"] == "Valid" and sorted(splits(data)["val"]) == [200, 201]

    image_folder(tmp_path / "set" / "validation", per_class=1, start=210)
    with pytest.raises(ValueError, match=r"holds two validation folders, Valid and validation; pass val="):
        ImageFolder(str(tmp_path / "set"))
    image_folder(tmp_path / "heldout" / "val", per_class=1)
    image_folder(tmp_path / "heldout" / "test", per_class=1, start=10)
    with pytest.raises(ValueError, match=r"holds split folders \(test, val\) but no training folder; pass train="):
        ImageFolder(str(tmp_path / "heldout"))

    for name in ("train", "test"):  # classes that happen to be called so hold images, not class folders
        (tmp_path / "vehicles" / name).mkdir(parents=True)
        image(len(name)).save(tmp_path / "vehicles" / name / "1.png")
        image(len(name) + 1).save(tmp_path / "vehicles" / name / "2.png")
    data = ImageFolder(str(tmp_path / "vehicles"), test_fraction=0.25, val_fraction=0.34)
    assert data.classes == ["test", "train"] and data.recorded_args()["train"] == ""


def test_image_folder_never_follows_a_link_out_of_or_back_into_a_class_folder(tmp_path, caplog):
    made = image_folder(tmp_path / "pets", per_class=3)
    pets = tmp_path / "pets"
    image(50).save(tmp_path / "elsewhere.png")
    (pets / "cat" / "loop").symlink_to(pets / "cat")  # a loop: cat/loop/loop/... read 40 times over
    assert len(ImageFolder(str(pets)).samples["train"]) == len(made)
    (pets / "cat" / "up").symlink_to(pets)  # the whole tree again, dogs under cat
    (pets / "cat" / "dog.png").symlink_to(pets / "dog" / "003.png")  # a dog labelled cat
    (pets / "cat" / "out.png").symlink_to(tmp_path / "elsewhere.png")
    (pets / "emu").symlink_to(pets / "dog")  # a class folder that is another class's
    (pets / "cat" / "again.png").symlink_to(pets / "cat" / "000.png")  # inside its own class folder: read
    with caplog.at_level("WARNING", logger="zoo.data.folders"):
        data = ImageFolder(str(pets))
    labels = {Path(path).name: data.classes[label] for path, label in data.samples["train"]}
    assert data.classes == ["cat", "dog"] and len(labels) == len(made) + 1 == len(data.samples["train"])
    assert all(labels[f"{s:03d}.png"] == c for s, c in made.items()) and labels["again.png"] == "cat"
    warned = caplog.text
    assert "skipped 5 symbolic links" in warned
    assert all(name in warned for name in ("cat/loop", "cat/up", "cat/dog.png", "cat/out.png", "emu"))


# ---- sizes refused up front, naming the limit -------------------------------------------------


def test_sizes_beyond_what_can_be_held_are_refused_up_front_naming_the_limit(tmp_path):
    from zoo.data.synthetic import MQAR, ListOps

    image_folder(tmp_path / "pets", per_class=2)
    with pytest.raises(ValueError, match=r"^ImageFolder img_size must be between 1 and 4096, got 65536$"):
        ImageFolder(str(tmp_path / "pets"), img_size=65536)
    with pytest.raises(ValueError, match=r"^ImageFolder img_size must be between 1 and 4096, got 5000$"):
        ImageFolder(str(tmp_path / "pets"), img_size=[32, 5000])
    assert ImageFolder(str(tmp_path / "pets"), img_size=4096).size == (4096, 4096)  # headers only: nothing read
    for c in ("cat", "dog"):
        (tmp_path / "wide" / c).mkdir(parents=True)
        Image.new("L", (4097, 1)).save(tmp_path / "wide" / c / "1.png")
    with pytest.raises(ValueError, match=r"holds images of 4097x1 \(width x height\), more than the 4096 pixels a "
                                         r"side zoo holds an image at; pass img_size"):
        ImageFolder(str(tmp_path / "wide"))
    assert ImageFolder(str(tmp_path / "wide"), img_size=[1, 4096]).size == (1, 4096)

    with pytest.raises(ValueError, match=r"^ListOps max_args must be between 2 and \d+ .*, got 1000: ") as err:
        ListOps(max_args=1000)
    assert "\n" not in str(err.value) and "max_depth=10" in str(err.value)
    with pytest.raises(ValueError, match=r"^ListOps max_args must be between 2 and 18 .*max_length=20, got 19"):
        ListOps(max_depth=2, max_args=19, min_length=4, max_length=20)  # one more argument than 20 tokens hold
    ListOps(max_depth=2, max_args=18, min_length=4, max_length=20)

    with pytest.raises(ValueError, match=r"^MQAR sequence_length must be between 1 and 1048576, got 1000000000$"):
        MQAR(sequence_length=10**9)
    with pytest.raises(ValueError, match=r"^MQAR test_lengths entry must be between 1 and 1048576, got 2097152$"):
        MQAR(test_lengths=[2**21])
    with pytest.raises(ValueError, match=r"^ListOps max_length must be between 1 and 1048576, got 1073741824$"):
        ListOps(max_length=2**30)
