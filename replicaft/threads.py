"""CPU priority for the library's background threads."""

from __future__ import annotations

import logging
import os
import sys
import threading

logger = logging.getLogger(__name__)


def lower_thread_priority(niceness: int, what: str) -> None:
    """Make the calling thread (and the threads it starts) yield the CPU to training threads.

    Linux keeps a niceness per thread; elsewhere ``setpriority`` would renice the whole
    process, so it is left alone there. ``what`` names the thread in the warning if the
    call fails.
    """
    if sys.platform != "linux":
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)
    except OSError as e:
        logger.warning("%s runs at the training's CPU priority: setpriority failed: %s", what, e)
