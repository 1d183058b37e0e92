"""The ONNX boundary and the profiles stand alone: they never import edgefl."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("package", ["exporters", "device_profiles"])
def test_package_does_not_import_edgefl(package):
    code = (
        f"import sys, {package}; "
        "bad = sorted(m for m in sys.modules if m == 'edgefl' or m.startswith('edgefl.')); "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
