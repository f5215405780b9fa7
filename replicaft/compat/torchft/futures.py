"""torchft's ``torchft.futures``: deadlines on futures, on code blocks and on accelerator streams.

``future_timeout(fut, timeout)`` is a future that completes with ``fut``'s outcome, or with
``TimeoutError`` once ``timeout`` has passed, whichever comes first; ``future_wait`` blocks for
the outcome under the same deadline; ``context_timeout(callback, timeout)`` calls ``callback``
if its ``with`` block has not ended in time; ``stream_timeout`` does the same for the work
queued so far on the current accelerator stream.

The deadlines run on one of replicaft's loop threads (``replicaft.process.threads.LoopThread``,
started on first use), as torchft's run on one asyncio loop of its own: a callback runs on that
thread, so it must not block. torchft also starts a watchdog that exits the process when its
loop stops turning (``TORCHFT_WATCHDOG_TIMEOUT_SEC``); here the loop runs nothing but these
timers, so there is no watchdog, and the variable's name is kept only for code that reads it.
A forked child (a DataLoader worker) starts a deadline thread of its own on first use.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch
from torch.futures import Future

from replicaft.compat.torchft.utils import get_stream_context
from replicaft.process.threads import LoopThread

__all__ = ["WATCHDOG_TIMEOUT_SEC", "context_timeout", "future_timeout", "future_wait", "stream_timeout"]

T = TypeVar("T")

WATCHDOG_TIMEOUT_SEC = "TORCHFT_WATCHDOG_TIMEOUT_SEC"
"""torchft's variable for its timer loop's watchdog; replicaft has none (see the module docstring)."""

_loop = LoopThread("torchft-compat-deadlines")
_loop_lock = threading.Lock()


def _forget_loop_in_child() -> None:
    """A forked child (a DataLoader worker) has the loop object but not its thread: it starts its own."""
    global _loop, _loop_lock
    _loop = LoopThread("torchft-compat-deadlines")
    _loop_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_loop_in_child)


class _Deadline:
    """``callback`` run on the deadline thread after ``seconds`` unless cancelled first; once."""

    def __init__(self, callback: Callable[[], None], seconds: float) -> None:
        with _loop_lock:
            if _loop.loop is None:
                _loop.start()
        self._callback = callback
        self._pending = _loop.submit(self._fire(seconds))

    async def _fire(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self._callback()

    def cancel(self) -> None:
        """Keep the callback from running, if it has not started yet."""
        self._pending.cancel()


def _seconds(timeout: datetime.timedelta) -> float:
    if not isinstance(timeout, datetime.timedelta):
        raise TypeError(f"timeout={timeout!r}: pass a datetime.timedelta, as torchft does")
    return timeout.total_seconds()


def _current_stream() -> torch.Stream | None:
    return torch.accelerator.current_stream() if torch.accelerator.is_available() else None


def future_timeout(fut: Future[T], timeout: datetime.timedelta) -> Future[T]:
    """A future with ``fut``'s result or exception, or ``TimeoutError`` if ``fut`` has not
    completed within ``timeout``; whichever happens first settles it, the other is dropped."""
    seconds = _seconds(timeout)
    timed: Future[T] = Future()
    settled = threading.Lock()

    def settle(outcome: Callable[[T], None] | Callable[[BaseException], None], value: object) -> None:
        if settled.acquire(blocking=False):
            outcome(value)  # type: ignore[arg-type]

    deadline = _Deadline(
        lambda: settle(timed.set_exception, TimeoutError(f"future did not complete within {timeout}")), seconds
    )
    stream = _current_stream()

    def on_done(done: Future[T]) -> None:
        deadline.cancel()
        with get_stream_context(stream):
            try:
                result = done.wait()
            except Exception as e:
                settle(timed.set_exception, e)
            else:
                settle(timed.set_result, result)

    fut.add_done_callback(on_done)
    return timed


def future_wait(fut: Future[T], timeout: datetime.timedelta) -> T:
    """``fut``'s result (or its exception, raised), waiting at most ``timeout``; ``TimeoutError``
    if it has not completed by then."""
    seconds = _seconds(timeout)
    done = threading.Event()
    fut.add_done_callback(lambda _: done.set())
    if not done.wait(seconds):
        raise TimeoutError(f"future did not complete within {timeout}")
    return fut.wait()


@contextmanager
def context_timeout(callback: Callable[[], None], timeout: datetime.timedelta) -> Iterator[None]:
    """Call ``callback`` (on the deadline thread) if the ``with`` block is still running after
    ``timeout``; leaving the block in time cancels it."""
    deadline = _Deadline(callback, _seconds(timeout))
    try:
        yield
    finally:
        deadline.cancel()


def stream_timeout(callback: Callable[[], None], timeout: datetime.timedelta) -> None:
    """Call ``callback`` if the work queued so far on the current accelerator stream has not
    finished after ``timeout``. Without an accelerator that work has already finished (the CPU
    runs it before the call returns), so nothing is scheduled."""
    seconds = _seconds(timeout)
    if not torch.accelerator.is_available():
        return
    event = torch.Event()
    event.record()

    def check() -> None:
        if not event.query():
            callback()

    _Deadline(check, seconds)
