"""Searches say up front how long their settings will take and which flags shorten it (issue 34
item 2); timing the estimate never changes what the search finds."""

from __future__ import annotations

from edgefl.client.run import ClientJob, _local_data
from edgefl.search import PSOConfig, search_architecture


def _search(estimate: bool, said: list[str]):
    profile, _, info, train_idx, _, local = _local_data(
        ClientJob(profile="wristband", dataset="digits", num_clients=4)
    )
    cfg = PSOConfig(particles=3, generations=1, candidate_epochs=1)
    return search_architecture(
        profile,
        info,
        local,
        samples=len(train_idx),
        seed=3,
        config=cfg,
        on_status=said.append,
        estimate=estimate,
    )


def test_the_estimate_comes_first_and_changes_nothing():
    said, quiet = [], []
    with_estimate, without = _search(True, said), _search(False, quiet)
    assert [(c.arch, c.fitness) for c in with_estimate.candidates] == [
        (c.arch, c.fitness) for c in without.candidates
    ]
    assert with_estimate.best.arch == without.best.arch
    line = next(i for i, s in enumerate(said) if s.startswith("this will take about"))
    assert line == 1 and not any("this will take" in s for s in quiet)  # before any candidate
    for flag in ("--particles", "--generations", "--candidate-epochs"):
        assert flag in said[line]
    # An upper bound on this search (repeats are not retrained), not a wild one.
    assert 0 < with_estimate.estimate_seconds < 50 * max(with_estimate.seconds, 1)
    assert "6 candidates" in said[0]  # particles x (generations + 1)


def test_cli_says_the_estimate_with_its_flags(cli):
    r = cli(
        "search",
        "--profile",
        "wristband",
        "--dataset",
        "digits",
        "--num-clients",
        "4",
        "--particles",
        "2",
        "--generations",
        "0",
    )
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "this will take about" in text and "--fitness-samples" in text, text
    assert text.index("this will take about") < text.index("search candidate")
