"""Writes on a client's session stream: one at a time, remembering when the last one went, and
heartbeats in its silences."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc

from lighthouse.errors import LighthouseUnavailable
from lighthouse.wire import envelope
from lighthouse.wire.progress import Progress
from lighthouse.wire.protocol import Heartbeat


class StreamWriter:
    """Heartbeats and quorum requests share the stream, and grpc.aio allows one write at a
    time; ``last_write`` (monotonic) is when the session last sent anything: heartbeats fill
    only the silences."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self.last_write = 0.0

    async def write(self, call: grpc.aio.StreamStreamCall, message: Any) -> None:
        """Send ``message`` on the session stream ``call``.

        Raises LighthouseUnavailable when the session ends while the message is being sent:
        grpc fails a write in flight on a call cancelled locally (the session ending, e.g.
        fenced) with asyncio.CancelledError, which must not read as this task's cancellation.
        """
        async with self._lock:
            try:
                await call.write(envelope.encode(message))
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                raise LighthouseUnavailable(
                    "the session with the lighthouse ended while a message was being sent"
                ) from None
            self.last_write = time.monotonic()

    async def fill_silences(
        self,
        call: grpc.aio.StreamStreamCall,
        progress: Progress,
        interval_s: Callable[[], float],
        closing: Callable[[], bool],
    ) -> None:
        """Heartbeat when the stream has been quiet for an interval (``interval_s()``, which the
        lighthouse may raise), until ``closing()``: a quorum request tells the lighthouse as much
        as a heartbeat (alive, at this step), so a group that asks at every step of a fast loop
        sends no heartbeats at all (at 256 members these were more than half of the
        lighthouse's reads). A change of ``progress.healing`` is sent at once (within an
        interval), quiet or not: the lighthouse's silence limit depends on it."""
        healing = False
        while not closing():
            quiet_s = time.monotonic() - self.last_write
            if quiet_s >= interval_s() or progress.healing != healing:
                healing = progress.healing
                await self.write(call, Heartbeat(progress.step, progress.count, healing=healing))
                quiet_s = 0.0
            await asyncio.sleep(interval_s() - quiet_s)
