"""Writes on a client's session stream: one at a time, remembering when the last one went."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc

from lighthouse import envelope
from lighthouse.errors import LighthouseUnavailable


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
                raise LighthouseUnavailable("the session with the lighthouse ended while a message was being sent") from None
            self.last_write = time.monotonic()
