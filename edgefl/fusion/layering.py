"""The one way every command layers a method's options (`server fuse`, `simulate`, `reproduce`):
the named budget's, then the options given for every chosen method (`--opt key=value`, a
method flag, simulate's `all:key=value`), then the options given for one method
(`METHOD:key=value`). Command-line text is typed by the option's own declaration (an int field
parses `3`, a float field `3` as 3.0, a list of numbers `0.1,1.0`), never guessed. An option no
chosen method has, or one aimed at a method that is not chosen, is one message; every value is
checked against its declaration before any upload is read or any client trained.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from edgefl.errors import ConfigError
from edgefl.fusion.options import Opt, OptionError, RespellableError, as_flag, declared, flag
from edgefl.progress import printable

_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")


def parse_text(name: str, opt: Opt, text: str) -> Any:
    """A command line's text for option `name`, as the type the option declares."""
    value = text.strip()
    if opt.nullable and value.lower() in ("none", "unset"):
        return None
    try:
        if opt.kind == "int":
            return int(value)
        if opt.kind == "float":
            return float(value)
        if opt.kind == "floats":
            parts = value.replace("x", ",").split(",")
            return tuple(float(p) for p in parts if p.strip())
    except ValueError:
        raise OptionError(name, f"must be {opt.describe()}, got {text!r}", opt.help, ()) from None
    if opt.kind == "bool":
        if value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise OptionError(name, f"must be true or false, got {text!r}", opt.help, ())
    return value


def split_items(items: Sequence[str], what: str, hint: str | None = None) -> dict[str, str]:
    """`key=value` texts -> {key: value text}, keys with - or _ alike; a key given twice with
    two values is an error (`given_once`)."""
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"{what} expects key=value, got {item!r}", hint=hint)
        given_once(out, {key.strip().replace("-", "_"): value}, what)
    return out


def given_once(into: dict[str, str], new: Mapping[str, str], what: str) -> None:
    """`new` added to `into`. An option given twice with two values (`--epochs 1 --opt
    epochs=2`) is refused: the later one won without a word. A `METHOD:key=value` over one for
    every method is layering, not this (`layer`)."""
    for key, value in new.items():
        if key in into and into[key].strip() != value.strip():
            raise ConfigError(
                f"option {flag(key)!r} given twice in {what}, as {into[key]!r} and {value!r}",
                hint="give each option once (METHOD:key=value sets one method's alone)",
            )
        into[key] = value


def layer(
    methods: Sequence[str],
    budget: str = "cpu",
    shared: Mapping[str, Any] | None = None,
    targeted: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    shared_flag: str = "--{key}",
    targeted_flag: str = "--opt {method}:KEY=VALUE",
) -> dict[str, dict[str, Any]]:
    """{method: options} for `methods`: the budget's, then `shared` for every method that has
    each option (an error when none has it), then `targeted[method]`. Text values are typed by
    each method's declaration of the option; every method's result is validated.
    `shared_flag` and `targeted_flag` show how the user gave them (`{key}`: the option's flag
    name, `{method}`: the method named)."""
    from edgefl.fusion import METHODS

    chosen = {m: METHODS.get(m) for m in methods}
    kinds = {
        m: {name: opt for name, _, opt in declared(meth.config_cls)} for m, meth in chosen.items()
    }
    out = {m: meth.budget_options(budget) for m, meth in chosen.items()}
    spell = {m: _spelling(shared_flag, targeted_flag, m) for m in methods}
    spell_shared = _spelling(shared_flag, shared_flag.replace("{key}", "KEY=VALUE"), "")
    for key, value in (shared or {}).items():
        for m in _takers(key, value, methods, chosen, kinds, shared_flag, spell_shared):
            out[m][key] = _typed(kinds, m, key, value, len(methods) > 1, spell[m])
    for m, options in (targeted or {}).items():
        if m not in chosen:
            raise ConfigError(
                f"{targeted_flag.format(method=m)}: {m!r} is not among the chosen methods "
                f"({', '.join(methods)})",
                hint="name one of the chosen methods, or give the option for all of them",
            )
        for key, value in options.items():
            out[m][key] = _typed(kinds, m, key, value, len(methods) > 1, spell[m])
    for m, options in out.items():  # unknown names and bad values: now, before any work
        _check(chosen[m], options, spell[m])
    return out


def _check(method, options: Mapping[str, Any], spell) -> None:
    """`options` make a valid config of `method`; what is wrong (an unknown name, a bad value)
    is said the way the command takes options."""
    try:
        method.make_config(options)
    except RespellableError as exc:
        raise exc.respelled(spell) from None


def _spelling(shared_flag: str, targeted_flag: str, method: str):
    """How the user gives `method` an option: the flag where a shared option is one (server
    fuse), else the targeted form (simulate's `--fuse-opt METHOD:key=value`)."""
    if shared_flag == "--{key}":
        return as_flag

    def spell(name: str, value: str | None = None) -> str:
        given = flag(name) if value is None else f"{flag(name)}={value}"
        return targeted_flag.format(method=method).replace("KEY=VALUE", given)

    return spell


def _typed(kinds, m: str, key: str, value: Any, several: bool, spell=as_flag) -> Any:
    """`value` as method `m` declares option `key` (text only; other values as they are)."""
    opt = kinds[m].get(key)
    if not (opt and isinstance(value, str)):
        return value
    try:
        return parse_text(key, opt, value)
    except OptionError as exc:  # several methods may read one option differently: say whose
        exc = exc.respelled(spell)
        who = f" ({m}'s)" if several else ""
        raise ConfigError(exc.message + who, hint=exc.hint) from None


def _takers(key: str, value: Any, methods, chosen, kinds, shared_flag: str, spell) -> list[str]:
    """The chosen methods that have option `key`; none is an error (a single method's own
    message lists its options, spelt by `spell` as the shared option was given)."""
    takers = [m for m in methods if key in kinds[m]]
    if takers:
        return takers
    if flag(key) == "fuse-opt":  # simulate's spelling of server fuse's --opt
        raise ConfigError(
            "--fuse-opt is simulate's flag",
            hint=f"server fuse takes the same text as --opt: --opt {printable(str(value))}",
        )
    if len(methods) == 1:
        _check(chosen[methods[0]], {key: value}, spell)
    names = sorted({n for k in kinds.values() for n in k})
    raise ConfigError(
        f"{shared_flag.format(key=flag(key))}: none of {', '.join(methods)} has an "
        f"option --{flag(key)}",
        hint=f"their options: {', '.join('--' + flag(n) for n in names)} "
        "(`edgefl server methods METHOD` explains each)",
    )
