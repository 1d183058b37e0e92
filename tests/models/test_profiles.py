"""Every built-in profile loads; bad profiles list every problem; the planner respects budgets."""

import pytest

from device_profiles import ProfileError, list_profiles, load_profile
from edgefl.data.registry import DATASETS, dataset_info
from edgefl.errors import BudgetError, ConfigError, UnknownNameError
from edgefl.models.cost import costs
from edgefl.models.plan import check_fit, plan
from edgefl.models.zoo import make_spec
from edgefl.profiles import get_profile

REQUIRED = {
    "mcu",
    "wristband",
    "smartwatch",
    "smartphone",
    "raspberry-pi-5",
    "jetson-orin-nano",
    "server-gpu",
}

GOOD = """
name = "mine"
description = "test"
ram_bytes = 1000000
ram_available_fraction = 0.5
storage_bytes = 2000000
macs_per_second = 1e8
[training]
optimizer = "sgd"
batch_size = 8
epochs = 3
max_epoch_seconds = 60
"""


def test_builtin_profiles_load():
    assert set(list_profiles()) >= REQUIRED
    for name in list_profiles():
        p = load_profile(name)
        assert p.name == name and p.ram_budget_bytes > 0
    assert load_profile("wristband").ram_bytes == 1_441_792
    assert load_profile("mcu").ram_bytes == 320 * 1024


def test_every_number_has_a_source_comment():
    from importlib import resources

    for name in list_profiles():
        text = (resources.files("device_profiles") / f"{name}.toml").read_text()
        for line in text.splitlines():
            key = line.split("=")[0].strip()
            if key in ("ram_bytes", "storage_bytes", "macs_per_second", "ram_available_fraction"):
                assert "#" in line, f"{name}.toml: {key} has no source comment"


def test_user_profile_path(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(GOOD)
    assert get_profile(str(path)).ram_budget_bytes == 500_000


def test_bad_profile_lists_every_problem(tmp_path):
    bad = (
        GOOD.replace("ram_bytes = 1000000", "ram_bytes = -5")
        .replace('description = "test"', 'colour = "red"')
        .replace("batch_size = 8", 'batch_size = "eight"')
        .replace('"sgd"', '"lbfgs"')
    )
    path = tmp_path / "bad.toml"
    path.write_text(bad)
    with pytest.raises(ProfileError) as info:
        load_profile(str(path))
    text = str(info.value)
    for fragment in (
        "ram_bytes: must be positive",
        "description: missing",
        "colour: unknown key",
        "training.batch_size: expected int",
        "training.optimizer",
        str(path),
    ):
        assert fragment in text
    assert len(info.value.problems) == 5
    with pytest.raises(ConfigError):
        get_profile(str(path))


def test_unknown_and_unparseable(tmp_path):
    with pytest.raises(UnknownNameError, match="did you mean 'wristband'"):
        get_profile("wristbnd")
    with pytest.raises(UnknownNameError, match="did you mean 'wristband'"):  # case-blind
        get_profile("WRISTBAND")
    path = tmp_path / "x.toml"
    path.write_text("name = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        get_profile(str(path))


@pytest.mark.parametrize("profile", sorted(REQUIRED))
@pytest.mark.parametrize("dataset", ["mnist", "digits", "cifar10", "emnist"])
def test_plan_always_fits(profile, dataset):
    prof, info = get_profile(profile), dataset_info(dataset)
    p = plan(prof, info)
    fit = check_fit(p.spec, prof, samples=p.fit.samples)
    assert fit.fits and p.fit.train_bytes <= prof.ram_budget_bytes
    assert costs(p.spec).infer_peak_bytes <= prof.ram_budget_bytes


def test_wristband_cannot_hold_cvae_small_and_trains_a_smaller_cvae():
    prof, info = get_profile("wristband"), dataset_info("mnist")
    small = make_spec("cvae-small", info.input_shape, info.num_classes)
    assert not check_fit(small, prof, samples=6000).fits
    p = plan(prof, info)
    assert p.role == "generator" and costs(p.spec).params < costs(small).params
    assert plan(get_profile("smartphone"), info).role == "classifier"


def test_nothing_fits_is_a_budget_error(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(GOOD.replace("ram_bytes = 1000000", "ram_bytes = 4000"))
    with pytest.raises(BudgetError, match="even the smallest"):
        plan(get_profile(str(path)), dataset_info("mnist"))


def test_a_budget_under_a_kibibyte_is_refused_as_the_profile_is_read(tmp_path):
    """ram_bytes x ram_available_fraction rounding to 0 bytes divided by zero in every command
    that set a model against it; refused when the file is read, naming both keys."""
    path = tmp_path / "zero.toml"
    path.write_text(GOOD.replace("ram_bytes = 1000000", "ram_bytes = 1"))
    with pytest.raises(ConfigError, match="a learning budget of 0 bytes, under 1024: raise either"):
        get_profile(str(path))


def test_dataset_registry_shapes():
    assert dataset_info("emnist").num_classes == 47
    assert dataset_info("cifar100").num_classes == 100
    assert dataset_info("svhn").input_shape == (3, 32, 32)
    assert {"mnist", "fmnist", "emnist", "svhn", "cifar10", "cifar100", "digits"} <= set(
        DATASETS.names()
    )


def test_min_steps_stretches_the_epochs_of_a_small_shard_only(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text(GOOD + "min_steps = 40\n")
    p = get_profile(str(path))
    assert p.min_steps == 40 and p.as_dict()["training"]["min_steps"] == 40
    assert p.local_epochs(8 * 20) == 3  # 20 steps an epoch: the profile's 3 epochs give 60
    assert p.local_epochs(8 * 4) == 10  # 4 steps an epoch: 10 epochs for 40 steps
    assert p.local_epochs(8 * 4, batch_size=32) == 40  # the batch the client really uses
    greedy = tmp_path / "greedy.toml"
    greedy.write_text(GOOD + "min_steps = 1000\n")
    assert get_profile(str(greedy)).local_epochs(8) == 60  # never over 20 x the profile's epochs
    assert get_profile(str(tmp_path / "mine.toml")).local_epochs(0) == 3
    plain = tmp_path / "plain.toml"
    plain.write_text(GOOD)  # absent: off
    assert get_profile(str(plain)).local_epochs(1) == 3
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD + "min_steps = -1\n")
    with pytest.raises(ConfigError, match="training.min_steps: must be positive"):
        get_profile(str(bad))
