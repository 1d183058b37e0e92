"""The foundation's commands through typer's CliRunner."""

import json


def test_profile_list_and_show(cli):
    r = cli("profile", "list")
    assert r.exit_code == 0 and "wristband" in r.output
    r = cli("profile", "show", "wristband", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["ram_bytes"] == 1_441_792


def test_unknown_profile_exit_2(cli):
    r = cli("profile", "show", "wristbnd")
    assert r.exit_code == 2
    assert "did you mean 'wristband'" in r.output and "Traceback" not in r.output


def test_bad_profile_file_exit_2(cli, tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('name = "x"\n')
    r = cli("profile", "show", str(path))
    assert r.exit_code == 2 and "ram_bytes: missing" in r.output and "[training]" in r.output


def test_models_json(cli):
    r = cli("models", "--dataset", "mnist", "--profile", "wristband", "--json")
    assert r.exit_code == 0
    rows = {row["name"]: row for row in json.loads(r.output)}
    for key in (
        "name",
        "role",
        "params",
        "macs",
        "flops",
        "weight_bytes",
        "infer_peak_bytes",
        "train_bytes",
        "fits",
        "reasons",
    ):
        assert key in rows["cnn"]
    assert rows["vgg9"]["macs"] == 126_467_584 and rows["vgg9"]["fits"] is False
    assert any("training memory" in reason for reason in rows["cvae-small"]["reasons"])
    assert rows["cvae-small"]["role"] == "generator"


def test_models_table_and_unknown_dataset(cli):
    r = cli("models", "--dataset", "mnist", "--profile", "mcu")
    assert r.exit_code == 0 and "126,467,584" in r.output
    r = cli("models", "--dataset", "mnits")
    assert r.exit_code == 2 and "did you mean 'mnist'" in r.output


def test_models_shows_a_profile_name_as_written_and_refuses_samples_without_one(cli, tmp_path):
    from importlib import resources

    band = (resources.files("device_profiles") / "wristband.toml").read_text()
    mine = tmp_path / "mine.toml"
    mine.write_text(band.replace('name = "wristband"', 'name = "band[/]"'))
    r = cli("models", "--dataset", "digits", "--profile", str(mine))
    assert r.exit_code == 0 and "fits band[/]" in r.output, r.output  # not a markup error
    r = cli("models", "--dataset", "digits", "--samples", "500")
    said = " ".join(r.output.split())
    assert r.exit_code == 2 and "without --profile it would change nothing" in said, said


def test_client_plan(cli):
    r = cli("client", "plan", "--profile", "wristband", "--dataset", "mnist", "--json")
    assert r.exit_code == 0
    p = json.loads(r.output)
    assert p["role"] == "generator" and p["fit"]["fits"]
    assert p["fit"]["train_bytes"] <= p["budget"]["ram_budget_bytes"]
    r = cli("client", "plan", "--profile", "smartphone", "--dataset", "mnist")
    assert r.exit_code == 0 and "classifier" in r.output
    r = cli("client", "plan", "--profile", "smartphone", "--role", "teacher")
    assert r.exit_code == 2 and "--role" in r.output


def test_version(cli):
    from importlib.metadata import version

    r = cli("--version")
    assert r.exit_code == 0 and r.output.strip() == f"edgefl {version('edgefl')}"


def test_narration_goes_to_stderr_only_while_asked_and_binds_no_stream():
    """demo --json's narration on stderr; afterwards the console writes to whatever stdout
    then is (a test runner swaps it), not to the stream of the call that asked."""
    import contextlib
    import io

    from edgefl.cli.common import console, narration_on_stderr

    out, err, later = io.StringIO(), io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        with narration_on_stderr(True):
            console.print("told")
        console.print("after")
    with contextlib.redirect_stdout(later):
        console.print("next call")
    assert (out.getvalue(), err.getvalue(), later.getvalue()) == (
        "after\n",
        "told\n",
        "next call\n",
    )
