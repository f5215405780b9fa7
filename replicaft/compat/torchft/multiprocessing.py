"""torchft's ``torchft.multiprocessing``: ``_MonitoredPipe``, a pipe end whose ``recv`` has a deadline.

torchft's subprocess ("baby") process groups talk to their worker over such pipes; the worker
sends back an exception object to fail a request, which ``recv`` raises. The objects are
pickled, so a ``_MonitoredPipe`` belongs between a process and the children it started, never
on a network connection.
"""

from __future__ import annotations

import datetime
from multiprocessing.connection import Connection

__all__ = ["_MonitoredPipe"]


class _MonitoredPipe:
    """One end of a ``multiprocessing.Pipe``, received from under a deadline."""

    def __init__(self, pipe: Connection) -> None:
        self._pipe = pipe

    def send(self, obj: object) -> None:
        self._pipe.send(obj)

    def recv(self, timeout: float | datetime.timedelta) -> object:
        """The next object from the other end, waiting at most ``timeout`` (seconds or a
        timedelta); an exception sent as the object is raised; ``TimeoutError`` if none came."""
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
        if not self._pipe.poll(seconds):
            raise TimeoutError(f"pipe.recv() timed out after {seconds:g} seconds")
        out = self._pipe.recv()
        if isinstance(out, Exception):
            raise out
        return out

    def close(self) -> None:
        self._pipe.close()

    def closed(self) -> bool:
        return self._pipe.closed
