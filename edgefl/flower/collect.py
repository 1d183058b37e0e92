"""The server's one round: wait for the nodes, send each one `train` message, and take each
reply as it comes until all have answered or the deadline passes. A node that fails, sends
something malformed or never answers is named in the outcome; it never sinks the others.
A simulation instead deals its clients' jobs to a few nodes, the next job to whichever node
answers (`dispatch`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from edgefl.flower import wire
from edgefl.progress import no_progress


@dataclass
class Collected:
    # Keyed by node id (by job position after a `dispatch`).
    replies: dict[int, wire.Reply] = field(default_factory=dict)  # -> checked reply
    refused: dict[int, str] = field(default_factory=dict)  # -> why
    missing: list[int] = field(default_factory=list)  # sent a message, no reply in time
    seconds: float = 0.0


def wait_for_nodes(grid, want: int, wait_s: float, log) -> list[int]:
    """The connected nodes, once `want` have joined or `wait_s` has passed."""
    end = time.monotonic() + wait_s
    nodes = sorted(grid.get_node_ids())
    while len(nodes) < want and time.monotonic() < end:
        time.sleep(0.5)
        nodes = sorted(grid.get_node_ids())
    log(f"{len(nodes)} node(s) connected (waited for {want})")
    return nodes


def collect(
    grid,
    nodes: list[int],
    settings: dict[str, Any],
    *,
    deadline_s: float | None,
    max_bytes: int,
    public=None,
    files=None,
    log=None,
    progress=no_progress,
) -> Collected:
    """Send every node the train message and take each reply as it comes."""
    log = log or (lambda m: None)
    start = time.monotonic()
    out = Collected()
    msgs = [_train(settings, n, public, files) for n in nodes]
    ids = {mid: n for mid, n in zip(grid.push_messages(msgs), nodes, strict=True) if mid}
    waiting = dict(ids)
    progress("clients trained", 0, len(nodes))
    end = None if deadline_s is None else start + deadline_s
    for node, msg in _arrivals(grid, waiting, end):
        _take(out, node, msg, max_bytes, log)
        who = _named(out, node, f"node {node}")
        progress("clients trained", len(nodes) - len(waiting), len(nodes), who)
    out.missing = sorted(waiting.values()) + sorted(set(nodes) - set(ids.values()))
    within = "" if deadline_s is None else f" within the deadline ({deadline_s:g} s)"
    for node in out.missing:  # never sent (no message id), or no reply by the deadline
        log(f"node {node}: no reply{within}; going on without it")
    out.seconds = time.monotonic() - start
    return out


def dispatch(
    grid, nodes: list[int], jobs: list[dict[str, Any]], *, max_bytes: int, log, progress
) -> Collected:
    """A simulation's round: each job (a train message's settings) runs once, on one of the
    `nodes`, each node holding one job at a time; whichever node answers is sent the next.
    The outcome is keyed by job position, not node. Why not a node per client: Flower's
    simulation runtime looks for messages node by node ten times a second, so its cost per
    message grew with the number of nodes (0.53 s a client at 200 nodes, 0.76 s at 1,000)."""
    start = time.monotonic()
    out = Collected()
    queue = list(range(len(jobs)))[::-1]  # popped from the end: job 0 first
    waiting: dict[str, tuple[int, int]] = {}  # message id -> (node, job)

    def send(node: int) -> None:
        while queue:  # a job whose message was not taken is missing; the node tries the next
            k = queue.pop()
            (mid,) = grid.push_messages([_train(jobs[k], node)])
            if mid:
                waiting[mid] = (node, k)
                return
            out.missing.append(k)

    for node in nodes:
        send(node)
    progress("clients trained", 0, len(jobs))
    for done, ((node, k), msg) in enumerate(_arrivals(grid, waiting), 1):
        _take(out, k, msg, max_bytes, log, who=f"job {k} on node {node}")
        progress("clients trained", done, len(jobs), _named(out, k, f"job {k}"))
        send(node)
    out.missing.sort()
    out.seconds = time.monotonic() - start
    return out


def _arrivals(grid, waiting: dict, end: float | None = None):
    """(what a message was sent for, its reply) as replies come, each popped from `waiting`
    (message id -> what it was sent for) first; until nothing waits (the caller may add
    messages between replies) or the monotonic `end` passes."""
    while waiting and (end is None or time.monotonic() < end):
        got = list(grid.pull_messages(list(waiting)))
        for msg in got:
            sent_for = waiting.pop(msg.metadata.reply_to_message_id, None)
            if sent_for is not None:
                yield sent_for, msg
        if not got:
            time.sleep(0.2)


def _named(out: Collected, key: int, fallback: str) -> str:
    """Who sent `key`'s reply: its client id where it sent one (as text), else `fallback`."""
    rep = out.replies.get(key)
    return str((rep.summary.get("client_id") if rep else None) or fallback)


def _train(settings: dict[str, Any], node: int, public=None, files=None):
    from flwr.app import Message, MessageType

    return Message(
        content=wire.request(settings, public, files),
        dst_node_id=node,
        message_type=MessageType.TRAIN,
    )


def _take(out: Collected, key: int, msg, max_bytes: int, log, who: str = "") -> None:
    who = who or f"node {key}"
    if msg.has_error():
        # The reason is the node's own text: kept as data, shortened, never interpreted.
        reason = f"the client failed: {str(msg.error.reason)[:300]}"
        out.refused[key] = reason
        log(f"{who}: {ascii(reason)[1:-1]}")
        return
    try:
        out.replies[key] = wire.read_reply(msg.content, max_bytes)
    except wire.Refused as exc:
        out.refused[key] = str(exc)
        log(f"{who}: refused: {ascii(str(exc))[1:-1]}")
