"""One options layer for every command (edgefl.fusion.layering, issue 35): the budget's, then
options for all chosen methods, then a method's own; text typed by the option's declaration;
contract over every registered method's options."""

from __future__ import annotations

from dataclasses import fields

import pytest

from edgefl.errors import ConfigError
from edgefl.fusion import METHODS
from edgefl.fusion.layering import layer, parse_text
from edgefl.fusion.options import RespellableError, _example, declared

ANNOTATION = {
    "int": {"int", "int | None"},
    "float": {"float", "float | None"},
    "str": {"str", "str | None"},
    "bool": {"bool"},
    "floats": {"tuple[float, ...]"},
}


@pytest.mark.parametrize("name", METHODS.names())
def test_every_option_is_declared_as_its_field_is_typed(name):
    """An option's kind is what its field says (a float field with default 1 is a float)."""
    config = METHODS.get(name).config_cls
    types = {f.name: f.type for f in fields(config)}
    for key, _, opt in declared(config):
        assert types[key] in ANNOTATION[opt.kind], (name, key, opt.kind, types[key])


@pytest.mark.parametrize("name", METHODS.names())
def test_every_default_typed_back_from_its_text_is_itself(name):
    """What `server methods` shows as a default, typed on a command line, is that default."""
    for key, default, opt in declared(METHODS.get(name).config_cls):
        if default is None:
            assert parse_text(key, opt, "unset") is None
            continue
        got = parse_text(key, opt, _example(default))
        assert got == default and type(got) is type(default), (name, key, got, default)


def test_text_is_typed_by_the_declaration_not_guessed():
    opts = layer(["pfedzkd", "fedmho"], "cpu", {"seed": "3"}, {"pfedzkd": {"betas": "0.1,1"}})
    assert opts["pfedzkd"]["betas"] == (0.1, 1.0)
    assert opts["pfedzkd"]["seed"] == 3 and opts["fedmho"]["seed"] == 3
    lr = layer(["fedmho"], targeted={"fedmho": {"lr": "1"}})["fedmho"]["lr"]
    assert lr == 1.0 and isinstance(lr, float)
    with pytest.raises(ConfigError, match="--epochs must be an integer >= 1 .*, got '2.5'"):
        layer(["fedmho"], shared={"epochs": "2.5"})
    with pytest.raises(ConfigError, match=r"--lr must be > 0, got 'unset' \(pfedzkd's\)"):
        layer(["fedmho", "pfedzkd"], shared={"lr": "unset"})  # fedmho's lr may be unset
    with pytest.raises(ConfigError, match="--augment must be one of"):
        layer(["fedmho"], shared={"augment": "sideways"})


def test_the_budget_then_all_then_one_method():
    opts = layer(["fedmho", "fedmho-md"], "paper", {"epochs": "4"}, {"fedmho-md": {"epochs": "6"}})
    assert (opts["fedmho"]["epochs"], opts["fedmho-md"]["epochs"]) == (4, 6)
    assert layer(["fedmho"], "paper")["fedmho"] == METHODS.get("fedmho").budget_options("paper")


def test_an_option_no_chosen_method_has_and_a_method_not_chosen_are_refused():
    with pytest.raises(ConfigError, match="none of fedavg, ensemble has an option --epochs"):
        layer(["fedavg", "ensemble"], shared={"epochs": "1"})
    with pytest.raises(ConfigError, match="method 'fedavg' has no option"):
        layer(["fedavg"], shared={"epochs": "1"})
    with pytest.raises(ConfigError, match="dense:KEY=VALUE: 'dense' is not among the chosen"):
        layer(["fedavg"], targeted={"dense": {"epochs": "1"}})


def test_simulate_refuses_an_all_option_no_method_has_before_any_work(cli, tmp_path):
    """simulate used to drop such an option in silence (server fuse refused it)."""
    out = tmp_path / "run"
    r = cli(
        "simulate",
        "--dataset",
        "digits",
        "--methods",
        "fedavg,ensemble",
        "--fuse-opt",
        "all:epochs=1",
        "--out",
        str(out),
    )
    assert r.exit_code == 2, r.output
    assert "none of fedavg, ensemble has an option --epochs" in " ".join(r.output.split())
    assert not out.exists()


def test_an_options_kind_comes_from_its_annotation_not_its_default():
    from dataclasses import dataclass

    from edgefl.fusion.options import option, validate

    @dataclass(frozen=True)
    class Typed:
        lr: float = option(1, "a float field whose default is written 1")
        steps: int | None = option(None, "unset by default, no kind= needed")
        betas: tuple[float, ...] = option((1, 2), "numbers")

    kinds = {key: opt.kind for key, _, opt in declared(Typed)}
    assert kinds == {"lr": "float", "steps": "int", "betas": "floats"}
    cfg = Typed()
    validate(cfg)
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)
    steps = declared(Typed)[1][2]
    assert parse_text("steps", steps, "3") == 3 and parse_text("steps", steps, "unset") is None

    @dataclass(frozen=True)
    class Wrong:
        epochs: int = option(0.5, "a float default on an int field")

    with pytest.raises(
        TypeError, match=r"Wrong.epochs: default 0.5 does not fit its annotation 'int'"
    ):
        declared(Wrong)


def test_every_option_error_layering_respells_says_itself_again():
    """`layer` words whatever `make_config` raises through `respelled`: a kind that kept the
    base's would leave simulate's user a `server fuse` flag it refuses."""
    kinds = RespellableError.__subclasses__()
    assert {k.__name__ for k in kinds} >= {"OptionError", "UnknownOptionError"}
    for kind in kinds:
        assert kind.respelled is not RespellableError.respelled, kind.__name__


def test_a_bad_value_is_told_the_way_the_command_takes_the_option():
    """simulate takes `--fuse-opt METHOD:key=value`: its fix must not say `--init fresh`, which
    simulate refuses; server fuse takes the flag, so its fix keeps it."""
    form = {"shared_flag": "--fuse-opt all:{key}", "targeted_flag": "--fuse-opt {method}:KEY=VALUE"}
    with pytest.raises(ConfigError) as bad:
        layer(["dense"], targeted={"dense": {"init": "averag"}}, **form)
    assert bad.value.message.startswith("--fuse-opt dense:init must be one of fresh, average")
    assert "(e.g. --fuse-opt dense:init=fresh)" in bad.value.hint
    assert "--init " not in str(bad.value)
    with pytest.raises(ConfigError) as typed:  # refused while typing the text, not validating
        layer(["fedmho", "dense"], shared={"epochs": "2.5"}, **form)
    assert typed.value.message.startswith("--fuse-opt fedmho:epochs must be an integer")
    with pytest.raises(ConfigError) as flagged:
        layer(["dense"], targeted={"dense": {"init": "averag"}})
    assert flagged.value.message.startswith("--init must be one of")
    assert "(e.g. --init fresh)" in flagged.value.hint
    with pytest.raises(ConfigError) as unknown:  # a name it lacks: simulate's keys, the nearest
        layer(["dense"], targeted={"dense": {"inti": "average"}}, **form)
    assert unknown.value.message == (
        "--fuse-opt dense:inti: method 'dense' has no option 'inti' (did you mean 'init'?)"
    )
    assert "--" not in unknown.value.hint.split("(")[0]
    with pytest.raises(ConfigError) as flag_unknown:  # server fuse: flags, and the nearest too
        layer(["dense"], shared={"inti": "average"})
    assert flag_unknown.value.message == (
        "method 'dense' has no option(s) --inti (did you mean --init?)"
    )
    assert "--init" in flag_unknown.value.hint
    with pytest.raises(ConfigError) as shared_unknown:  # simulate's all:, as it was given
        layer(["dense"], shared={"inti": "average"}, **form)
    assert shared_unknown.value.message.startswith("--fuse-opt all:inti: method 'dense' has no")
