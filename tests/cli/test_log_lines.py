"""A refusal is logged line by line (edgefl.progress.log_lines): the uploads it went without
each on a line of their own, not run together with "\\x0a" as a run's log escapes a newline
inside one line; a newline inside an upload's name stays escaped on its own line."""

from __future__ import annotations

from edgefl.progress import log_lines, printable
from edgefl.server.selection import why_not


def test_a_refusal_keeps_its_lines_and_a_forged_name_stays_escaped():
    message = "ensemble refused: none of 2 uploads can be used" + why_not(
        [], [("a.onnx", "decoder artifacts are not used"), ("b\nfused 99%.onnx", "decoder")]
    )
    shown = []
    log_lines(lambda line: shown.append(printable(line)), message)  # as the run's log prints
    assert shown[0] == "ensemble refused: none of 2 uploads can be used"
    assert shown[1] == "  not used a.onnx: decoder artifacts are not used"
    assert shown[2] == "  not used b\\x0afused 99%.onnx: decoder"  # no forged line
    assert len(shown) == 3 and not any("\\x0a  not used" in line for line in shown)
