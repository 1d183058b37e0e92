"""Clients trained one after another or in `--jobs` spawned workers, each single-threaded as a
device is (so `--jobs` never changes a result bit), their own long steps (DP-SGD, a search)
relayed to the run's progress: simulate's clients, and the jobs a method's clients run again
(FedGH's prototypes under --dp)."""

from __future__ import annotations

import multiprocessing
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from edgefl.client.job import ClientJob
from edgefl.client.run import run_client
from edgefl.progress import no_progress
from edgefl.simulate.resume import finished
from edgefl.threads import share_cores_politely
from edgefl.training import one_thread


def train_jobs(
    cjobs: list[ClientJob], todo: list[int], jobs: int, log, progress=no_progress, done: int = 0
) -> dict[int, dict]:
    """{index: result} of the jobs `todo` of `cjobs`: in this process when `jobs` is 1 or one
    is left, else in `jobs` workers (`done`: those already finished, for the count)."""
    progress("clients trained", done, len(cjobs))
    if jobs > 1 and len(todo) > 1:
        return _train_pooled(cjobs, todo, jobs, log, progress, done)
    results = {}
    for i in todo:
        log(f"training client {i} ({cjobs[i].profile}, {cjobs[i].model})")
        # its own steps where they are long (DP-SGD, a search), as `client train` shows them
        results[i] = _train_one(cjobs[i], _client_progress(progress, i))
        done += 1
        progress("clients trained", done, len(cjobs), f"client {i}")
    return results


def _train_one(cjob: ClientJob, on_progress=None) -> dict:
    with one_thread():  # like a device; and --jobs never changes a result bit
        result = run_client(cjob, on_progress=on_progress)
    if not cjob.keep_model:
        return result.as_dict()
    # Report the kept model as the client's model upload, the predictions beside it.
    summary = finished(cjob)
    return summary | {"reused": False}


def _client_progress(progress, i: int):
    """`progress` for client i's own tasks (DP-SGD's steps, a search's), each its own task:
    clients trained side by side each get their own rate and ETA."""

    def relay(task: str, done: int, total: int, note: str = "") -> None:
        progress(f"{task}, client {i}", done, total, note)

    return relay


def _train_pooled(cjobs, todo, jobs: int, log, progress, done: int) -> dict[int, dict]:
    """{client index: its result} for the clients `todo`, trained in `jobs` spawned workers,
    each relaying its own steps through a queue (at most one a second, and its last) to
    `progress` (`done`: the clients already finished, for the count)."""
    ctx = multiprocessing.get_context("spawn")  # fork + torch threads is unsafe
    with ctx.Manager() as manager:
        steps = manager.Queue()
        # A spawned worker starts afresh: edgefl's thread settings before it loads torch.
        with ProcessPoolExecutor(
            max_workers=jobs, mp_context=ctx, initializer=share_cores_politely
        ) as pool:
            futures = {pool.submit(_train_relayed, cjobs[i], i, steps): i for i in todo}
            results, pending = {}, set(futures)
            while pending:
                ended, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                _drain(steps, progress)
                for fut in ended:
                    i = futures[fut]
                    results[i] = fut.result()
                    done += 1
                    log(f"client {i} done ({cjobs[i].profile}, {results[i]['model']})")
                    progress("clients trained", done, len(cjobs), f"client {i}")
            _drain(steps, progress)
    return results


def _drain(steps, progress) -> None:
    while not steps.empty():
        i, task, d, total, note = steps.get()
        _client_progress(progress, i)(task, d, total, note)


def _train_relayed(cjob: ClientJob, i: int, steps) -> dict:
    """`_train_one` in a worker, its steps put on the `steps` queue (throttled: a queue put
    is a round trip to the manager, a DP-SGD step of a tiny model a few milliseconds)."""
    last = 0.0

    def relay(task: str, d: int, total: int, note: str = "") -> None:
        nonlocal last
        now = time.monotonic()
        if d >= total or now - last >= 1.0:
            last = now
            steps.put((i, task, d, total, note))

    return _train_one(cjob, relay)
