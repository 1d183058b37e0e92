"""What a new user meets first, at 80 columns and piped (issue 55, item 5): tables whose every
column has its own header and whose rows stay one line, a --quiet that is quiet, a README that
counts the registry, range messages that say which way to move, and dependency floors that
are declared and hold."""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from fed_fixtures import build_federation
from typer.testing import CliRunner

from edgefl.bounds import LOWER, RAISE, Range
from edgefl.cli import app
from edgefl.errors import ConfigError
from edgefl.fusion import METHODS
from edgefl.models.zoo import ZOO
from edgefl.profiles import get_profile, list_profiles

ROOT = Path(__file__).resolve().parents[2]
# The module (edgefl.data's `partition` is its function of that name).
part = importlib.import_module("edgefl.data.partition")
EDGEFL = str(Path(sys.executable).parent / "edgefl")


def piped(*args: str, width: int = 80) -> subprocess.CompletedProcess:
    """The real command at `width` columns, stdout and stderr to pipes (as a log or `| less`)."""
    env = os.environ | {"COLUMNS": str(width), "LINES": "50"}
    return subprocess.run(
        [EDGEFL, *args], capture_output=True, text=True, env=env, timeout=600, cwd=ROOT
    )


def _spans(line: str, pattern: str) -> list[tuple[int, int]]:
    return [m.span() for m in re.finditer(pattern, line)]


# A cell of `profile list`: a size with its unit ("8.00 GiB") or one word.
CELL = r"\d+(?:\.\d+)? [KMGT]?i?B|\S+"


@pytest.mark.parametrize("width", [80, 100])
def test_profile_list_gives_every_column_its_own_header(width):
    r = piped("profile", "list", width=width)
    assert r.returncode == 0, r.stderr
    lines = [line.replace("│", " ").replace("┃", " ") for line in r.stdout.splitlines()]
    head = next(line for line in lines if line.split()[:1] == ["name"])
    rows = [line for line in lines if line.split()[:1] and line.split()[0] in list_profiles()]
    assert len(rows) == len(list_profiles())
    headers = _spans(head, r"\S+")
    for row in rows:
        cells = _spans(row, CELL)
        # One header word over each column: a two-word header beside another reads as one
        # ("RAM for learning" stood over two columns), so every header is a single word...
        assert len(headers) == len(cells), (head, row)
        for (h0, h1), (c0, c1) in zip(headers, cells, strict=True):
            # ...that stands over its own cells (shares columns with them).
            assert h0 < c1 and c0 < h1, (head, row)
    for line in r.stdout.splitlines():
        assert len(line) <= width, line


def _model_lines(stdout: str) -> list[str]:
    """The table's body: the lines after the header's rule, up to the caption."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if set(line.strip()) <= set("─━╇┡┩"))
    body = []
    for line in lines[start + 1 :]:
        if line.lstrip().startswith(("MACs:", "└")):
            break
        body.append(line.replace("│", " "))
    return body


def test_models_say_each_misfit_in_one_line_and_json_gives_every_reason():
    r = piped("models", "--dataset", "mnist", "--profile", "wristband")
    assert r.returncode == 0, r.stderr
    names = {e.name for e in ZOO}
    body = _model_lines(r.stdout)
    # Every line of the table is one model's: no reasons wrapped onto lines of their own.
    assert [line.split()[0].split("(")[0] for line in body] == [
        line.split()[0].split("(")[0] for line in body if line.split()[0].split("(")[0] in names
    ]
    rows = {line.split()[0]: line.split("no:", 1)[-1].strip() for line in body}
    assert rows["vgg9"] == "train x1772 +3"  # the budget overshot most, and how many more
    assert "yes" in next(line for line in body if line.split()[0] == "mlp")  # the pick; cnn x1.64
    full = {
        m["name"]: m
        for m in json.loads(
            piped("models", "--dataset", "mnist", "--profile", "wristband", "--json").stdout
        )
    }
    assert set(full) == set(rows)
    for name, shown in rows.items():
        if full[name]["fits"]:
            continue
        # --json: every reason in full, as many as the line counts ("+3": 1 + 3).
        more = int(shown.split("+")[1]) if "+" in shown else 0
        assert len(full[name]["reasons"]) == 1 + more, (name, full[name]["reasons"])
        assert all("budget" in reason for reason in full[name]["reasons"])


# --- --quiet --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    return build_federation(tmp_path_factory.mktemp("fed"))


def test_quiet_means_quiet_on_server_fuse(federation, tmp_path):
    out = tmp_path / "g.onnx"
    args = ["server", "fuse", str(federation), "--method", "fedavg", "--out", str(out)]
    r = piped(*args, "--quiet")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""  # no summary
    assert all(line.startswith(("warning", "error")) for line in r.stderr.splitlines()), r.stderr
    assert out.exists() and json.loads(out.with_suffix(".json").read_text())["method"] == "fedavg"
    r = piped(*args, "--quiet", "--json")  # --json is unaffected
    assert r.returncode == 0 and json.loads(r.stdout)["method"] == "fedavg"


def test_quiet_means_quiet_on_simulate(tmp_path):
    args = [
        "simulate",
        "--dataset",
        "digits",
        "--clients",
        "2",
        "--mix",
        "smartphone:2",
        "--partition",
        "iid",
        "--classifier-epochs",
        "1",
        "--paper-models",
        "--methods",
        "fedavg",
        "--out",
        str(tmp_path / "sim"),
    ]
    r = piped(*args, "--quiet")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "", r.stdout
    assert all(line.startswith(("warning", "error")) for line in r.stderr.splitlines()), r.stderr
    assert (tmp_path / "sim" / "results.md").exists()
    loud = piped(*args)  # the same run again (resumed): the summary is there without --quiet
    assert "results in" in loud.stdout
    r = piped(*args, "--quiet", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["results"][0]["method"] == "fedavg"


def test_quiet_says_what_it_means_in_help():
    for command in (["server", "fuse"], ["simulate"], ["client", "train"], ["search"]):
        text = " ".join(CliRunner().invoke(app, [*command, "--help"]).output.split())
        assert "nothing but warnings and errors" in text and "no summary" in text, command


# --- the README counts the registry ------------------------------------------------------------

WORDS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
WORDS += "fifteen sixteen seventeen eighteen nineteen twenty"
NUMBER = {w: i for i, w in enumerate(WORDS.split())}


def _counts(text: str) -> list[int]:
    """Every "the N methods" / "lists all N" in the text, N in words or digits."""
    n = "|".join([*NUMBER, r"\d+"])
    found = re.findall(rf"\b(?:the|all) ({n})(?: fusion)? methods\b|lists all ({n})\b", text)
    return [int(w) if w.isdigit() else NUMBER[w] for pair in found for w in pair if w]


def test_readme_and_docs_count_the_registered_methods():
    readme = (ROOT / "README.md").read_text()
    methods_page = (ROOT / "docs" / "methods.md").read_text()
    assert _counts(readme), "the README no longer counts the methods: drop this test with it"
    assert set(_counts(readme) + _counts(methods_page)) == {len(METHODS.names())}
    # The methods page names every one of them in its opening list.
    intro = methods_page.split("## Fusion methods", 1)[1].split("\n\n", 2)[1]
    assert set(METHODS.names()) <= set(re.findall(r"[\w-]+", intro)), intro


# --- which way to move ----------------------------------------------------------------------


def _refusal(make) -> str:
    with pytest.raises(ConfigError) as err:
        make()
    return str(err.value)


def _assert_moves(text: str, move: str) -> None:
    assert text.endswith(move) or f"{move}\n" in text, text
    assert (LOWER if move == RAISE else RAISE) not in text, text


def _partition_cases():
    alpha, k = part.ALPHA, part.K
    for value, move in alpha.outside():
        yield pytest.param(lambda v=value: part.parse_scheme(f"dirichlet:{v}"), move, id="alpha")
    for value, move in k.outside():
        yield pytest.param(lambda v=value: part.parse_scheme(f"classes:{v}"), move, id="K")
        yield pytest.param(lambda v=value: part.PartitionScheme("classes", k=v), move, id="k")
    labels = [0, 1] * 5
    for n, move in ((0, RAISE), (-3, RAISE), (11, LOWER)):
        yield pytest.param(lambda n=n: part.partition(labels, n, "iid", 0), move, id=f"clients{n}")
    for size, move in ((-1, RAISE), (11, LOWER)):
        yield pytest.param(lambda s=size: part.carve_public(10, s, 0), move, id=f"public{size}")
    for value, move in part.VAL_FRACTION.outside():
        yield pytest.param(
            lambda v=value: part.train_val_split(list(range(10)), v), move, id=f"val{value}"
        )


@pytest.mark.parametrize(("make", "move"), list(_partition_cases()))
def test_partition_numbers_say_which_way_to_move(make, move):
    _assert_moves(_refusal(make), move)


def test_a_too_small_partition_number_is_never_told_to_go_lower():
    # What the trial saw: 0 clients was advised to "lower --num-clients".
    text = _refusal(lambda: part.partition([0, 1] * 5, 0, "iid", 0))
    assert "lower" not in text and "raise it" in text, text


PROFILE = """
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
PROFILE_NUMBERS = [
    "ram_bytes",
    "ram_available_fraction",
    "storage_bytes",
    "macs_per_second",
    "batch_size",
    "epochs",
    "max_epoch_seconds",
]


@pytest.mark.parametrize("key", PROFILE_NUMBERS)
@pytest.mark.parametrize("value", ["0", "-1"])
def test_profile_numbers_below_range_are_told_to_raise(tmp_path, key, value):
    text = re.sub(rf"(?m)^{key} = .*$", f"{key} = {value}", PROFILE)
    path = tmp_path / "p.toml"
    path.write_text(text)
    message = _refusal(lambda: get_profile(str(path)))
    line = next(x for x in message.splitlines() if f"{key}:" in x)
    _assert_moves(line, RAISE)


@pytest.mark.parametrize(("value", "move"), [("1.5", LOWER), ("0", RAISE), ("nan", "")])
def test_profile_fraction_says_which_way_to_move(tmp_path, value, move):
    path = tmp_path / "p.toml"
    path.write_text(
        PROFILE.replace("ram_available_fraction = 0.5", f"ram_available_fraction = {value}")
    )
    line = next(
        x for x in _refusal(lambda: get_profile(str(path))).splitlines() if "fraction:" in x
    )
    if move:
        _assert_moves(line, move)
    else:  # not a number past a bound: no way to move, but never a wrong one
        assert RAISE not in line and LOWER not in line and "finite" in line, line


@pytest.mark.parametrize(
    "args",
    [
        ["models", "--batch-size", "0"],
        ["models", "--samples", "-5"],
        ["client", "plan", "--profile", "wristband", "--samples", "0"],
        ["client", "plan", "--profile", "wristband", "--batch-size", "-1"],
        ["client", "sample", "missing.onnx", "--per-class", "0"],
        ["search", "--profile", "wristband", "--top", "0"],
        [
            "deploy",
            "m.onnx",
            "--profile",
            "wristband",
            "--target",
            "onnx",
            "--out",
            "d",
            "--eval-samples",
            "0",
        ],
        ["simulate", "--partition", "dirichlet:0"],
        ["data", "partition", "--partition", "classes:0"],
        ["data", "partition", "--seed", "-1"],  # a traceback from numpy's partition
        # one sample: BatchNorm's traceback after the search had started
        ["search", "--profile", "wristband", "--dataset", "digits", "--fitness-samples", "1"],
    ],
    ids=lambda a: " ".join(a[:2]) + (" --seed" if "--seed" in a else ""),
)
def test_cli_counts_below_range_are_told_to_raise(args):
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "raise it" in text and "lower" not in text and "Traceback" not in text, text
    assert "fix:" in text, text  # every refusal has its fix line, if only the range itself


def test_range_words_and_moves():
    assert Range(1, integer=True).text() == "an integer >= 1"
    assert Range(0, 1, high_open=True).text() == "in [0, 1)"
    assert Range(3, 20, integer=True).text() == "an integer in 3..20"
    assert Range(0, low_open=True).problem("--lr", 0.0) == "--lr must be > 0, got 0.0: raise it"
    assert Range(0, 4).problem("--x", 5) == "--x must be in [0, 4], got 5: lower it"
    # The fix names the nearest allowed count (it said "give --n a value that is ...").
    with pytest.raises(ConfigError) as err:
        Range(1, 32, integer=True).check("--n", 0)
    assert err.value.hint == "e.g. --n 1 (an integer in 1..32)"
    with pytest.raises(ConfigError) as err:
        Range(0, 1, low_open=True).check("--lr", 0.0)
    assert err.value.hint == "give --lr a value that is in (0, 1]"
    assert Range(0, low_open=True).problem("--lr", math.inf) == (
        "--lr must be a finite number > 0, got inf"
    )
    assert Range(1, integer=True).problem("--n", True) == "--n must be an integer >= 1, got True"
    assert Range(1, integer=True).problem("--n", 3) is None
    assert Range(1, integer=True).problem("--n", 6.0) == "--n must be an integer, got 6.0"
    assert Range(0, 1).outside() == [(-1, RAISE), (2, LOWER)]
    assert Range(0, 1, low_open=True, high_open=True).outside() == [(0, RAISE), (1, LOWER)]


# --- declared floors ----------------------------------------------------------------------------


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def test_pyproject_declares_floors_that_work():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from floors import floors
    finally:
        sys.path.remove(str(ROOT / "bench"))
    low = floors()
    # typer < 0.16 fails with the click >= 8.2 pip installs beside it (docs/development.md).
    assert _version(low["typer"]) >= (0, 16), low["typer"]
    assert _version(typer.__version__) >= _version(low["typer"])
    page = (ROOT / "docs" / "development.md").read_text()
    assert f"`typer>={low['typer']}`" in page  # the page says the floor pyproject declares
    assert "bench/results/floors.md" in page and (ROOT / "bench/results/floors.md").exists()
    assert f"typer>={low['typer']}" in (ROOT / "bench/results/floors.md").read_text()


def test_python_3_10_gets_tomli():
    from packaging.requirements import Requirement

    text = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"(?s)\ndependencies = \[(.*?)\n\]", text).group(1)
    reqs = [Requirement(d) for d in re.findall(r'"([^"]+)"', deps)]
    tomli = [r for r in reqs if r.name == "tomli"]
    assert tomli, "device_profiles imports tomli on Python 3.10: declare it"
    assert tomli[0].marker.evaluate({"python_version": "3.10"})
    assert not tomli[0].marker.evaluate({"python_version": "3.11"})
    python = re.search(r'requires-python = "([^"]+)"', text).group(1)
    assert python == ">=3.10"  # drop the tomli entry with 3.10


@pytest.mark.parametrize(
    "args",
    [
        ["eval", "g.onnx", "--dataset", "mnist", "--dataset", "digits"],
        ["deploy", "g.onnx", "--profile=wristband", "--profile", "smartphone"],
        ["data", "partition", "-d", "digits", "--dataset", "mnist"],
    ],
    ids=lambda a: a[0],
)
def test_an_option_given_twice_with_two_values_is_refused(args):
    """click keeps the last value without a word: `eval --dataset mnist --dataset digits`
    evaluated digits."""
    r = CliRunner().invoke(app, args)
    text = " ".join(r.output.split())
    assert r.exit_code == 2 and "given twice, as" in text and "fix: give --" in text, text


def test_an_option_given_twice_with_one_value_is_not_refused_for_it():
    same = CliRunner().invoke(app, ["eval", "g.onnx", "--dataset", "digits", "--dataset=digits"])
    assert same.exit_code == 2 and "given twice" not in same.output, same.output  # no g.onnx
