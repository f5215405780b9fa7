"""torchft's ``Manager.wrap_future(fut, default, timeout=None)``: a future that never fails.

The wrapped future completes with ``fut``'s value, or, if ``fut`` fails or has not completed
within ``timeout`` (the manager's collective timeout when none is given), with ``default``,
and the error fails the step: ``should_commit`` returns False in every group. That is how
torchft lets a script's own asynchronous work (a comm hook's all-reduce, a copy) fail without
raising into the training loop.

The failure may arrive on any thread (the deadline's, a collective's), while replicaft's
manager takes errors on the training thread only; so errors wait here and are reported when
``should_commit`` begins (the ``before_vote`` hook). An error that arrives after its step's
vote is dropped when the next step starts, as torchft's ``start_quorum`` clears its error.

Bound into the compat ``Manager``'s class body (manager.py imports ``wrap_future`` there), so
it is a method with torchft's signature.
"""

from __future__ import annotations

import datetime
import logging
import threading
import weakref
from typing import Protocol, TypeVar

import torch

import replicaft
from replicaft.compat.torchft.futures import future_timeout
from replicaft.compat.torchft.utils import get_stream_context
from replicaft.state.registry import StepHooks

__all__ = ["wrap_future"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class Manager(Protocol):
    """What of the compat ``Manager`` this module uses (it cannot import manager.py, which imports it)."""

    @property
    def inner(self) -> replicaft.Manager: ...

    def report_error(self, e: Exception) -> None: ...


class _FutureErrors(StepHooks):
    """The first error of a wrapped future this step, reported to the manager before the vote."""

    def __init__(self, manager: Manager) -> None:
        self._manager = manager
        self._lock = threading.Lock()
        self._error: Exception | None = None

    def add(self, error: Exception) -> None:
        with self._lock:
            if self._error is None:
                self._error = error

    def _take(self) -> Exception | None:
        with self._lock:
            error, self._error = self._error, None
        return error

    def on_step_start(self) -> None:
        self._take()

    def before_vote(self) -> None:
        error = self._take()
        if error is not None:
            self._manager.report_error(error)


_errors: weakref.WeakKeyDictionary[Manager, _FutureErrors] = weakref.WeakKeyDictionary()


def _errors_of(manager: Manager) -> _FutureErrors:
    errors = _errors.get(manager)
    if errors is None:
        errors = _errors[manager] = _FutureErrors(manager)
        manager.inner.register_hooks(errors)
    return errors


def wrap_future(
    self: Manager, fut: torch.futures.Future[T], default: T, timeout: datetime.timedelta | None = None
) -> torch.futures.Future[T]:
    """``fut``'s value, or ``default`` if it fails or outlasts ``timeout``; a failure fails the
    step (see the module docstring). Call it on the training thread."""
    errors = _errors_of(self)
    if timeout is None:
        timeout = datetime.timedelta(seconds=self.inner.options.collective_timeout_s)
    timed = future_timeout(fut, timeout)
    stream = torch.accelerator.current_stream() if torch.accelerator.is_available() else None

    def value_or_default(done: torch.futures.Future[T]) -> T:
        with get_stream_context(stream):
            try:
                return done.value()
            except Exception as e:
                logger.warning("wrapped future failed, completing it with its default: %s: %s", type(e).__name__, e)
                errors.add(e)
                return default

    return timed.then(value_or_default)
