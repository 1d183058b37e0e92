"""One invalid-value test over every config a user sets (issue 58, item 4): each config declares
its constraints (edgefl.bounds: `declare` on a field, a fusion option's `option`), and from
those declarations a value past every bound, outside every choice, a fraction for an integer
and None where None is not allowed are generated and refused through the config's own
constructor: one ConfigError naming the flag, told which way to move where there is one.
A device profile (device_profiles stands alone, never importing edgefl) is refused the same way
through its loader, for every key it declares."""

from __future__ import annotations

import dataclasses

import pytest

import edgefl.cli  # noqa: F401  (imports every command, so every @declared class registers)
import edgefl.reproduce.run  # noqa: F401
import edgefl.simulate.job  # noqa: F401
from device_profiles import _TOP, _TRAINING, ProfileError, parse_profile
from edgefl.bounds import DECLARED, LOWER, RAISE, invalid_values, rules
from edgefl.errors import ConfigError
from edgefl.fusion import METHODS

# Numbers a declared class leaves unconstrained, each with its reason.
FREE = {
    # the --for numbers: ClassRequest declares them, built from these in SimJob.validate()
    "SimJob": {"for_epochs", "for_samples", "for_max_macs"},
}
NUMBERS = {"int", "float", "int | None", "float | None"}


def _configs():
    """(name, class, a valid example) for every registered config and every fusion method's."""
    out = [(cls.__name__, cls, make) for cls, make in DECLARED.items()]
    for name in METHODS.names():
        method = METHODS.get(name)
        out.append((f"{name}:{method.config_cls.__name__}", method.config_cls, method.config_cls))
    return out


def _cases():
    for label, cls, make in _configs():
        for name, value, flag, move in invalid_values(cls):
            yield pytest.param(make, name, value, flag, move, id=f"{label}.{name}={value!r}")


def test_every_kind_of_config_is_registered():
    names = {cls.__name__ for cls in DECLARED}
    assert {
        "TrainConfig",
        "PSOConfig",
        "PartitionScheme",
        "DPConfig",
        "ClientJob",
        "SimJob",
        "ClassRequest",
        "ReproduceJob",
    } <= names
    assert len(_configs()) > len(names) + 10  # the fusion methods' configs too


@pytest.mark.parametrize(("make", "name", "value", "flag", "move"), list(_cases()))
def test_every_declared_value_outside_its_constraint_is_refused(make, name, value, flag, move):
    example = make()
    with pytest.raises(ConfigError) as err:
        dataclasses.replace(example, **{name: value})  # through the constructor's checks
    text = err.value.message
    assert text.startswith(f"{flag} must be"), text
    first = text.splitlines()[0]
    if move:
        assert first.endswith(f": {move}"), text
    assert (LOWER if move == RAISE else RAISE) not in str(err.value), str(err.value)
    if not move:
        assert LOWER not in str(err.value), str(err.value)


@pytest.mark.parametrize(("label", "cls", "make"), _configs(), ids=lambda v: None)
def test_every_example_is_valid_and_every_number_is_declared(label, cls, make):
    example = make()
    declared = rules(cls)
    for name, rule in declared.items():
        rule.check(name, getattr(example, name))  # the example's own values pass
    numbers = {f.name for f in dataclasses.fields(cls) if str(f.type) in NUMBERS}
    assert numbers - set(declared) - FREE.get(cls.__name__, set()) == set(), label


def test_a_value_inside_every_range_is_kept():
    from edgefl.training import TrainConfig

    cfg = TrainConfig(epochs=1, batch_size=1, optimizer="adam", lr=1e-9, weight_decay=0.0)
    assert (cfg.epochs, cfg.lr, cfg.optimizer) == (1, 1e-9, "adam")


# --- a device profile, through its own loader --------------------------------------------------


def _profile() -> dict:
    return {
        "name": "p",
        "description": "a test device",
        "ram_bytes": 1 << 20,
        "ram_available_fraction": 0.5,
        "storage_bytes": 1 << 20,
        "macs_per_second": 1e6,
        "training": {
            "optimizer": "sgd",
            "batch_size": 8,
            "epochs": 1,
            "max_epoch_seconds": 10.0,
        },
    }


def _profile_cases():
    for table, prefix in ((_TOP, ""), (_TRAINING, "training.")):
        for key, (typ, _) in table.items():
            bad = [(None, "")]  # TOML has no null: a missing key
            if typ in (int, float):
                bad += [(0, RAISE), (-1, RAISE), ("1", "")]
            else:
                bad += [(1, "")]
            if key == "ram_available_fraction":
                bad.append((1.5, LOWER))
            if key == "optimizer":
                bad.append(("no-such-sgd", ""))
            for value, move in bad:
                yield pytest.param(prefix, key, value, move, id=f"{prefix}{key}={value!r}")


@pytest.mark.parametrize(("prefix", "key", "value", "move"), list(_profile_cases()))
def test_every_profile_key_outside_its_constraint_is_refused(prefix, key, value, move):
    data = _profile()
    table = data["training"] if prefix else data
    if value is None:
        del table[key]
    else:
        table[key] = value
    with pytest.raises(ProfileError) as err:
        parse_profile(data, "p.toml")
    lines = [line for line in str(err.value).splitlines() if f"{prefix}{key}" in line]
    assert len(lines) == 1, str(err.value)
    if move:
        assert lines[0].endswith(move), lines
    assert (LOWER if move == RAISE else RAISE) not in lines[0], lines
    assert parse_profile(_profile(), "p.toml").name == "p"
