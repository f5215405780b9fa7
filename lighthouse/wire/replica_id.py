"""What a replica id may be: the one rule, shared by the lighthouse, the managers and the CLIs.

A replica id names a replica group everywhere a person or a program reads it: lighthouse log
lines, the status page, event files (``<replica_id>-<group_rank>.jsonl``), store prefixes. An
id holding a newline or another control character forged whole lighthouse log lines (issue
19), and a ``/`` would put an event file in another directory. Escaping at every place an id
is written would have to be remembered at each new one, so the alphabet is restricted once,
where an id first enters (options, the wire): letters, digits and ``_ . : @ -``, starting with
a letter, a digit or ``_`` (never ``-``, which reads as a flag, nor ``.``, which hides a
file), at most :data:`MAX_REPLICA_ID_CHARS` characters. Kubernetes pod names, Slurm job and
task ids, hostnames and torchft's ``prefix:uuid`` ids all fit.

Torch-free, like the whole package: ``replicaft/config/options.py`` imports it.
"""

from __future__ import annotations

import re
from typing import Any

from lighthouse.errors import ProtocolError, shown

MAX_REPLICA_ID_CHARS = 128

_ID = "[A-Za-z0-9_][A-Za-z0-9_.:@-]*"
REPLICA_ID_PATTERN = re.compile(_ID)
_COLUMN = re.compile(f"{_ID}(?:\x00{_ID})*")
"""Every id of a column joined by NUL (not in the alphabet): one C-level match for a quorum."""

RULE = (
    f"a replica id is 1-{MAX_REPLICA_ID_CHARS} characters of letters, digits and _ . : @ -, "
    "starting with a letter, a digit or _ (e.g. 'g0', 'group-3', 'job.7:rank-0')"
)


def replica_id_problem(value: Any) -> str | None:
    """Why ``value`` is not a valid replica id, or None when it is."""
    if not isinstance(value, str):
        return f"is {type(value).__name__} {shown(value)}; expected a string"
    if not value:
        return "is empty"
    if len(value) > MAX_REPLICA_ID_CHARS:
        return f"is {len(value)} characters long"
    if REPLICA_ID_PATTERN.fullmatch(value) is None:
        return f"is {value!r}"
    return None


def check_replica_id(value: Any, *, where: str = "replica_id", error: type[Exception] = ProtocolError) -> str:
    """``value`` if it is a valid replica id; otherwise raises ``error`` naming ``where``,
    the value and the rule (``OptionsError`` for a setting, ``ProtocolError`` off the wire)."""
    problem = replica_id_problem(value)
    if problem is not None:
        raise error(f"{where} {problem}; {RULE}")
    return value


def check_replica_id_column(msg: str, name: str, ids: tuple[str, ...]) -> tuple[str, ...]:
    """Every id of a column of strings (already type-checked), in one regex pass when all
    are valid; otherwise the first bad one is named, as ``check_replica_id`` would."""
    joined = "\x00".join(ids)
    if not ids or (
        _COLUMN.fullmatch(joined) is not None
        and joined.count("\x00") == len(ids) - 1
        and max(map(len, ids)) <= MAX_REPLICA_ID_CHARS
    ):
        return ids
    for i, rid in enumerate(ids):
        check_replica_id(rid, where=f"{msg}.{name}[{i}]")
    raise AssertionError("unreachable: the fast pass failed, so some id must")
