import os
import re

# One torch thread per test process: on a shared 2-core machine, two threads contending with
# neighbours were measured 4x slower in wall time than one. Set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
# Then what the `edgefl` command sets at start (edgefl.threads: never spin, fork-safe MKL), so
# that the code under test, and every process a test starts, runs as under the command.
from edgefl.threads import share_cores_politely  # noqa: E402

share_cores_politely()
# Tests must not depend on the caller's terminal width.
os.environ.setdefault("COLUMNS", "160")
# Exported graphs kept for later processes (exporters/graph_cache.py) in the test run's own
# folder, not the user's cache; the suite's processes share it (each skips the first trace).
os.environ.setdefault(
    "EDGEFL_CACHE_DIR",
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".pytest_cache"),
)

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)


# `make test` runs the tests on two workers, and two kinds in processes of their own:
# - `serial`: alone, after the rest. Flower's simulation engine (Ray): beside the workers its
#   run took 393 s instead of 47 (2026-11-28).
# - `beside`: in a pytest process beside the workers. A real Flower deployment, whose round
#   mostly waits (on the nodes' start-up, on its deadline): run alone, it held the machine
#   75 s for ~30 s of CPU; its deadline allows for the load.
# A module named here has every test marked; a test elsewhere is marked by hand.
LANES = {"serial": {"test_flower_engine.py"}, "beside": {"test_flower_deploy.py"}}
# The files that take longest, longest first (a fresh clone's `make test`, 2026-11-28): the two
# workers are dealt files in collection order (`--no-loadscope-reorder`), so the last dealt are
# short and neither worker idles at the end (dealt by test count, a 37 s file came last: the
# other worker waited 24 s).
LONGEST_FIRST = (
    "test_tour.py",
    "test_docs_commands.py",
    "test_demo.py",
    "test_fuse_stopped.py",
    "test_datafree.py",
    "test_deploy.py",
    "test_simulate.py",
    "test_fusion.py",
    "test_progress.py",
    "test_own_uploads.py",
    "test_hostile_strings.py",
    "test_reproduce.py",
    "test_attacks.py",
)


def pytest_ignore_collect(collection_path, config):
    """`-m serial` (or `-m beside`) alone: a test file that never writes `mark.serial` holds
    no such test, and importing all of them costs seconds."""
    lane = config.option.markexpr
    if lane not in LANES or collection_path.suffix != ".py":
        return None
    name = collection_path.name
    if not name.startswith("test_") or name in LANES[lane]:
        return None
    return True if f"mark.{lane}" not in collection_path.read_text() else None


# `make test-fast` leaves out `slow` tests: those marked by hand, and those over SLOW_S in the
# recorded full run (tests/durations.json, written by `make durations`). A file whose tests
# share a fixture wider than a test (or run as ordered steps on one) moves as one: in the fast
# lane whole if it took SHARED_S at most, else not at all (its cheap tests would still pay the
# shared setup, which the record counts against the first).
SLOW_S, SHARED_S = 1.0, 5.0


def pytest_collection_modifyitems(config, items):
    from durations import load

    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's order
    seconds = load()
    per_file: dict[str, float] = {}
    for nodeid, s in seconds.items():
        path = nodeid.split("::")[0]
        per_file[path] = per_file.get(path, 0.0) + s
    shares: dict = {}
    for item in items:
        for lane, modules in LANES.items():
            if item.path.name in modules:
                item.add_marker(getattr(pytest.mark, lane))
        if item.path not in shares:
            shares[item.path] = re.search(r"scope=.(module|class|session)", item.path.read_text())
        if shares[item.path]:
            slow = per_file.get(item.nodeid.split("::")[0], 0.0) > SHARED_S
        else:
            slow = seconds.get(item.nodeid, 0.0) > SLOW_S
        if slow:
            item.add_marker(pytest.mark.slow)


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


@pytest.fixture(scope="module")
def one_torch_thread():
    """One intra-op thread for a whole module of tiny nets on 2 shared cores (a second thread
    only adds contention), restored after it: `pytestmark = usefixtures("one_torch_thread")`."""
    from edgefl.training import one_thread

    with one_thread():
        yield
