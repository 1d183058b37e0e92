"""The server's one round: wait for the nodes, send each one `train` message, and take each
reply as it comes until all have answered or the deadline passes. A node that fails, sends
something malformed or never answers is named in the outcome; it never sinks the others.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from edgefl.flower import wire
from edgefl.progress import no_progress


@dataclass
class Collected:
    replies: dict[int, wire.Reply] = field(default_factory=dict)  # node id -> checked reply
    refused: dict[int, str] = field(default_factory=dict)  # node id -> why
    missing: list[int] = field(default_factory=list)  # nodes sent a message, no reply in time
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
    per_node: list[dict[str, Any]] | None = None,
) -> Collected:
    """Send every node the train message (`settings`, plus its own entry of `per_node`, which
    is aligned with `nodes`) and take each reply as it comes."""
    from flwr.app import Message, MessageType

    log = log or (lambda m: None)
    start = time.monotonic()
    out = Collected()
    if per_node is not None and len(per_node) != len(nodes):
        raise ValueError(f"{len(per_node)} per-node settings for {len(nodes)} nodes")
    msgs = [
        Message(
            content=wire.request(settings | (per_node[i] if per_node else {}), public, files),
            dst_node_id=n,
            message_type=MessageType.TRAIN,
        )
        for i, n in enumerate(nodes)
    ]
    ids = {mid: n for mid, n in zip(grid.push_messages(msgs), nodes, strict=True) if mid}
    waiting = dict(ids)
    progress("clients trained", 0, len(nodes))
    end = None if deadline_s is None else start + deadline_s
    while waiting and (end is None or time.monotonic() < end):
        got = list(grid.pull_messages(list(waiting)))
        for msg in got:
            node = waiting.pop(msg.metadata.reply_to_message_id, None)
            if node is None:
                continue
            _take(out, node, msg, max_bytes, log)
            rep = out.replies.get(node)  # named by its client id where it sent one (as text)
            who = (rep.summary.get("client_id") if rep else None) or f"node {node}"
            progress("clients trained", len(nodes) - len(waiting), len(nodes), str(who))
        if not got:
            time.sleep(0.2)
    out.missing = sorted(waiting.values()) + sorted(set(nodes) - set(ids.values()))
    within = "" if deadline_s is None else f" within the deadline ({deadline_s:g} s)"
    for node in out.missing:  # never sent (no message id), or no reply by the deadline
        log(f"node {node}: no reply{within}; going on without it")
    out.seconds = time.monotonic() - start
    return out


def _take(out: Collected, node: int, msg, max_bytes: int, log) -> None:
    if msg.has_error():
        # The reason is the node's own text: kept as data, shortened, never interpreted.
        reason = f"the client failed: {str(msg.error.reason)[:300]}"
        out.refused[node] = reason
        log(f"node {node}: {ascii(reason)[1:-1]}")
        return
    try:
        out.replies[node] = wire.read_reply(msg.content, max_bytes)
    except wire.Refused as exc:
        out.refused[node] = str(exc)
        log(f"node {node}: refused: {ascii(str(exc))[1:-1]}")
