"""When to try an object-store request again. Pure: the attempt, the clock and a random draw in, a delay out.

An object store fails transiently all the time (a 500 or 503 on one part, a reset
connection, a response cut short) and permanently sometimes (wrong credentials, no such
bucket). A transient failure is retried after an exponentially growing delay with *full
jitter* (a uniform draw between 0 and the exponential bound), so that the eight parallel
part uploads of one file, and the uploads of every job writing to the same bucket, do not
retry in lockstep after a hiccup of the server. Retrying stops after ``max_attempts`` or
when the next attempt would start after the deadline, whichever comes first; the caller
then reports the last error. A permanent failure is never retried: retrying wrong
credentials for five minutes only delays the message that says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from replicaft.checkpoint.options import check_count, check_seconds


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    max_attempts: int = 8
    """Attempts per request, the first included."""
    base_delay_s: float = 0.2
    max_delay_s: float = 10.0
    deadline_s: float = 300.0
    """No attempt starts this long after the first one: bounds a request's total time (a
    store that is down for good is reported within it, not waited for forever)."""

    def __post_init__(self) -> None:
        check_count("max_attempts", self.max_attempts, minimum=1)
        check_seconds("base_delay_s", self.base_delay_s)
        check_seconds("max_delay_s", self.max_delay_s)
        check_seconds("deadline_s", self.deadline_s)


def next_delay(policy: RetryPolicy, *, attempt: int, started: float, now: float, draw: float) -> float | None:
    """Seconds to wait before attempt ``attempt + 1`` after attempt ``attempt`` (1-based)
    failed transiently, or None to give up. ``draw`` is uniform in [0, 1)."""
    if attempt >= policy.max_attempts:
        return None
    bound = min(policy.max_delay_s, policy.base_delay_s * (2 ** (attempt - 1)))
    delay = bound * draw
    if now + delay - started > policy.deadline_s:
        return None
    return delay
