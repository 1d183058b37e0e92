"""device_profiles must work from an installed wheel, not only from a checkout."""

import subprocess
import sys
import zipfile

import pytest


@pytest.mark.slow
def test_wheel_ships_profiles_and_loads_them(tmp_path):
    repo = __import__("pathlib").Path(__file__).resolve().parents[2]
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(repo),
        ],
        capture_output=True,
        text=True,
    )
    if build.returncode != 0:
        pytest.fail(build.stderr[-2000:])
    (wheel,) = (tmp_path / "dist").glob("edgefl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for profile in (
        "mcu",
        "wristband",
        "smartwatch",
        "smartphone",
        "raspberry-pi-5",
        "jetson-orin-nano",
        "server-gpu",
    ):
        assert f"device_profiles/{profile}.toml" in names
    # Load from the unpacked wheel alone, away from the checkout.
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        f"import device_profiles as d; assert d.__file__.startswith({str(site)!r}); "
        "print(d.load_profile('wristband').ram_bytes)"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(site)},
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "1441792"
