"""torchft's ``torchft.work``: c10d ``Work`` objects that are not a collective in flight.

``_DummyWork(result)`` is a Work that has already finished with ``result``: what torchft returns
for a collective skipped because the step already failed. ``_FutureWork(fut)`` is the Work of a
torch ``Future`` (a wrapped collective's, a ``Manager.wrap_future``'s): ``wait`` waits for it, at
most the given timeout, and ``get_future`` hands the future itself.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from replicaft.compat.torchft.futures import future_wait

__all__ = ["_DummyWork", "_FutureWork"]


class _DummyWork(dist.Work):
    """A finished Work whose future holds ``result``."""

    def __init__(self, result: object) -> None:
        super().__init__()
        self.result_ = result
        self.future_: torch.futures.Future[object] = torch.futures.Future()
        self.future_.set_result(result)

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future[object]:
        return self.future_


class _FutureWork(dist.Work):
    """The Work of ``fut``: ``wait(timeout)`` returns True once it completed, raising its
    exception if it failed and ``TimeoutError`` if ``timeout`` passed first."""

    def __init__(self, fut: torch.futures.Future[object]) -> None:
        super().__init__()
        self._fut = fut

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if timeout is None:
            self._fut.wait()
        else:
            future_wait(self._fut, timeout)
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def get_future(self) -> torch.futures.Future[object]:
        return self._fut
