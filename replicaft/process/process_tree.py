"""The processes below the launcher, read from ``/proc``, and how to signal them all. Linux only.

torchrun starts each rank in a session of its own, so no process group covers a W > 1 group:
the launcher signals, one by one, every process below a group's root. It is a child
subreaper, so ranks orphaned by a killed torchrun stay below it and are found too.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
"""``<linux/prctl.h>``."""


def die_with_parent(*, exit_if_orphaned: bool = False) -> None:
    """Have the kernel SIGKILL this process when its parent dies, however the parent dies.

    Called in a Python child before it does anything (a DataLoader worker's init, the
    forkserver's preload): without it a SIGKILLed group, runner or supervisor leaves its
    children running, holding pipes, ports and memory. ``exit_if_orphaned``: the parent may
    already have died before the call (then the kernel never sends the signal), and this
    child was re-parented to init: exit now. Not for a child whose real parent is init. For a
    program started with ``subprocess``, :func:`dying_with_parent` instead.
    """
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if exit_if_orphaned and os.getppid() == 1:
        os._exit(1)


def dying_with_parent(argv: Sequence[str]) -> list[str]:
    """``argv`` started so that the kernel SIGKILLs it when the thread that started it dies.

    util-linux's ``setpriv --pdeathsig KILL`` sets the death signal and then execs ``argv``
    (the child's pid is the program's; the signal survives the exec). Not ``preexec_fn``
    with :func:`die_with_parent`: that runs Python between fork and exec in a parent whose
    other threads (output readers, gRPC, a test's members) may hold a lock at the fork. An etcd
    member restarted that way under load once exited with SIGABRT; Go's runtime ends a crash
    with status 2, not a signal, which points at the child's Python before the exec (issue 37).
    """
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise RuntimeError(
            "setpriv (util-linux) is not on PATH: it ties a child's life to its parent's "
            "(setpriv --pdeathsig KILL); install util-linux"
        )
    return [setpriv, "--pdeathsig", "KILL", "--", *argv]


def become_subreaper() -> bool:
    """Have the kernel re-parent orphaned descendants to this process instead of to init.

    A rank orphaned by a dead torchrun (or a script's helper process orphaned by a dead rank)
    then stays below the launcher, where :meth:`Launcher._processes_of` finds it and kills it.
    Returns False where prctl is unavailable.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    pid: int
    ppid: int
    zombie: bool
    """Exited but not yet waited for: it runs no more, but only its parent can remove it."""


def read_process_table() -> dict[int, ProcessInfo]:
    """Every process in ``/proc``; one that exits while being read is left out."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces and ")"
        table[int(entry.name)] = ProcessInfo(int(entry.name), int(fields[1]), fields[0] in ("Z", "X"))
    return table


def descendants(root_pid: int, table: Mapping[int, ProcessInfo]) -> list[ProcessInfo]:
    """Every process below ``root_pid`` in ``table``, parents before children."""
    children: dict[int, list[ProcessInfo]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info)
    found, frontier = [], [root_pid]
    while frontier:
        below = children.get(frontier.pop(0), [])
        found += below
        frontier += [info.pid for info in below]
    return found


def running_below(root_pids: Iterable[int], table: Mapping[int, ProcessInfo]) -> list[int]:
    """The roots and everything below them that still runs (zombies excluded), roots first."""
    found = [table[pid] for pid in root_pids if pid in table]
    found += [info for pid in root_pids for info in descendants(pid, table)]
    return list(dict.fromkeys(info.pid for info in found if not info.zombie))


def send_signal(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
