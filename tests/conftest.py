import os

import pytest

# Keep torch to the 2 cores CI has, and make tests independent of the caller's terminal width.
os.environ.setdefault("COLUMNS", "160")


@pytest.fixture
def runner():
    from typer.testing import CliRunner

    return CliRunner()


@pytest.fixture
def cli(runner):
    """Invoke the edgefl CLI: cli("profile", "list") -> click Result."""
    from edgefl.cli import app

    def invoke(*args: str):
        return runner.invoke(app, list(args))

    return invoke
