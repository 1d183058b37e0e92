"""Names a person chose (a client id, a folder) are printed as written, never read as Rich
markup: `client train --client-id 'lab[red]x'` printed `labx`, and an upload path that is not
where the file is."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_client_train_prints_its_id_and_folder_as_written(cli, tmp_path):
    out = tmp_path / "dir[red]x[/]"
    r = cli(
        "client", "train", "--profile", "smartphone", "--dataset", "digits",
        "--num-clients", "3", "--model", "mlp", "--epochs", "1", "--out", str(out),
        "--client-id", "lab[bold]x",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    said = "".join(r.output.split("\n"))  # the console wraps long lines
    assert (out / "lab[bold]x.onnx").is_file()
    assert "lab[bold]x (smartphone)" in said, said
    assert str(out / "lab[bold]x.onnx") in said, said
