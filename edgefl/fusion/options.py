"""Method options as data (scikit-learn's parameter constraints): each config field declares its
help, type and bounds in its metadata; one validator checks every field of every method and
words every failure the same way, naming the flag and the fix. The CLI, `server methods` and
the contract tests read the same declarations.

An option whose best value depends on the data declares it: a default per input kind
(`by_input`: FedMHO's learning rate on images vs sensor windows) and, where a paper gives a
setting per dataset, per dataset (`by_dataset`: FedMHO's Table 7, 5e-4 on FMNIST); it is unset
until the task's input and dataset are known, and `effective` is the one place that fills it
(a value given > the dataset's > the input kind's). Code outside this module reads a method's
options from an effective config only: a config straight from `make_config` may hold None.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

from edgefl.bounds import OneOf, Range, Rule
from edgefl.data.registry import DATASETS
from edgefl.errors import ConfigError, nearest
from edgefl.models.zoo import INPUT_KINDS, input_kind

# Synthetic samples a method may be asked for: 1M 28x28 images are 3 GiB, 166x the defaults;
# past it a typo (--synthetic 99999999999999) ended in numpy's allocation error after ingest.
MAX_SYNTHETIC = 1_000_000


@dataclass(frozen=True)
class Opt:
    """What one option accepts. `low`/`high` bound numbers (`*_open`: the bound itself is not
    allowed); `choices` lists the allowed strings; `nullable`: None is a valid value."""

    help: str
    kind: str  # int | float | str | bool | floats (a non-empty tuple of numbers)
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()
    nullable: bool = False
    by_input: tuple[tuple[str, Any], ...] = ()
    by_dataset: tuple[tuple[str, Any], ...] = ()

    def describe(self) -> str:
        """The constraint in words: 'an integer >= 1', 'a number in (0, 1]', 'one of a, b'."""
        if self.choices:
            text = "one of " + ", ".join(self.choices)
        else:
            # A bounded number reads best bare ("in (0, 1]", "> 0"); integers say so.
            noun = {
                "int": "an integer",
                "float": "",
                "str": "a string",
                "bool": "true or false",
                "floats": "numbers, each",
            }[self.kind]
            if self.low is not None and self.high is not None:
                lo, hi = "(" if self.low_open else "[", ")" if self.high_open else "]"
                text = f"{noun} in {lo}{_num(self.low)}, {_num(self.high)}{hi}"
            elif self.low is not None:
                text = f"{noun} {'>' if self.low_open else '>='} {_num(self.low)}"
            elif self.high is not None:
                text = f"{noun} {'<' if self.high_open else '<='} {_num(self.high)}"
            else:
                text = noun or "a number"
            text = text.strip()
        if self.by_input:
            return text + (
                " (or unset: by dataset)" if self.by_dataset else " (or unset: by input)"
            )
        return text + (" (or unset)" if self.nullable else "")

    def problem(self, value: Any) -> str | None:
        """None if `value` is allowed, else the constraint it breaks."""
        return None if self._allows(value) else self.describe()

    def direction(self, value: Any) -> str:
        """Which way a number outside the bounds must move ("raise it" for one below them), or
        "" where the value is not a finite number past a bound (`edgefl.bounds.Range`'s rule;
        a tuple: the way all its numbers out of range agree on)."""
        if isinstance(value, tuple):
            moves = {self.direction(v) for v in value} - {""}
            return moves.pop() if len(moves) == 1 else ""
        constraint = self.constraint
        return constraint.direction(value) if constraint is not None else ""

    def default_for(self, kind: str, dataset: str | None = None) -> Any:
        """The default on dataset `dataset` (where the option names it), else for input kind
        `kind`."""
        by_dataset = dict(self.by_dataset)
        return by_dataset[dataset] if dataset in by_dataset else dict(self.by_input)[kind]

    def _allows(self, value: Any) -> bool:
        if value is None:
            return self.nullable
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "floats":
            return bool(isinstance(value, tuple) and value) and all(map(self._number_ok, value))
        if self.kind in ("int", "float"):
            return self._number_ok(value)
        # A string: True is an int to Python, never a name to a user.
        return isinstance(value, str) and (not self.choices or value in self.choices)

    @property
    def constraint(self) -> Range | OneOf | None:
        """The option's constraint in edgefl.bounds' terms: a number's Range (each number's, for
        `floats`), a string's OneOf, or None (any string, a bool)."""
        if self.choices:
            return OneOf(self.choices)
        if self.kind in ("int", "float", "floats"):
            bounds = (self.low, self.high, self.low_open, self.high_open)
            return Range(*bounds, integer=self.kind == "int")
        return None

    def _number_ok(self, value: Any) -> bool:
        return isinstance(value, int | float) and self.constraint.allows(value)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(x)


def option(
    default: Any,
    help: str,
    *,
    kind: str | None = None,
    by_input: dict[str, Any] | None = None,
    by_dataset: dict[str, Any] | None = None,
    otherwise: Any = None,
    **bounds: Any,
):
    """A config field with its constraint: `epochs: int = option(10, "global epochs", low=1)`.
    The kind is the field's annotation's (`declared` reads it): `lr: float = option(1, ...)` is
    a float option; `kind=` is only for a field without a plain annotation. `by_input`: a
    default per input kind (`{"image": 1e-5, "signal": 1e-3}`); the field is then unset (None)
    until `effective` fills it for the task's input, and its help says so. `by_dataset`: a
    default per dataset where a paper gives one, over the input kind's (or `otherwise`, the
    one default for every kind of input)."""
    if otherwise is not None:
        by_input = dict.fromkeys(INPUT_KINDS, otherwise)
    if by_input is not None or by_dataset is not None:
        if default is not None or by_input is None:
            raise TypeError(
                "an option with defaults by data is unset (None) by default and names a "
                "default for every input kind (by_input or otherwise)"
            )
        help = f"{help} ({_by_data_text(by_input, by_dataset or {}, otherwise)})"
    opt = Opt(
        help=help,
        kind=kind or "",
        nullable=default is None or bounds.pop("nullable", False),
        by_input=tuple((by_input or {}).items()),
        by_dataset=tuple((by_dataset or {}).items()),
        **bounds,
    )
    return field(default=default, metadata={"option": opt})


_PLURAL = {"image": "images", "signal": "sensor windows"}


def _by_data_text(by_input: dict, by_dataset: dict, otherwise: Any) -> str:
    """'default by dataset: 5e-4 on fmnist; 1e-05 on images; 0.001 on sensor windows'."""
    parts = [f"{_num_or_repr(v)} on {k}" for k, v in by_dataset.items()]
    if otherwise is not None:
        parts.append(f"{_num_or_repr(otherwise)} on {'others' if parts else 'all'}")
    else:
        parts += [f"{_num_or_repr(v)} on {_PLURAL[k]}" for k, v in by_input.items()]
    return f"default by {'dataset' if by_dataset else 'input'}: {'; '.join(parts)}"


def _num_or_repr(v: Any) -> str:
    return _num(v) if isinstance(v, int | float) and not isinstance(v, bool) else repr(v)


def redefault(base, name: str, default: Any, help: str | None = None):
    """Option `name` as config class `base` declares it, with another default (and help, where
    a method says more): a subclass changes a shared option without declaring it again."""
    opt = base.__dataclass_fields__[name].metadata["option"]
    return field(default=default, metadata={"option": replace(opt, help=help) if help else opt})


# The annotations an option may carry, and the kind each one declares.
_ANNOTATED = {
    "bool": "bool",
    "int": "int",
    "float": "float",
    "str": "str",
    "tuple[float, ...]": "floats",
}
# A default of one kind that a field of another kind holds as it is (1 for 1.0).
_FITS = {("int", "float")}


def annotated_kind(annotation: Any) -> str | None:
    """The kind an annotation declares ('float', 'int | None', 'tuple[float, ...]'), or None
    for one that declares no single kind."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    parts = [p.strip() for p in text.split("|") if p.strip() != "None"]
    return _ANNOTATED.get(parts[0]) if len(parts) == 1 else None


def _default_kind(default: Any) -> str | None:
    return {bool: "bool", int: "int", float: "float", str: "str", tuple: "floats"}.get(
        type(default)
    )


def _resolved(cls, f) -> Opt:
    """A field's Opt with its kind from the annotation; a default the annotation does not hold
    (`n: int = option(0.5, ...)`) or a kind declared nowhere is a bug in the config class."""
    opt = f.metadata["option"]
    kind = annotated_kind(f.type) or opt.kind or _default_kind(f.default)
    given = _default_kind(f.default) if f.default is not None else kind
    where = f"{cls.__name__}.{f.name}"
    if not kind:
        raise TypeError(f"{where}: annotate it with one of {', '.join(_ANNOTATED)}, or pass kind=")
    if opt.kind and opt.kind != kind:
        raise TypeError(f"{where}: kind={opt.kind!r} but its annotation is {f.type!r}")
    if given != kind and (given, kind) not in _FITS:
        raise TypeError(f"{where}: default {f.default!r} does not fit its annotation {f.type!r}")
    opt = replace(opt, kind=kind)
    if opt.by_input:
        _check_by_data(where, opt)
    return opt


def _check_by_data(where: str, opt: Opt) -> None:
    """A declaration's defaults by data: one for every input kind, each within its bounds, and
    datasets that are registered (a typo would never apply)."""
    kinds = tuple(k for k, _ in opt.by_input)
    if sorted(kinds) != sorted(INPUT_KINDS):
        raise TypeError(f"{where}: by_input must give one default for each of {INPUT_KINDS}")
    for k, v in opt.by_input + opt.by_dataset:
        if v is None or opt.problem(v):
            raise TypeError(f"{where}: its default on {k} {v!r} breaks its constraint")
    unknown = sorted({k for k, _ in opt.by_dataset} - set(DATASETS.names()))
    if unknown:
        raise TypeError(f"{where}: by_dataset names no registered dataset {unknown}")


def flag(name: str) -> str:
    return name.replace("_", "-")


def declared(cls) -> list[tuple[str, Any, Opt]]:
    """(name, default, Opt) of every option field of a config class."""
    out = []
    for f in fields(cls):
        if "option" not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with option(...)")
        out.append((f.name, None if f.default is MISSING else f.default, _resolved(cls, f)))
    return out


def validate(cfg: Any) -> None:
    """Check every field of a config against its declaration; one message for the first bad one."""
    for name, default, opt in declared(type(cfg)):
        value = getattr(cfg, name)
        if opt.kind == "float" and isinstance(value, int) and not isinstance(value, bool):
            object.__setattr__(cfg, name, float(value))  # --lr 1 means 1.0
            value = float(value)
        if opt.kind == "floats" and isinstance(value, list | tuple):  # a list read from JSON
            number = all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
            value = tuple(float(v) for v in value) if number else tuple(value)
            object.__setattr__(cfg, name, value)
        broken = opt.problem(value)
        if broken:
            move = opt.direction(value)
            problem = f"must be {broken}, got {value!r}" + (f": {move}" if move else "")
            example = None if default is None else (default, _example(default))
            raise OptionError(name, problem, opt.help, example)


def as_flag(name: str, value: str | None = None) -> str:
    """How `server fuse` spells an option: a flag, `--name value`."""
    return f"--{flag(name)}" + ("" if value is None else f" {value}")


class RespellableError(ConfigError):
    """An option error worded in `server fuse`'s flags that `respelled(spell)` words again the
    way another command takes options (simulate: `--fuse-opt METHOD:key=value`)."""

    def respelled(self, spell) -> RespellableError:
        raise NotImplementedError


class OptionError(RespellableError):
    """A bad option value."""

    def __init__(self, name: str, problem: str, help_text: str, example, spell=as_flag):
        self.name, self.problem, self.help_text, self.example = name, problem, help_text, example
        if example is None:  # no value to show: leaving the option out is the default
            usual = f"; unset by default: leave {spell(name)} out for that"
        elif example:
            usual = f"; default {example[0]!r} (e.g. {spell(name, example[1])})"
        else:  # () where the default is not at hand
            usual = ""
        super().__init__(f"{spell(name)} {problem}", hint=help_text + usual)

    def respelled(self, spell) -> OptionError:
        return OptionError(self.name, self.problem, self.help_text, self.example, spell)


class UnknownOptionError(RespellableError):
    """Option names a method does not have, with the nearest it has."""

    def __init__(self, method: str, names, valid, spell=as_flag):
        self.method, self.names, self.valid = method, sorted(names), sorted(valid)
        near = nearest(self.names[0], self.valid)
        if spell is as_flag:
            head = f"method {method!r} has no option(s) {', '.join(map(as_flag, self.names))}"
            mean, listed = (as_flag(near) if near else None), map(as_flag, self.valid)
        else:
            head = (
                f"{spell(self.names[0])}: method {method!r} has no option {flag(self.names[0])!r}"
            )
            mean, listed = (repr(flag(near)) if near else None), map(flag, self.valid)
        super().__init__(
            head + (f" (did you mean {mean}?)" if mean else ""),
            hint=f"its options: {', '.join(listed)} (`edgefl server methods {method}` explains "
            "each)",
        )

    def respelled(self, spell) -> UnknownOptionError:
        return UnknownOptionError(self.method, self.names, self.valid, spell)


def option_rules(cls) -> dict[str, Rule]:
    """The options of a config class as edgefl.bounds Rules (those with a constraint to break:
    numbers and named choices; a tuple of numbers is checked by `validate` alone)."""
    return {
        name: Rule(opt.constraint, "--" + flag(name), nullable=opt.nullable)
        for name, _, opt in declared(cls)
        if opt.constraint is not None and opt.kind != "floats"
    }


def unset_by_input(cfg: Any) -> list[str]:
    """The by-input options of `cfg` still unset: none, in an effective config."""
    return [
        name for name, _, opt in declared(type(cfg)) if opt.by_input and getattr(cfg, name) is None
    ]


def effective(cfg: Any, input_shape, dataset: str | None = None) -> Any:
    """`cfg` with every unset option that defaults by data set: to its default on `dataset`
    (the registered name the uploads declare) where it names one, else for the kind of
    `input_shape` (images, sensor windows; `edgefl.models.zoo.input_kind`); a value the user
    gave stays. What `server fuse`, `simulate` and the demo run a method with."""
    kind = input_kind(tuple(input_shape))
    dataset = dataset if isinstance(dataset, str) else None  # upload metadata is data
    opts = {name: opt for name, _, opt in declared(type(cfg))}
    fill = {name: opts[name].default_for(kind, dataset) for name in unset_by_input(cfg)}
    return replace(cfg, **fill) if fill else cfg


def refuse_on_every_input(cfg: Any) -> None:
    """Raise now the refusal `cfg` meets whatever the uploads turn out to be (a bound between
    options where one defaults by data set: --joint over an unset --synthetic), not after
    they are read; a config that some input kind or dataset takes passes (`effective` then
    decides on the uploads' own)."""
    unset = unset_by_input(cfg)
    if not unset:
        return  # every bound was checked when the config was made
    opts = {name: opt for name, _, opt in declared(type(cfg))}
    named = sorted({d for name in unset for d, _ in opts[name].by_dataset})
    first = None
    for kind in INPUT_KINDS:
        for dataset in (None, *named):
            try:
                replace(cfg, **{n: opts[n].default_for(kind, dataset) for n in unset})
                return
            except ConfigError as exc:
                first = first or exc
    raise first


def _example(default: Any) -> str:
    if isinstance(default, tuple):
        return ",".join(str(v) for v in default)
    return str(default).lower() if isinstance(default, bool) else str(default)


def describe_options(cls) -> list[dict[str, Any]]:
    """The options of a config class as rows (for `server methods` and --json)."""
    return [
        {
            "name": name,
            "flag": "--" + flag(name),
            "default": default,
            "type": opt.kind,
            "constraint": opt.describe(),
            "help": opt.help,
            "by_input": dict(opt.by_input) or None,
            "by_dataset": dict(opt.by_dataset) or None,
        }
        for name, default, opt in declared(cls)
    ]
