"""The screen's verdict on a federation (who is left out and why, who is used changed) and
its one use: each method's share of it (`apply`). Below every step: each returns a Verdict."""

from __future__ import annotations

import dataclasses

from edgefl.artifacts import Upload


@dataclasses.dataclass
class Verdict:
    """The screen's judgement of a whole federation, made once per ingest and applied to each
    method's own uploads: who is left out and why, who is used changed (repaired, tempered)."""

    out: dict[str, str]  # upload name -> why it is screened out
    swap: dict[str, Upload]  # upload name -> the changed copy used in its place
    notes: list[tuple[str | None, str]]  # (the upload it is about, or None for all; the note)
    seconds: float = 0.0

    def merge(self, other: Verdict) -> None:
        self.out |= other.out
        self.swap |= other.swap
        self.notes += other.notes


def apply(verdict: Verdict, usable: list[Upload], log=None):
    """A method's share of the verdict: (its uploads kept, changed ones swapped in, [{file,
    client_id, kind, reason}] for its uploads screened out, the notes)."""
    log = log or (lambda msg: None)
    kept = [verdict.swap.get(u.name, u) for u in usable if u.name not in verdict.out]
    screened = [
        {"file": u.name, "client_id": u.client_id, "kind": u.kind, "reason": verdict.out[u.name]}
        for u in usable
        if u.name in verdict.out
    ]
    for s in screened:
        log(f"screened out {s['file']} ({s['kind']}): {s['reason']}")
    names = {u.name for u in usable}
    return kept, screened, [text for name, text in verdict.notes if name is None or name in names]


def _note(text: str) -> Verdict:
    return Verdict({}, {}, [(None, text)])
