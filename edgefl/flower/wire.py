"""What travels in edgefl's one-shot messages. The server sends one `train` message holding the
run's settings (JSON in a ConfigRecord); a client replies with its files as raw uint8 Arrays
(Flower streams an Array in chunks, so a 264 MiB VGG-9 needs nothing of ours) and, beside them,
their SHA-256 and its training summary. Everything in a reply is untrusted until `read_reply`
has checked it: names, sizes, hashes, and the summary's size and shape.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

REQUEST = "edgefl-request"
FILES = "edgefl-files"
META = "edgefl-meta"
# The files a client may send: its upload, and for a predictions client its own model too.
ROLES = ("upload", "model")
MAX_SUMMARY_BYTES = 1 << 20  # a client's training summary is a few KiB
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class Refused(Exception):
    """A reply the server will not take, with the reason to report (the reply's own text
    appears in it only escaped: it is data, never markup)."""


@dataclass
class Reply:
    files: dict[str, bytes]  # role -> bytes, hashes checked
    summary: dict[str, Any]
    skipped: bool = False  # no edgefl node sends it now (simulations send unfinished jobs only)


PUBLIC = "edgefl-public"


def request(settings: dict[str, Any], public=None, files: dict[str, bytes] | None = None):
    """The server's message; `public` (float32 N x C x H x W) is the unlabeled set predictions
    clients label (FedOL, FedDF), sent by the server so that every client labels the same one;
    `files` go out as raw Arrays (FedGH's header in its second message)."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    records = {REQUEST: ConfigRecord({"settings": json.dumps(settings)})}
    if files:
        records[FILES] = ArrayRecord(
            {
                k: Array(dtype="uint8", shape=(len(v),), stype="raw", data=v)
                for k, v in files.items()
            }
        )
    if public is not None:
        x = np.ascontiguousarray(public, dtype=np.float32)
        records[PUBLIC] = ArrayRecord(
            {"x": Array(dtype="float32", shape=tuple(x.shape), stype="raw", data=x.tobytes())}
        )
    return RecordDict(records)


def request_file(content, name: str) -> bytes:
    """A file the server sent (the node trusts its server, which it reached over TLS)."""
    return bytes(content[FILES][name].data)


def read_request(content) -> tuple[dict[str, Any], np.ndarray | None]:
    settings = json.loads(content[REQUEST]["settings"])
    if PUBLIC not in content:
        return settings, None
    arr = content[PUBLIC]["x"]
    x = np.frombuffer(arr.data, dtype=np.float32).reshape(tuple(arr.shape))
    return settings, x


def reply(files: dict[str, bytes], summary: dict[str, Any], skipped: bool = False):
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    arrays = {
        role: Array(dtype="uint8", shape=(len(data),), stype="raw", data=data)
        for role, data in files.items()
    }
    meta = {
        "sha256": json.dumps({r: hashlib.sha256(d).hexdigest() for r, d in files.items()}),
        "summary": json.dumps(summary, default=str),
        "skipped": skipped,
    }
    return RecordDict({FILES: ArrayRecord(arrays), META: ConfigRecord(meta)})


def read_reply(content, max_bytes: int) -> Reply:
    """Check a client's reply before any of it is used: only known file roles, each at most
    `max_bytes` (checked on the declared shape before the bytes are hashed), each matching
    its declared SHA-256; a bounded JSON summary."""
    try:
        meta = content[META]
        files_rec = content[FILES]
    except KeyError:
        raise Refused("the reply is not an edgefl upload (no files or metadata record)") from None
    if meta.get("skipped") is True:
        return Reply({}, {}, skipped=True)
    declared, summary = _declared_and_summary(meta)
    names = set(files_rec.keys())
    if not names and not declared and summary.get("acknowledged") is True:
        return Reply({}, summary)  # an answer to a second message: nothing uploaded
    _check_roles(names, declared)
    files = {
        role: _checked_file(role, files_rec[role], declared, max_bytes) for role in sorted(names)
    }
    return Reply(files, summary)


def _declared_and_summary(meta) -> tuple[dict, dict]:
    """The reply's declared hashes and its training summary, each a bounded JSON object."""
    declared = _json(meta.get("sha256"), "sha256", 4096)
    summary = _json(meta.get("summary"), "summary", MAX_SUMMARY_BYTES)
    if not isinstance(declared, dict) or not isinstance(summary, dict):
        raise Refused("the reply's sha256 and summary must be JSON objects")
    return declared, summary


def _check_roles(names: set, declared: dict) -> None:
    if not names or not names <= set(ROLES) or names != set(declared):
        shown = ", ".join(sorted(ascii(n) for n in names)) or "none"
        raise Refused(
            f"the reply's files must be {' and/or '.join(ROLES)}, each with a "
            f"declared sha256; got {shown}"
        )


def _checked_file(role: str, arr, declared: dict, max_bytes: int) -> bytes:
    """One file's bytes, its size checked on the declared shape before they are read."""
    size = _declared_size(arr)
    if size > max_bytes:
        raise Refused(f"its {role} declares {size:,} bytes, over the limit of {max_bytes:,}")
    data = bytes(arr.data)
    if len(data) != size:
        raise Refused(f"its {role} holds {len(data):,} bytes but declares {size:,}")
    if hashlib.sha256(data).hexdigest() != declared[role]:
        raise Refused(f"its {role} does not match its declared SHA-256")
    return data


def _declared_size(arr) -> int:
    if getattr(arr, "dtype", None) != "uint8" or len(getattr(arr, "shape", ())) != 1:
        raise Refused("a file must be sent as a 1-D uint8 Array")
    size = arr.shape[0]
    if not isinstance(size, int) or size < 0:
        raise Refused("a file's declared size is not a non-negative integer")
    return size


def _json(text, what: str, limit: int):
    if not isinstance(text, str) or len(text) > limit:
        raise Refused(f"the reply's {what} is missing or over {limit:,} characters")
    try:
        return json.loads(text)
    except ValueError:
        raise Refused(f"the reply's {what} is not JSON") from None


def safe_client_id(text: Any, fallback: str) -> str:
    """A client id fit for a file name (letters, digits, '_', '.', '-'; at most 64), else the
    fallback: a node chooses its id, so it must never pick the path its upload lands on."""
    if isinstance(text, str) and _SAFE_ID.fullmatch(text) and ".." not in text:
        return text
    return fallback
