"""`edgefl simulate --engine flower`: the clients of a simulation run as Flower ClientApps under
Flower's simulation engine (Ray), dealt to a few SuperNodes (`worker_nodes`), each training the
very ClientJob the local engine would run (so the weights and accuracies are the same); the
ServerApp collects the replies, checks and lands them where the local engine writes its
uploads; fusion then goes on as in any simulate. Resumable like the local engine: a finished
upload is not retrained.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path

import exporters
from edgefl.errors import ConfigError
from edgefl.flower import load_simulation, require_flower
from edgefl.flower.client_app import make_client_app
from edgefl.flower.collect import Collected, dispatch, wait_for_nodes
from edgefl.flower.resources import Group, available_memory, client_resources, plan_groups
from edgefl.progress import no_progress
from edgefl.simulate.job import SimJob
from edgefl.simulate.resume import finished
from edgefl.simulate.run import check_attackers, client_jobs, with_attacks


def train_clients_flower(job: SimJob, log, progress=no_progress) -> list[dict]:
    """The local engine's `train_clients`, on Flower: same jobs, same results list. Each client
    asks the host for what its profile's model needs (`resources`); clients that may run equally
    many at a time share one simulation."""
    require_flower()
    cjobs = client_jobs(job)
    check_attackers(job, cjobs)
    results = _reused(cjobs, log)
    todo = [i for i, r in enumerate(results) if r is None]
    if not todo:
        return with_attacks(results, cjobs)
    gpu = job.train_device in ("cuda", "auto") and _cuda()
    needs = {i: client_resources(cjobs[i], gpu) for i in todo}
    memory = available_memory()
    for group in plan_groups([needs[i] for i in todo], job.jobs, memory):
        ids = [todo[k] for k in group.clients]
        log(_group_line([needs[i] for i in ids], group, memory))
        before = sum(r is not None for r in results)

        def overall(task, done, total, note="", before=before):  # one count over every run
            progress(task, before + done, len(cjobs), note)

        got = _run_group([cjobs[i] for i in ids], group, log, overall)
        for i, summary in _check(got, ids, cjobs).items():
            resources = needs[i].as_dict() | {"at_once": group.at_once}
            results[i] = summary | {"host_resources": resources}
    return with_attacks(results, cjobs)


def _reused(cjobs, log) -> list[dict | None]:
    """Each client's finished upload (None where it is still to train), as a rerun resumes."""
    results: list[dict | None] = [finished(c) for c in cjobs]
    reused = sum(r is not None for r in results)
    if reused:
        log(f"reusing {reused} finished upload(s)")
    return results


def _group_line(needs, group: Group, memory: int) -> str:
    """What one simulation of `group` runs and asks of the host (`needs`: its clients')."""
    kinds = ", ".join(dict.fromkeys(f"{n.profile} ({n.model})" for n in needs))
    most = max(n.memory_bytes for n in needs) / 2**30
    return (
        f"Flower's simulation engine: {len(needs)} SuperNode(s), {kinds}: {group.num_cpus} "
        f"core and ~{most:.1f} GiB each, {group.at_once} at a time "
        f"({memory / 2**30:.1f} GiB available)"
    )


def worker_nodes(clients: int, at_once: int) -> int:
    """SuperNodes for a run: two per client Flower may train at a time, so that one queued job
    waits for each worker as it frees (never more nodes than clients)."""
    return max(1, min(clients, 2 * at_once))


def _run_group(cjobs, group: Group, log, progress) -> Collected:
    # A message holds one job, not the run's table (which made each message grow with the run:
    # 0.67 MB at 1,000 clients); a few nodes take the jobs in turn (collect.dispatch says why).
    jobs = [{"job": asdict(c)} for c in cjobs]
    box: dict[str, Collected] = {}
    nodes = worker_nodes(len(cjobs), group.at_once)
    stopped = threading.Event()

    def told(text: str) -> None:  # after Ctrl-C, the nodes' deaths it caused are not news
        if not stopped.is_set():
            log(text)

    def moved(task: str, done: int, total: int, note: str = "") -> None:  # nor "trained"
        if not stopped.is_set():
            progress(task, done, total, note)

    def main(grid, context) -> None:
        box["got"] = dispatch(
            grid,
            wait_for_nodes(grid, nodes, 120.0, told),
            jobs,
            max_bytes=exporters.DEFAULT_MAX_UPLOAD_BYTES,
            log=told,
            progress=moved,
        )

    _run(main, nodes, group, stopped)
    if "got" not in box:
        raise ConfigError(
            "Flower's simulation ended before the server collected any reply",
            hint="see Flower's log above; --engine local runs the same clients",
        )
    return box["got"]


def _check(got: Collected, ids: list[int], cjobs) -> dict[int, dict]:
    """Each client's landed upload by its index (`got` is keyed by position in `ids`); a
    failed, missing or misdirected one stops the simulation (a rerun resumes from the uploads
    already landed)."""
    problems = got.refused | dict.fromkeys(got.missing, "no reply")
    if problems:
        shown = "; ".join(f"client {ids[k]}: {ascii(w)[1:-1]}" for k, w in sorted(problems.items()))
        raise ConfigError(
            f"{len(problems)} simulated client(s) failed: {shown}",
            hint="rerun to resume (finished uploads are kept), or try --engine local",
        )
    out: dict[int, dict] = {}
    for k, rep in got.replies.items():
        i = rep.summary.get("client_index")
        if type(i) is not int or i != ids[k]:
            raise ConfigError(
                f"a simulated client replied for client index {i!r}, not its own",
                hint="run the edgefl ClientApp of this edgefl version on every node",
            )
        out[i] = _land(cjobs[i], rep)
    return out


train_clients_flower.engine = "flower"  # simulate records where the clients ran


def _land(cjob, rep) -> dict:
    """Put a reply's files where the local engine writes them, each checked as an artifact in
    a private folder first and then renamed into place (so a file there is always complete)."""
    name = f"client-{cjob.client_index:03d}.onnx"
    targets = {"upload": Path(cjob.out_dir) / name}
    if cjob.keep_model:
        targets["model"] = Path(cjob.keep_model) / name
    for role, target in targets.items():
        if role not in rep.files:
            raise ConfigError(
                f"simulated client {cjob.client_index} sent no {role}",
                hint="run the edgefl ClientApp of this edgefl version on every node",
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".landing-") as tmp:
            staged = Path(tmp) / name
            staged.write_bytes(rep.files[role])
            exporters.read_artifact(staged)  # a file that is not an edgefl artifact stops here
            os.replace(staged, target)
    if cjob.keep_model:  # as the local engine reports a predictions client: its kept model
        return finished(cjob) | {"reused": False}
    return rep.summary | {"path": str(targets["upload"])}


def _ray_init_args(group: Group) -> dict:
    """`ray.init`'s arguments for one run. edgefl starts Ray itself (Flower's engine then uses
    it) for the worker setup hook: every actor loads Flower's simulation package as the driver
    does, without TensorFlow (`load_simulation`). Flower's own start would pass only the
    driver's import path."""
    return {
        "runtime_env": {
            "env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)},
            "worker_process_setup_hook": f"{load_simulation.__module__}.{load_simulation.__name__}",
        },
        # Flower sizes its actor pool by cores: offering the run `at_once` clients' worth of
        # cores is what bounds how many train at a time (by --jobs and by memory).
        "num_cpus": group.num_cpus * group.at_once,
        "log_to_driver": False,
        "include_dashboard": False,
    }


class _Until(logging.Filter):
    """Flower's records until `stopped`: Ctrl-C reaches Ray's actors too, and Flower logs each
    one's death with a 30-line traceback that tells a user who stopped the run nothing."""

    def __init__(self, stopped: threading.Event) -> None:
        super().__init__()
        self.stopped = stopped

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.stopped.is_set()


@contextlib.contextmanager
def _noted_interrupt(stopped: threading.Event):
    """Ctrl-C sets `stopped` first (before the actors' deaths are logged), then interrupts as
    usual; outside the main thread, signals are not this run's to take."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupted(signum, frame) -> None:
        stopped.set()
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _run(main, nodes: int, group: Group, stopped: threading.Event) -> None:
    import ray

    load_simulation()
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    server = ServerApp()
    server.main()(main)
    backend = {"client_resources": {"num_cpus": group.num_cpus, "num_gpus": group.num_gpus}}
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # Ray's FutureWarning
    quiet = logging.getLogger("flwr")
    level = quiet.level
    # edgefl's own progress says what happens; Flower's notice that run_simulation is deprecated
    # (for `flwr run`, which needs an app folder and a SuperLink) is not the user's to act on.
    quiet.setLevel(logging.ERROR)
    until = _Until(stopped)
    for handler in quiet.handlers:
        handler.addFilter(until)
    try:
        if not ray.is_initialized():  # one already started is used as it is, as Flower would
            ray.init(**_ray_init_args(group))
        with _noted_interrupt(stopped):
            run_simulation(
                server_app=server,
                client_app=make_client_app(),
                num_supernodes=nodes,
                backend_config=backend,
            )
    finally:
        quiet.setLevel(level)
        for handler in quiet.handlers:
            handler.removeFilter(until)
        if ray.is_initialized():  # Flower shuts it down when its run ends normally
            ray.shutdown()


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
