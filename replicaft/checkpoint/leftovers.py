"""Whose a temporary directory is, and when it is provably abandoned (issue 37).

A save writes under ``step-N-<lineage>.tmp-<token>`` and a delete renames into
``….tmp-deleting-<token>``; a crash leaves such a directory behind, and each writer removes
those before its first save in a directory. A second writer sharing the directory (two jobs,
or ``replicaft-ckpt import`` beside a running job) once removed the first one's *in-flight*
save that way. So the token names its owner: a digest of the host name and the pid,
``<host8>-p<pid>-<uuid>``. A temporary is abandoned when its owner is a process of this host
that no longer runs, or, whatever its name says (another host's, a reused pid, a token from
before owners were named), when it has not changed for :data:`ABANDONED_AFTER_S`.

Rejected: a lock file per temporary (a crash leaves the lock too, and NFS locks are not
reliable across hosts); a pid alone (pids of different hosts on a shared filesystem clash).
"""

from __future__ import annotations

import hashlib
import re
import socket

ABANDONED_AFTER_S = 6 * 3600.0
"""Far longer than any save takes (a 100 GB save to a slow network filesystem: tens of
minutes), so an unchanged temporary this old is garbage even if its owner's pid is reused."""

_OWNED = re.compile(r"(?:deleting-)?([0-9a-f]{8})-p(\d+)-[0-9a-f]{32}")


def host_digest(host: str | None = None) -> str:
    """Eight hex digits naming ``host`` (this one by default): a host name may hold dots,
    which a temporary's token may not."""
    return hashlib.sha256((host or socket.gethostname()).encode()).hexdigest()[:8]


def owner_token(pid: int, uuid_hex: str, host: str | None = None) -> str:
    return f"{host_digest(host)}-p{pid}-{uuid_hex}"


def owner_of(token: str) -> tuple[str, int] | None:
    """(host digest, pid) that ``token`` names; None for a token that names no owner."""
    match = _OWNED.fullmatch(token)
    return (match[1], int(match[2])) if match else None


def is_abandoned(token: str, age_s: float, *, this_host: str, pid_alive: bool | None) -> bool:
    """Whether the temporary of ``token``, unchanged for ``age_s``, is provably abandoned.
    ``pid_alive``: whether its owner's pid runs on this host (None when not asked). Pure."""
    if age_s >= ABANDONED_AFTER_S:
        return True
    owner = owner_of(token)
    return owner is not None and owner[0] == this_host and pid_alive is False
