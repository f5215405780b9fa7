"""Is there a checkpoint to resume from? The question a starting group asks at its first quorum.

Its answer decides whether the group resumes or trains from step 0 under a new lineage, so
"the store could not be asked" must never read as "no". Issue 37: a job restarted on a fresh
machine while its object store answered 503 asked once, failed, never asked again, and trained
from step 0 beside the stored history (and uploaded that second history next to it).

The rule (:func:`decide`): checkpoints found in any tier: resume. None found, and every tier
was listed: train from scratch. None found locally and the object store could not be listed:
**unknown**, and the group does not train: the step does not commit, the next quorum asks
again, and after ``checkpoint_store_wait_s`` without an answer the group stops with
:class:`~replicaft.errors.CheckpointStoreUnavailable`, naming the store and its last error.
A store that refused outright (credentials, no such bucket) stops it at once: waiting cannot
change that answer.

**Bounded.** A survey lists the store and reads each stored manifest, each request retried
under the store's policy (minutes, against a black-holed endpoint: every request waits out
its connect and read timeouts). So it runs on a thread of its own, and a step waits for it at
most ``per_quorum_s`` (half the collective timeout, so the peers' first collectives do not time
out waiting for this group); a survey still running is waited for again at the next quorum,
never started twice. The thread is a daemon: a boto3 request cannot be interrupted, and one
hung at shutdown must not hold the process (like an abandoned Gloo collective, it is left).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable
from typing import Literal

from replicaft.checkpoint.tiers import Survey
from replicaft.errors import CheckpointStoreUnavailable, ObjectStoreRefused

logger = logging.getLogger(__name__)

Decision = Literal["resume", "fresh", "unknown", "refused"]


def decide(survey: Survey) -> Decision:
    """What a finished survey says. Pure."""
    if survey.candidates:
        return "resume"
    if survey.store_error is None:
        return "fresh"
    return "refused" if isinstance(survey.store_error, ObjectStoreRefused) else "unknown"


class ResumeQuestion:
    """Asks ``survey`` on a thread of its own until it is answered (see the module docstring).

    Training thread only; :meth:`answer` is called once per quorum until it returns a survey."""

    def __init__(
        self,
        survey: Callable[[], Survey],
        *,
        where: str,
        wait_s: float,
        per_quorum_s: float,
        emit: Callable[..., None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._survey = survey
        self._where = where
        self._wait_s = wait_s
        self._per_quorum_s = per_quorum_s
        self._emit = emit
        self._clock = clock
        self._first_asked: float | None = None
        self._running: concurrent.futures.Future[Survey] | None = None

    def answer(self) -> Survey | None:
        """The survey once it says resume or fresh; None while the store cannot be asked (this
        step must not commit; ask again at the next quorum). Raises CheckpointStoreUnavailable
        when the store refused, or has not answered for ``wait_s``."""
        now = self._clock()
        if self._first_asked is None:
            self._first_asked = now
        if self._running is None:
            self._running = self._start()
        left = self._first_asked + self._wait_s - now
        try:
            survey = self._running.result(timeout=max(0.0, min(self._per_quorum_s, left)))
        except concurrent.futures.TimeoutError:
            why = f"no answer within {self._clock() - self._first_asked:.1f}s"
        except Exception:
            self._running = None  # a bug, not the store's answer: raised, and asked afresh next time
            raise
        else:
            self._running = None
            decision = decide(survey)
            if decision in ("resume", "fresh"):
                return survey
            why = str(survey.store_error)
            if decision == "refused":
                raise self._stop(why, f"{self._where} refused the question")
        waited_s = self._clock() - self._first_asked
        if waited_s >= self._wait_s:
            raise self._stop(why, f"{self._where} has not answered for {waited_s:.0f}s (checkpoint_store_wait_s)")
        logger.warning(
            "cannot ask %s whether a checkpoint exists (%s); not training from scratch: asking again at the next "
            "quorum, stopping after checkpoint_store_wait_s=%g",
            self._where,
            why,
            self._wait_s,
        )
        self._emit("resume_store_waiting", store=self._where, waited_s=round(waited_s, 3), error=why)
        return None

    def _stop(self, why: str, what: str) -> CheckpointStoreUnavailable:
        return CheckpointStoreUnavailable(
            f"{what}, and the local checkpoint directories hold no checkpoint, so whether one exists is unknown "
            f"(last: {why}). Not training from step 0, which would start a second history beside a stored one. "
            "Fix the store (endpoint, credentials, network) and restart, or unset checkpoint_object_store to "
            "start without it"
        )

    def _start(self) -> concurrent.futures.Future[Survey]:
        future: concurrent.futures.Future[Survey] = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(self._survey())
            except BaseException as e:  # the training thread receives it from the future
                future.set_exception(e)

        threading.Thread(target=run, name="replicaft-resume-question", daemon=True).start()
        return future
