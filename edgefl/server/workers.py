"""Tasks run side by side in worker processes forked from the server (`server fuse` and
`simulate` with several methods on a CPU): each worker inherits the ingested uploads
copy-on-write instead of reading them again.

Each worker has its own pipe to the server and nothing shared besides, so a worker killed at any
moment (the kernel's out-of-memory killer, a crash in native code) cannot leave a lock held that
the others wait on: its task gets a `Died` outcome, a fresh worker takes its place and the run
goes on (with a `multiprocessing.Pool` the run waited forever for the lost task). The workers'
lines and progress steps come back through their pipes to the server, which alone draws them (a
terminal's progress bars live here; a forked copy could not redraw them).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing
import os
import pickle
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import wait
from typing import Any

import torch

from edgefl.errors import ConfigError, EdgeflError, FusionError
from edgefl.outputs import deferred_signals
from edgefl.server.ingest import default_jobs
from edgefl.server.plan import FuseRun, Planned


@dataclass(frozen=True)
class Died:
    """The outcome of a task whose worker ended without answering."""

    exitcode: int | None

    @property
    def why(self) -> str:
        code = self.exitcode
        if code is not None and code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
            killed = " (killed: out of memory?)" if -code == signal.SIGKILL else ""
            return f"its worker process died by signal {name}{killed}"
        return f"its worker process exited with code {code} without an answer"


# A task's work: work(task, log, progress) -> a picklable result, run in a worker.
Work = Callable[[int, Callable[[str], None], Callable[..., None]], Any]


def run_forked(tasks: Sequence[int], work: Work, workers: int, log, progress) -> dict[int, Any]:
    """work(task) for every task, in this order, on `workers` forked processes (the cores'
    torch threads shared among them): {task: its result, or Died}. An exception raised by a
    task stops new tasks from starting, lets the running ones finish (their outputs are whole
    units) and is raised here; Ctrl-C here ends every worker at once."""
    crew = _Crew(list(tasks), work, workers, log, progress)
    _flush()  # lines still buffered here would otherwise be printed again by every worker
    # A worker that garbage-collects an onnxruntime session made here (an upload's or the
    # screen's, left in a reference cycle) waits forever in its destructor for this process's
    # runtime threads, which the fork did not copy. Collected here, where they run, then frozen:
    # a worker's collector never looks at what it inherited.
    gc.collect()
    gc.freeze()
    try:
        for _ in range(min(workers, len(crew.pending))):
            crew.start()
        while crew.busy:
            by_sentinel = {proc.sentinel: conn for conn, (proc, _) in crew.busy.items()}
            for ready in wait([*crew.busy, *by_sentinel]):
                conn = by_sentinel.get(ready, ready)
                if conn in crew.busy:  # not already seen ending through its other handle
                    crew.answer(conn)
    finally:
        crew.stop()
        gc.unfreeze()
    if crew.raised:
        raise crew.raised[0]
    return crew.done


class _Crew:
    """The workers, each with its pipe and the task it holds, and what they have answered."""

    def __init__(self, pending: list[int], work: Work, workers: int, log, progress):
        self.ctx = multiprocessing.get_context("fork")
        self.pending, self.work, self.log, self.progress = pending, work, log, progress
        # The threads this process may use (torch's count: OMP_NUM_THREADS where it is set, so a
        # one-thread run stays one thread in a lone worker), shared among the workers.
        self.threads = max(1, min(os.cpu_count() or 1, torch.get_num_threads()) // workers)
        self.busy: dict[Any, list] = {}  # connection -> [process, task or None]
        self.done: dict[int, Any] = {}
        self.raised: list[BaseException] = []
        self.forker = _Forker()

    def start(self) -> None:
        here, there = self.ctx.Pipe()
        args = (os.getpid(), there, self.work, self.threads)
        proc = self.ctx.Process(target=_serve, args=args, daemon=True)
        # Ctrl-C or SIGTERM handled inside the fork's after-fork callbacks (logging's lock
        # release) would be swallowed there and the run would go on: they act once the worker
        # is known here (stop() ends it). Python-level: a thread mask would not hold a signal
        # the kernel hands to another of this process's threads.
        with deferred_signals():
            self.forker.start(proc)
            there.close()
            self.busy[here] = [proc, None]
        self.give(here)

    def give(self, conn) -> None:
        task = self.pending.pop(0) if self.pending and not self.raised else None
        try:
            conn.send(task)  # None: no more work, the worker exits
        except OSError:  # it ended since its last answer: the task waits for another worker
            if task is not None:
                self.pending.insert(0, task)
            task = None
        self.busy[conn][1] = task

    def answer(self, conn) -> None:
        """One message from a worker, or its end."""
        proc, task = self.busy[conn]
        try:
            kind, value = conn.recv()
        except (EOFError, OSError):  # it ended: after its last task, or killed during one
            proc.join()
            del self.busy[conn]
            conn.close()
            if task is not None:
                self.done[task] = Died(proc.exitcode)
            if self.pending and not self.raised:
                self.start()  # the run goes on with a fresh worker
            return
        if kind == "log":
            self.log(*value)
        elif kind == "progress":
            self.progress(*value)
        else:  # "done" or "raised": the worker is free again
            if kind == "raised":
                self.raised.append(value)
            else:
                self.done[task] = value
            self.give(conn)

    def stop(self) -> None:
        for conn, (proc, _) in self.busy.items():
            proc.terminate()
            proc.join(1.0)
            if proc.is_alive():  # terminated before it set its own handlers: the copy of ours
                proc.kill()  # kept the signal for later
                proc.join()
            conn.close()
        self.busy.clear()
        self.forker.close()  # after its workers: their parent-death signal follows its thread


class _Forker:
    """Starts the workers from a thread of its own, which never runs torch.

    libgomp (torch's OpenMP) keeps a thread's pool of helper threads in that thread's own
    storage, and fork copies the storage but not the helpers: a worker forked from a thread that
    had run a parallel region waited forever in its first one (a futex in libgomp under a oneDNN
    convolution: `server fuse --method ensemble,fedavg --robust screen` on an idle 2-core machine,
    whose screen ran 2-thread convolutions before the fork and whose lone worker got both
    threads). Forked from this thread, a worker's thread has no pool and builds a fresh one.
    The thread lives as long as the crew: a worker's PR_SET_PDEATHSIG fires when the thread
    that forked it ends."""

    def __init__(self) -> None:
        self.requests: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="edgefl-forker", daemon=True)
        self.thread.start()

    def start(self, proc) -> None:
        done: queue.Queue = queue.Queue(maxsize=1)
        self.requests.put((proc, done))
        failed = done.get()
        if failed is not None:
            raise failed

    def close(self) -> None:
        if self.thread.is_alive():
            self.requests.put(None)
            self.thread.join()

    def _run(self) -> None:
        while (item := self.requests.get()) is not None:
            proc, done = item
            try:
                proc.start()
            except BaseException as exc:  # noqa: BLE001 - raised again in the crew's thread
                done.put(exc)
            else:
                done.put(None)


def _serve(parent: int, conn, work: Work, threads: int) -> None:
    _worker_start(parent)
    torch.set_num_threads(threads)  # the cores are shared: torch must not outnumber its share

    def log(msg: str) -> None:
        conn.send(("log", (msg,)))

    def progress(*args) -> None:
        conn.send(("progress", args))

    while (task := conn.recv()) is not None:
        try:
            answer = ("done", work(task, log, progress))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the server
            answer = ("raised", _portable(exc))
        finally:
            _flush()  # this task's lines, before the server prints its summary
        conn.send(answer)
    conn.close()


def _portable(exc: BaseException) -> BaseException:
    """The exception itself where it pickles, else its type, text and traceback as text."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - anything that does not survive the trip
        text = "".join(traceback.format_exception(exc))
        return RuntimeError(f"in a forked worker: {text}")
    return exc


def _worker_start(parent: int) -> None:
    """A forked worker ends with the server: on its SIGKILL too (PR_SET_PDEATHSIG), so no worker
    writes outputs after the command is gone. Ctrl-C and SIGTERM are the server's to handle (it
    terminates the workers); a worker printing its own traceback would only add noise."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the server died before the line above took effect
        os._exit(1)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.flush()


# --- methods of one fuse run, side by side ----------------------------------------------------


def method_workers(jobs: int | None, methods: int, device: torch.device) -> int:
    # fork only where it is safe and cheap: Linux, CPU (a CUDA context does not survive fork).
    if methods < 2 or device.type != "cpu" or sys.platform != "linux":
        return 1
    return max(1, min(methods, jobs if jobs is not None else default_jobs()))


def _work(p: Planned) -> float:
    """A rough size of a method's training (`Method.work`, else epochs x rounds x samples where
    it has them): the workers take the longest first, so that a long method does not start
    last."""
    if p.method.work is not None:
        return float(p.method.work(p.config))
    cfg = p.config.as_dict()
    size = 1.0
    for key in ("epochs", "rounds", "synthetic"):
        if isinstance(cfg.get(key), int):
            size *= cfg[key]
    return size


def fuse_forked(plans, run: FuseRun, workers: int, outcome) -> list:
    """Each planned method's `outcome(p, run)` (the pipeline's: (report, None) or (None, its
    refusal)), in order, from `workers` forked processes: those that train nothing first (their
    seconds; a lone worker would hold them behind a long method, and lose them if it fails),
    then the longest first."""
    order = sorted(range(len(plans)), key=lambda i: (plans[i].method.trains, -_work(plans[i])))

    def one(i: int, log, progress):
        try:
            report, error = outcome(plans[i], replace(run, log=log, progress=progress))
        except EdgeflError as exc:  # a user error met while fusing (e.g. no public set given)
            return None, ("raise", exc.message, exc.hint)
        # An exception crosses the process boundary as text: only its message and hint matter.
        return report, None if error is None else ("refused", error.message, error.hint)

    done = run_forked(order, one, workers, run.log, run.progress)
    outcomes = []
    for i, p in enumerate(plans):
        if isinstance(done[i], Died):
            why = f"{p.method.name}: {done[i].why} while fusing"
            run.log(why)
            hint = "run it alone (--method NAME) or with fewer at once (--jobs 1)"
            outcomes.append((None, FusionError(why, hint=hint)))
            continue
        report, error = done[i]
        if error is not None and error[0] == "raise":
            raise ConfigError(error[1], hint=error[2])
        outcomes.append((report, None if error is None else FusionError(*error[1:])))
    return outcomes
