"""The library's background threads: their CPU priority, and an event loop on a thread of its own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import sys
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")


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


class LoopThread:
    """An asyncio event loop on a thread of its own, started and stopped by one owner.

    The lighthouse session and the group's rounds live on it, so a training thread that holds
    the GIL in long C++ calls delays them but never stops them from being served, and all
    their state is touched on that one loop (no locks). Other threads reach it only through
    :meth:`submit`.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=self.name, daemon=True)
        self._thread.start()

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coroutine`` on the loop; its result or exception arrives through the future."""
        assert self.loop is not None, "start() the loop thread first"
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def call(self, coroutine: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run ``coroutine`` on the loop and wait for it, at most ``timeout_s``."""
        future = self.submit(coroutine)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"{self.name}: no answer within {timeout_s:g}s") from None

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the loop and join its thread; safe to call twice."""
        loop, self.loop = self.loop, None
        if loop is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        assert self._thread is not None
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            loop.close()
