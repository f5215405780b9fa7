"""Joining the column's Gloo rendezvous without being held there by a peer that gave up.

Every rank waits, abortably, until all have published their flag addresses before it enters
Gloo's rendezvous (process_group.py), which nothing interrupts. That leaves a window: a rank
that finds every key published, while a peer gave up its own wait an instant before (the
lighthouse had declared this rank lost while it was frozen, and the peer's abort fired),
enters a rendezvous nobody else will join and blocks there for Gloo's whole timeout. Found by
the Ray test of torchft's example under load: a group frozen for half a second came back, found
its peer's key and waited 60 s in Gloo's rendezvous while the others trained on without it.

So a rank that gives up says so in the quorum's store (:func:`mark_abandoned`), and the
rendezvous runs on a thread of its own (Gloo releases the GIL while it waits) while the
training thread watches, over a store connection of its own (a TCPStore client serves one
call at a time, and Gloo's wait holds it), for that mark, the abort signal and the deadline.
Given up, the thread is left to Gloo's timeout and its half-made group is dropped: its store
prefix is this quorum's, which nobody uses after.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import torch.distributed as dist

logger = logging.getLogger(__name__)

ABANDONED_KEY = "abandoned"
"""Set in a quorum's (prefixed) store by the first rank of the column that gave up its rendezvous."""
WAIT_POLL_S = 0.01
"""How often the watch checks the mark, the abort signal and the deadline."""

Group = TypeVar("Group")


class RendezvousError(RuntimeError):
    """The rendezvous was given up; the column is unusable until the next quorum rebuilds it."""


def mark_abandoned(store: dist.Store, rank: int) -> None:
    """Tell the column's other ranks that ``rank`` gave up this quorum's rendezvous."""
    try:
        store.set(ABANDONED_KEY, str(rank))
    except (RuntimeError, OSError) as e:  # the store is gone with its host: the peers' deadline holds
        logger.debug("could not mark the rendezvous abandoned: %s", e)


def join(create: Callable[[], Group], watch: dist.Store, deadline: float, abort: threading.Event) -> Group:
    """``create()`` (the backend's rendezvous), on a thread; raises RendezvousError once ``abort``
    is set, a peer marked the rendezvous abandoned in ``watch`` or the monotonic ``deadline`` passes."""
    made: list[Group] = []
    failed: list[BaseException] = []
    done = threading.Event()

    def run() -> None:
        try:
            made.append(create())
        except BaseException as e:  # noqa: BLE001 - handed to the training thread, or dropped once given up
            failed.append(e)
        finally:
            done.set()

    threading.Thread(target=run, name="column-rendezvous", daemon=True).start()
    while not done.wait(WAIT_POLL_S):
        if abort.is_set():
            raise RendezvousError("column rendezvous abandoned: a member of the quorum was lost")
        if watch.check([ABANDONED_KEY]):
            rank = watch.get(ABANDONED_KEY).decode(errors="replace")
            raise RendezvousError(f"column rendezvous abandoned: rank {rank} gave it up")
        if time.monotonic() >= deadline:
            raise RendezvousError("column rendezvous abandoned: the deadline passed")
    if failed:
        raise failed[0]
    return made[0]
