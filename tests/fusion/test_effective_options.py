"""Options that default by input kind (issue 55, item 4): every default of every method resolves
on every kind of input, and nothing outside the option layer reads one while it is still unset
(the demo compared FedMHO's unset lr with a float and crashed `make demo` for three days)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from edgefl.cli.simulate_cmd import demo_options
from edgefl.data import DATASETS
from edgefl.errors import ConfigError
from edgefl.fusion import METHODS
from edgefl.fusion.options import declared, effective, option, unset_by_input
from edgefl.models.zoo import INPUT_KINDS, input_kind

ROOT = Path(__file__).resolve().parents[2]
# Every input the registered datasets have (8x8 digits, 28x28 and 32x32x3 images, HAPT's
# windows) and a feature vector, which edgefl stores as (D, 1, 1) and reads as an image.
SHAPES = sorted({tuple(DATASETS.get(n).input_shape) for n in DATASETS.names()} | {(64, 1, 1)})
# Each registered dataset with its input, and data no registry entry names (a user's .npz).
TASKS = [(tuple(DATASETS.get(n).input_shape), n) for n in DATASETS.names()] + [
    ((64, 1, 1), None),
    ((1, 28, 28), "my-own.npz"),
]
BY_INPUT = {
    name: {key for key, _, opt in declared(METHODS.get(name).config_cls) if opt.by_input}
    for name in METHODS.names()
}


def test_the_shapes_cover_every_input_kind():
    assert {input_kind(s) for s in SHAPES} == set(INPUT_KINDS)


@pytest.mark.parametrize("name", METHODS.names())
@pytest.mark.parametrize(("shape", "dataset"), TASKS, ids=lambda t: str(t))
def test_every_default_resolves_on_every_input(name, shape, dataset):
    method = METHODS.get(name)
    cfg = method.effective_config({}, shape, dataset)
    assert unset_by_input(cfg) == []
    for key in BY_INPUT[name]:
        opt = method.config_cls.__dataclass_fields__[key].metadata["option"]
        assert getattr(cfg, key) == opt.default_for(input_kind(shape), dataset)
    # Every budget's options resolve too (what `--budget paper|code` runs with).
    for budget in ("cpu", "paper", "code"):
        got = method.effective_config(method.budget_options(budget), shape, dataset)
        assert unset_by_input(got) == []


@pytest.mark.parametrize("name", METHODS.names())
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_demo_options_build_for_every_method_and_input(name, shape):
    """The demo's reduced options (the helper that raised TypeError on FedMHO) are options the
    method accepts, with a global lr of at least 1e-4 wherever it has one."""
    method = METHODS.get(name)
    small = demo_options(method, shape)
    cfg = method.effective_config(small, shape)
    if "lr" in method.option_names():
        assert cfg.lr >= 1e-4


def test_a_value_given_is_kept_and_the_by_input_default_fills_only_what_is_unset():
    fedmho = METHODS.get("fedmho")
    assert fedmho.make_config({}).lr is None  # unset until the input is known
    assert fedmho.effective_config({}, (1, 28, 28)).lr == 1e-5
    assert fedmho.effective_config({}, (6, 1, 128)).lr == 1e-3
    assert fedmho.effective_config({"lr": 3e-4}, (6, 1, 128)).lr == 3e-4
    cfg = fedmho.effective_config({}, (1, 28, 28))
    assert effective(cfg, (6, 1, 128)) is cfg  # nothing unset is left to fill


@pytest.mark.parametrize("name", ["fedmho", "fedmho-md", "fedmho-sd"])
def test_fedmho_takes_table_7_by_the_uploads_dataset(name):
    """The paper's Table 7 per dataset (global lr, epochs, synthetic samples); MNIST's on other
    images, 1e-3 on sensor windows (bench/results/fedmho_windows.md); a value given wins."""
    method = METHODS.get(name)
    got = {
        dataset: (c.lr, c.epochs, c.synthetic)
        for dataset in ("mnist", "fmnist", "svhn", "emnist", "hapt", None)
        for c in [
            method.effective_config({}, DATASETS.get(dataset or "mnist").input_shape, dataset)
        ]
    }
    assert got == {
        "mnist": (1e-5, 10, 6000),
        "fmnist": (5e-4, 20, 6000),
        "svhn": (5e-5, 20, 6000),
        "emnist": (5e-5, 30, 12000),
        "hapt": (1e-3, 10, 6000),
        None: (1e-5, 10, 6000),
    }
    given = method.effective_config({"lr": 1e-4, "epochs": 3}, (1, 28, 28), "fmnist")
    assert (given.lr, given.epochs) == (1e-4, 3)
    assert method.effective_config(method.budget_options("code"), (1, 28, 28), "mnist").epochs == 20


def test_fedmho_cw_jitters_digits_and_windows_but_not_garments():
    """fedmho-cw's student jitter by the uploads' dataset: none on Fashion-MNIST (centred,
    upright garments: bench/results/fashion_fedmho_cw_augment.md), the input kind's elsewhere,
    what "auto" gave before; FedCVAE-Ens keeps "auto" everywhere; a value given wins."""
    method = METHODS.get("fedmho-cw")
    got = {
        dataset: method.effective_config({}, DATASETS.get(dataset).input_shape, dataset).augment
        for dataset in ("mnist", "fmnist", "emnist", "svhn", "hapt")
    }
    assert got == {
        "mnist": "affine",
        "fmnist": "none",
        "emnist": "affine",
        "svhn": "affine",
        "hapt": "rotate",
    }
    assert method.effective_config({}, (1, 28, 28), "my-own.npz").augment == "affine"
    given = method.effective_config({"augment": "affine"}, (1, 28, 28), "fmnist")
    assert given.augment == "affine"
    assert METHODS.get("fedcvae-ens").effective_config({}, (1, 28, 28), "fmnist").augment == "auto"


def test_server_methods_shows_the_defaults_by_dataset(cli):
    import json

    opts = json.loads(cli("server", "methods", "fedmho", "--json").output)["options"]
    assert opts["lr"]["by_dataset"] == {"fmnist": 5e-4, "svhn": 5e-5, "emnist": 5e-5}
    assert opts["lr"]["by_input"] == {"image": 1e-5, "signal": 1e-3}
    assert "5e-4 on fmnist" in opts["lr"]["help"].replace("0.0005", "5e-4")
    assert opts["epochs"]["by_dataset"] == {"fmnist": 20, "svhn": 20, "emnist": 30}


def test_a_by_input_declaration_must_cover_every_kind_and_obey_its_bounds():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Partial:
        lr: float | None = option(None, "lr", by_input={"image": 1e-3}, low=0)

    with pytest.raises(TypeError, match="one default for each"):
        declared(Partial)

    @dataclass(frozen=True)
    class OutOfBounds:
        lr: float | None = option(None, "lr", by_input={"image": -1.0, "signal": 1.0}, low=0)

    with pytest.raises(TypeError, match="breaks its constraint"):
        declared(OutOfBounds)
    with pytest.raises(TypeError, match="unset"):
        option(1.0, "lr", by_input={"image": 1.0, "signal": 1.0})


def test_a_bound_no_input_can_meet_is_refused_before_the_uploads_are_read():
    """--joint past every by-input --synthetic (8,000 on images, 4,000 on windows) is refused by
    make_config (before the ingest); between the two it waits for the uploads' own input."""
    pfedzkd = METHODS.get("pfedzkd")
    with pytest.raises(ConfigError, match="--joint 9000 is more than --synthetic"):
        pfedzkd.make_config({"joint": 9000})
    cfg = pfedzkd.make_config({"joint": 6000})  # images take it, windows do not
    assert effective(cfg, (1, 28, 28)).joint == 6000
    with pytest.raises(ConfigError, match="--joint 6000 is more than --synthetic 4000"):
        effective(cfg, DATASETS.get("hapt").input_shape)


def test_the_server_says_such_a_bound_before_its_ingest(cli, tmp_path):
    (tmp_path / "up").mkdir()  # nothing to ingest: the refusal must come from the plan
    r = cli(
        "server",
        "fuse",
        str(tmp_path / "up"),
        "--method",
        "pfedzkd",
        "--opt",
        "joint=9000",
        "--out",
        str(tmp_path / "g.onnx"),
        "--json",
    )
    assert r.exit_code == 2 and "ingesting" not in r.output, r.output
    assert "--joint 9000 is more than --synthetic" in json.loads(r.stdout)["error"]
    assert not (tmp_path / "g.onnx").exists()


@pytest.mark.parametrize(
    ("given", "move"),
    [({"epochs": 0}, "raise it"), ({"keep_ratio": 1.5}, "lower it"), ({"lr": -1.0}, "raise it")],
)
def test_a_value_out_of_range_is_told_which_way_to_move(given, move):
    with pytest.raises(ConfigError) as err:
        METHODS.get("fedmho").make_config(given)
    assert err.value.message.endswith(f": {move}")


# --- nothing outside the option layer reads a by-input option before it is resolved ------------

_UNRESOLVED = ("config_cls", "make_config")  # what yields a config whose by-input fields are None


def _unresolved_reads(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines reading a by-input option off a config built by `config_cls(...)` or
    `make_config(...)` (directly, or through a name bound to one in the same function)."""

    def unresolved(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in _UNRESOLVED
        )

    lines = []
    for scope in [tree] + [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
        bound = {
            t.id
            for n in ast.walk(scope)
            if isinstance(n, ast.Assign) and unresolved(n.value)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for n in ast.walk(scope):
            if isinstance(n, ast.Attribute) and n.attr in names:
                base = n.value
                if unresolved(base) or (isinstance(base, ast.Name) and base.id in bound):
                    lines.append(n.lineno)
    return sorted(set(lines))


def test_no_code_outside_the_option_layer_reads_an_unset_option():
    names = set().union(*BY_INPUT.values())
    assert names  # FedMHO's lr, pFedZKD's inversion options at least
    found = {}
    for path in sorted((ROOT / "edgefl").rglob("*.py")):
        if path.name == "options.py":
            continue
        lines = _unresolved_reads(ast.parse(path.read_text()), names)
        if lines:
            found[str(path.relative_to(ROOT))] = lines
    assert found == {}, f"read an option that may be unset: {found}; use effective_config"


def test_the_scan_finds_the_read_that_crashed_the_demo():
    """0c93d91's demo helper, as it was: the scan must flag it."""
    crashed = (
        "def _demo_options(method):\n"
        "    if method.config_cls().lr < 1e-4:\n"
        "        return {}\n"
        "def other(m):\n"
        "    cfg = m.make_config({})\n"
        "    return cfg.lr\n"
    )
    assert _unresolved_reads(ast.parse(crashed), {"lr"}) == [2, 6]
    assert _unresolved_reads(ast.parse("x = m.effective_config({}, s).lr"), {"lr"}) == []


# --- a path that cannot be read is the user's error (found by the first-contact review) -------


def test_a_missing_input_file_is_one_message_and_exit_2(cli, tmp_path):
    for args, said in (
        (
            ("client", "sample", str(tmp_path / "missing.onnx"), "--out", str(tmp_path / "s.png")),
            "does not exist",
        ),
        (("client", "sample", str(tmp_path), "--out", str(tmp_path / "s.png")), "is a folder"),
    ):
        result = cli(*args)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output and said in result.output, result.output
