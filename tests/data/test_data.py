"""Dataset loading: built-in sets, official file formats (tiny files written here), user data, CLI."""

from __future__ import annotations

import gzip
import json
import pickle
import struct
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from edgefl.data import (
    ArrayDataset,
    dataset_shape,
    load_dataset,
    parse_dataset_ref,
    plot_image_grid,
    plot_label_heatmap,
    read_idx,
)
from edgefl.errors import ConfigError, DataError, UnknownNameError

# ---------------------------------------------------------------------------------------------
# helpers that write tiny files in the official formats


def write_idx(path: Path, arr: np.ndarray, gz: bool = False) -> Path:
    codes = {np.dtype(np.uint8): 0x08, np.dtype(np.int32): 0x0C}
    header = struct.pack(">BBBB", 0, 0, codes[arr.dtype], arr.ndim)
    header += struct.pack(f">{arr.ndim}I", *arr.shape)
    data = header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def tiny_images(n: int, h: int = 28, w: int = 28, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, h, w), dtype=np.uint8)


def write_idx_set(folder: Path, prefix: str, n_train: int, n_test: int, classes: int, gz=False):
    """Write the four IDX files; return the original (unstored-orientation) arrays."""
    test_split = "test" if prefix else "t10k"
    out = {}
    for split, n, seed in (("train", n_train, 1), (test_split, n_test, 2)):
        x = tiny_images(n, seed=seed)
        y = (np.arange(n) % classes).astype(np.uint8)
        write_idx(folder / f"{prefix}{split}-images-idx3-ubyte", x, gz)
        write_idx(folder / f"{prefix}{split}-labels-idx1-ubyte", y, gz)
        out["test" if split == test_split else split] = (x, y)
    return out


# ---------------------------------------------------------------------------------------------
# built-in datasets


def test_mnist_full_splits():
    train, test = load_dataset("mnist"), load_dataset("mnist:test")
    assert len(train) == 60_000 and len(test) == 10_000
    assert train.input_shape == (1, 28, 28) and train.x.dtype == np.float32
    assert train.y.dtype == np.int64 and train.num_classes == 10
    assert train.x.min() >= 0.0 and train.x.max() == 1.0  # pixels rescaled to k/255
    assert set(np.unique(train.y)) == set(range(10)) == set(np.unique(test.y))
    # callers get private copies: scribbling on one load must not leak into the next
    train.x[:5] = 7.0
    assert load_dataset("mnist").x[:5].max() <= 1.0


def test_digits_split_sizes_and_determinism():
    train, test = load_dataset("digits"), load_dataset("digits", "test")
    assert (len(train), len(test)) == (1437, 360)
    assert train.input_shape == (1, 8, 8) and train.x.min() >= 0 and train.x.max() <= 1
    assert np.all(np.abs(test.label_counts() - 36) <= 1)  # stratified
    again = load_dataset("digits")
    assert train.fingerprint() == again.fingerprint()
    assert train.fingerprint() != test.fingerprint()
    sub = train.subset([3, 1, 2])
    assert len(sub) == 3 and np.array_equal(sub.y, train.y[[3, 1, 2]])
    assert sub.class_names == train.class_names and sub.label_counts().sum() == 3


def test_unknown_name_and_split():
    with pytest.raises(UnknownNameError, match="did you mean 'mnist'"):
        load_dataset("mnsit")
    with pytest.raises(ConfigError, match="unknown split 'val'") as err:
        load_dataset("digits:val")
    assert "train, test" in err.value.hint


def test_parse_dataset_ref(tmp_path):
    assert parse_dataset_ref("mnist") == ("mnist", None)
    assert parse_dataset_ref("MNIST:test") == ("mnist", "test")
    npz = tmp_path / "d.npz"
    assert parse_dataset_ref(str(npz)) == (str(npz), None)
    assert parse_dataset_ref(f"{npz}:test") == (f"{npz}:test", None)  # head does not exist
    np.savez(npz, x=np.zeros((2, 4, 4), np.uint8), y=np.zeros(2, np.int64))
    assert parse_dataset_ref(f"{npz}:test") == (str(npz), "test")


def test_dataset_shape_without_files(tmp_path):
    shape, classes, names = dataset_shape("cifar10")  # no files needed for a registry name
    assert shape == (3, 32, 32) and classes == 10 and names[0] == "airplane"
    npz = tmp_path / "u.npz"
    np.savez(npz, x=np.zeros((3, 5, 6), np.uint8), y=np.array([0, 2, 1]))
    assert dataset_shape(str(npz)) == ((1, 5, 6), 3, ("0", "1", "2"))


def test_moved_helpers_still_import_from_datasets():
    # Callers outside edgefl.data import these from edgefl.data.datasets, where they used to live.
    from edgefl.data import _common, datasets, idx, npz

    assert datasets._npz_images is npz.npz_images and datasets.read_idx is idx.read_idx
    assert datasets.as_int_labels is _common.as_int_labels


# ---------------------------------------------------------------------------------------------
# IDX files


@pytest.mark.parametrize("gz", [False, True])
def test_fmnist_idx_round_trip(tmp_path, gz):
    raw = write_idx_set(tmp_path / "FashionMNIST" / "raw", "", 12, 5, 10, gz=gz)
    train = load_dataset("fmnist", data_dir=tmp_path)
    test = load_dataset("fmnist:test", data_dir=tmp_path)
    assert train.x.shape == (12, 1, 28, 28) and test.x.shape == (5, 1, 28, 28)
    assert np.array_equal(train.x[:, 0], raw["train"][0] / np.float32(255))
    assert np.array_equal(test.y, raw["test"][1])
    assert train.class_names[0] == "T-shirt/top"


def test_emnist_is_transposed_upright(tmp_path):
    folder = tmp_path / "gzip"
    out = {}
    for split, n in (("train", 6), ("test", 4)):
        upright = tiny_images(n, seed=n)
        y = (np.arange(n) * 7 % 47).astype(np.uint8)
        # EMNIST stores each image transposed
        write_idx(folder / f"emnist-balanced-{split}-images-idx3-ubyte", upright.transpose(0, 2, 1))
        write_idx(folder / f"emnist-balanced-{split}-labels-idx1-ubyte", y, gz=True)
        out[split] = (upright, y)
    ds = load_dataset("emnist", data_dir=tmp_path)
    assert ds.num_classes == 47
    assert np.array_equal(ds.x[:, 0], out["train"][0] / np.float32(255))
    assert np.array_equal(load_dataset("emnist:test", data_dir=tmp_path).y, out["test"][1])


def test_mnist_reads_idx_from_data_dir(tmp_path):
    write_idx_set(tmp_path, "", 7, 3, 10)
    assert len(load_dataset("mnist", data_dir=tmp_path)) == 7
    assert len(load_dataset("mnist:test", data_dir=tmp_path)) == 3


def test_named_folder_is_the_one_meant_for_builtin_datasets(tmp_path):
    """A --data-dir without MNIST's files fell back to the built-in MNIST without a word, and a
    folder of Fashion-MNIST's files (same names, same sizes) was read as digits; digits, which
    reads no files, passed over the folder too. Each is refused, naming the folder and the fix."""
    with pytest.raises(DataError, match="holds no MNIST train files") as err:
        load_dataset("mnist", data_dir=tmp_path)
    assert str(tmp_path) in str(err.value) and "drop --data-dir" in err.value.hint
    with pytest.raises(DataError, match="reads no files") as err:
        load_dataset("digits", data_dir=tmp_path)
    assert "drop --data-dir" in err.value.hint
    # a full test split whose labels are not MNIST's (the images are not read before the check)
    real = load_dataset("mnist:test").y
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((len(real), 28, 28), np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.roll(real, 1).astype(np.uint8))
    with pytest.raises(DataError, match="not MNIST's") as err:
        load_dataset("mnist:test", data_dir=tmp_path)
    assert "--dataset fmnist" in err.value.hint
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", real.astype(np.uint8))  # MNIST's own: read
    assert np.array_equal(load_dataset("mnist:test", data_dir=tmp_path).y, real)


def test_malformed_idx(tmp_path):
    bad = tmp_path / "bad-idx"
    bad.write_bytes(b"<html>not found</html>")
    with pytest.raises(DataError, match="not an IDX file"):
        read_idx(bad)
    good = write_idx(tmp_path / "x-idx3-ubyte", tiny_images(3))
    good.write_bytes(good.read_bytes()[:-10])
    with pytest.raises(DataError, match="truncated"):
        read_idx(good)
    assert (
        read_idx(write_idx(tmp_path / "i", np.arange(6, dtype=np.int32).reshape(2, 3))).sum() == 15
    )


def test_missing_files_name_every_path(tmp_path):
    with pytest.raises(DataError) as err:
        load_dataset("fmnist", data_dir=tmp_path)
    msg = str(err.value)
    assert "train-images-idx3-ubyte" in msg and str(tmp_path / "FashionMNIST" / "raw") in msg
    assert "t10k-labels-idx1-ubyte" in msg  # both splits' files, said before either is read
    assert "dataset-fashion-mnist" in err.value.hint  # the package that provides them
    for name, expect in (
        ("cifar10", "cifar-10-batches-py"),
        ("cifar100", "cifar-100-python"),
        ("svhn", "train_32x32.mat"),
    ):
        with pytest.raises(DataError, match=expect) as err:
            load_dataset(name, data_dir=tmp_path)
        assert str(tmp_path) in str(err.value)
        # the one command that downloads: only `data partition` has --download
        assert f"data partition --dataset {name}" in err.value.hint


def test_download_without_torchvision(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import fails even where installed
    with pytest.raises(DataError, match="torchvision") as err:
        load_dataset("fmnist", data_dir=tmp_path, download=True)
    assert str(tmp_path) in err.value.hint


# ---------------------------------------------------------------------------------------------
# CIFAR pickles and SVHN .mat


def _pickle(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def test_cifar10_batches(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    rng = np.random.default_rng(0)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(2, 3072), dtype=np.uint8)
        _pickle(folder / name, {b"data": data, b"labels": [1, 9]})
        batches[name] = data
    names = [n.encode() for n in "abcdefghij"]
    _pickle(folder / "batches.meta", {b"label_names": names})
    train = load_dataset("cifar10", data_dir=tmp_path)
    assert train.x.shape == (10, 3, 32, 32) and train.class_names[:2] == ("a", "b")
    # rows are R(1024) G(1024) B(1024), each 32x32 row-major
    first = batches["data_batch_1"][0]
    assert train.x[0, 1, 0, 0] == first[1024] / np.float32(255)
    assert train.x[0, 0, 1, 0] == first[32] / np.float32(255)
    assert len(load_dataset("cifar10:test", data_dir=tmp_path)) == 2


def test_cifar100_fine_labels(tmp_path):
    folder = tmp_path / "cifar-100-python"
    rng = np.random.default_rng(1)
    for split, n in (("train", 4), ("test", 2)):
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = {b"data": data, b"fine_labels": list(range(n)), b"coarse_labels": [0] * n}
        _pickle(folder / split, labels)
    _pickle(folder / "meta", {b"fine_label_names": [f"c{i}".encode() for i in range(100)]})
    ds = load_dataset("cifar100", data_dir=tmp_path)
    assert ds.num_classes == 100 and ds.class_names[3] == "c3"
    assert list(ds.y) == [0, 1, 2, 3]


def test_svhn_mat(tmp_path):
    from scipy.io import savemat

    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, size=(32, 32, 3, 4), dtype=np.uint8)
    savemat(tmp_path / "train_32x32.mat", {"X": x, "y": np.array([[10], [1], [5], [10]])})
    ds = load_dataset("svhn", data_dir=tmp_path)
    assert ds.x.shape == (4, 3, 32, 32)
    assert list(ds.y) == [0, 1, 5, 0]  # label 10 is the digit 0
    assert ds.x[2, 1, 3, 4] == x[3, 4, 1, 2] / np.float32(255)


# ---------------------------------------------------------------------------------------------
# user data


def test_npz_variants(tmp_path):
    rng = np.random.default_rng(0)
    gray = tmp_path / "gray.npz"
    np.savez(gray, x=rng.random((6, 5, 4), dtype=np.float32), y=np.arange(6) % 3)
    ds = load_dataset(str(gray))
    assert ds.input_shape == (1, 5, 4) and ds.num_classes == 3

    hwc = tmp_path / "hwc.npz"
    x = rng.integers(0, 256, size=(4, 6, 7, 3), dtype=np.uint8)
    np.savez(
        hwc, x=x, y=[0, 1, 0, 1], class_names=np.array(["cat", "dog"]), x_test=x[:2], y_test=[1, 1]
    )
    ds = load_dataset(str(hwc))
    assert ds.input_shape == (3, 6, 7) and ds.class_names == ("cat", "dog")
    assert ds.x[1, 2, 3, 4] == x[1, 3, 4, 2] / np.float32(255)
    assert len(load_dataset(f"{hwc}:test")) == 2

    with pytest.raises(DataError, match="no test split"):
        load_dataset(str(gray), "test")


def test_npz_errors(tmp_path):
    def save(**arrays) -> str:
        path = tmp_path / "bad.npz"
        np.savez(path, **arrays)
        return str(path)

    x = np.zeros((5, 4, 4), np.uint8)
    with pytest.raises(DataError, match=r"5 images but labels of shape \(4,\)"):
        load_dataset(save(x=x, y=np.zeros(4, int)))
    with pytest.raises(DataError, match=r"labels \[2, 7\] are outside the valid range 0..1"):
        load_dataset(save(x=x, y=[0, 1, 2, 7, 1], class_names=np.array(["a", "b"])))
    with pytest.raises(DataError, match="outside the valid range"):
        load_dataset(save(x=x, y=[0, -1, 0, 0, 0]))
    with pytest.raises(DataError, match=r"\(N, H, W\), \(N, C, H, W\)"):
        load_dataset(save(x=np.zeros((5, 4)), y=np.zeros(5, int)))
    with pytest.raises(DataError, match=r"\[0, 1\]"):
        load_dataset(save(x=np.full((5, 4, 4), 3.0), y=np.zeros(5, int)))
    with warnings.catch_warnings():  # NaN named, not hidden by a range; no numpy warning
        warnings.simplefilter("error")
        with pytest.raises(DataError, match=r"found 80 NaN or infinite value"):
            load_dataset(save(x=np.full((5, 4, 4), np.nan), y=np.zeros(5, int)))
    with pytest.raises(DataError, match="expected arrays 'x' and 'y'"):
        load_dataset(save(images=x))
    with pytest.raises(DataError, match="does not exist"):
        load_dataset(str(tmp_path / "nope.npz"))
    # A file numpy did not write: said so, not numpy's "pickled (object) data" message.
    (tmp_path / "notes.npz").write_text("x,y\n0,1\n")
    with pytest.raises(DataError, match=r"notes.npz is not a .npz file") as err:
        load_dataset(str(tmp_path / "notes.npz"))
    assert "pickle" not in str(err.value) and "np.savez" in err.value.hint


def test_image_folder(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls in ("b_dog", "a_cat"):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for i in range(3):
            pix = rng.integers(0, 256, size=(5, 4), dtype=np.uint8)
            Image.fromarray(pix, mode="L").save(tmp_path / "imgs" / cls / f"{i}.png")
    ds = load_dataset(str(tmp_path / "imgs"))
    assert ds.class_names == ("a_cat", "b_dog") and ds.input_shape == (1, 5, 4)
    assert list(ds.label_counts()) == [3, 3]
    with pytest.raises(DataError, match="no test split"):
        load_dataset(str(tmp_path / "imgs"), "test")

    # one RGB image turns the dataset into 3 channels
    Image.fromarray(np.zeros((5, 4, 3), np.uint8)).save(tmp_path / "imgs" / "a_cat" / "rgb.png")
    assert load_dataset(str(tmp_path / "imgs")).input_shape == (3, 5, 4)

    odd = tmp_path / "imgs" / "b_dog" / "odd.png"
    Image.fromarray(np.zeros((6, 6), np.uint8)).save(odd)
    with pytest.raises(DataError, match="odd.png is 6x6") as err:
        load_dataset(str(tmp_path / "imgs"))
    assert "resize" in err.value.hint


def test_image_folder_with_splits(tmp_path):
    from PIL import Image

    for split, n in (("train", 2), ("test", 1)):
        for cls in ("x", "y"):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(np.full((3, 3), 9, np.uint8)).save(
                    tmp_path / split / cls / f"{i}.png"
                )
    assert len(load_dataset(str(tmp_path))) == 4
    assert len(load_dataset(f"{tmp_path}:test")) == 2


def test_array_dataset_validates():
    with pytest.raises(DataError, match="expected images of shape"):
        ArrayDataset(np.zeros((2, 3)), np.zeros(2, np.int64), ("a",), "t")


# ---------------------------------------------------------------------------------------------
# plots


def test_plots_write_png(tmp_path):
    counts = np.arange(12).reshape(3, 4)
    out = plot_label_heatmap(counts, tmp_path / "sub" / "heat.png", class_names=list("abcd"))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    grid = np.random.default_rng(0).random((2, 3, 1, 8, 8))
    out = plot_image_grid(grid, tmp_path / "grid.png", row_labels=["r0", "r1"], title="t")
    assert out.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["grid.png", "heat.png", "sub"]
    with pytest.raises(DataError, match="rows, cols, C, H, W"):
        plot_image_grid(np.zeros((2, 8, 8)), tmp_path / "x.png")


# ---------------------------------------------------------------------------------------------
# CLI


@pytest.fixture(scope="module")
def cli():
    from typer.testing import CliRunner

    from edgefl.cli import app

    runner = CliRunner()
    return lambda *args: runner.invoke(app, list(args))


def test_cli_data_list(cli):
    result = cli("data", "list")
    assert result.exit_code == 0, result.output
    assert "digits" in result.output and "cifar100" in result.output
    rows = json.loads(cli("data", "list", "--json").stdout)
    assert {r["name"] for r in rows} >= {"mnist", "digits", "emnist"}


def test_cli_data_partition(cli, tmp_path):
    args = ["data", "partition", "--dataset", "digits", "--num-clients", "4", "--seed", "3"]
    result = cli(*args, "--partition", "dirichlet:0.5", "--json", "--plot", str(tmp_path / "h.png"))
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["scheme"] == "dirichlet:0.5" and out["num_clients"] == 4 and out["seed"] == 3
    counts = np.array(out["counts"])
    assert counts.shape == (4, 10) and counts.sum() == 1437
    assert list(counts.sum(axis=1)) == out["sizes"]
    assert (tmp_path / "h.png").is_file()

    table = cli(*args, "--scheme", "classes:3")  # 4 clients x 3 >= 10 classes: all dealt
    assert table.exit_code == 0, table.output
    assert "1,437 of 1,437 samples assigned" in table.output


def test_cli_bad_scheme_exits_2(cli):
    for flag in ("--partition", "--scheme"):  # --scheme: the old name, still accepted
        result = cli("data", "partition", "--dataset", "digits", flag, "dirichlet:-1")
        assert result.exit_code == 2
        text = " ".join(result.output.split())
        assert "invalid partition scheme" in text and "--partition" in text
        assert "dirichlet:ALPHA" in text
    assert "--scheme" not in cli("data", "partition", "--help").output


def test_download_of_a_built_in_dataset_is_refused():
    """`data partition -d digits --download` fetched nothing and said nothing."""
    with pytest.raises(ConfigError, match="digits is built in; there is nothing to fetch"):
        load_dataset("digits", download=True)


def test_a_user_partitions_heat_map_names_each_clients_user(monkeypatch, tmp_path):
    """Its rows read 0-20 while the table beside it named the users (exploratory pass)."""
    import edgefl.data.plots as plots

    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: drawn.append(fig) or path)
    plot_label_heatmap(np.ones((3, 2)), tmp_path / "h.png", users=[8, 11, 16])
    axes = drawn[0].axes[0]
    assert [t.get_text() for t in axes.get_yticklabels()] == ["0 (8)", "1 (11)", "2 (16)"]
    assert axes.get_ylabel() == "client (user)"
