"""Shared pieces of the hostile-input suite (tests/test_fuzz_*.py, issue 19).

Every decoder of bytes that come off a socket, a disk or a user's file promises one thing:
it returns a valid object or raises its module's own error (``ProtocolError``,
``CheckpointCorrupt``, ``ScenarioError``), which names the field and where. Any other
exception (``KeyError``, ``TypeError``, ``RecursionError``, ``UnicodeDecodeError``,
``MemoryError``), a hang or a huge allocation is a bug in the decoder, because the caller
catches the promised type and nothing else: the lighthouse would drop every member's
session on one bad message, a resume would crash instead of falling back to an older
checkpoint.

:func:`call_decoder` runs one call under that contract with a wall-clock bound (SIGALRM,
so a hang fails the example instead of the suite) and a bound on the memory it allocates
(tracemalloc's peak), and :data:`FUZZ` is the one hypothesis profile of the suite:
derandomized (a fuzz test that fails on one CI run and passes on the next is a defect),
no example database, no deadline (the machine is shared; the alarm bounds hangs), and a
fixed number of examples sized so that the whole suite stays under ~40 s.

The strategies draw both shapeless input (random bytes, random msgpack) and structure-aware
input: a valid message with one field replaced by a hostile value (:func:`mutated_map`).
"""

from __future__ import annotations

import math
import signal
import time
import tracemalloc
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

FUZZ = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
"""The suite's profile; a test passes it as ``@FUZZ``. 100 examples per test keep the four
files (95 tests) at 12-19 s on the shared 2-core machine (``pytest --durations``, load 3-4).
Run at 1000-1500 random examples per test (2-3 min) they found one bug more (a legacy
``.metadata`` that made the unpickler allocate 2 GiB, now a regression test) and nothing
after it."""

CALL_TIMEOUT_S = 5.0
"""One decode of at most a few MiB takes milliseconds; five seconds is a hang."""
MAX_ALLOCATED_BYTES = 64 * 1024 * 1024
"""Above the input's own size: no decoder needs more than a few copies of its input."""
MAX_MESSAGE_CHARS = 2000
"""An error message is logged and sent back in a gRPC status (8 KiB of metadata at most): it
shows a value, not the megabyte string it was given."""
DEEP = 1010
"""msgpack decodes up to 1024 levels; Python's ``repr`` and recursion stop at 1000, so a
decoder that recurses on or prints a value this deep fails."""


class DecoderHung(AssertionError):
    """A decoder ran past :data:`CALL_TIMEOUT_S`."""


@contextmanager
def _alarm(seconds: float, what: str) -> Iterator[None]:
    """Raise DecoderHung in the block after ``seconds``, and again on leaving it if the block
    swallowed the first (a decoder's ``except Exception`` turning it into its own error).
    pytest-timeout keeps its own SIGALRM timer for the whole test; it is put back, less the
    time spent, afterwards."""
    message = f"{what} ran for more than {seconds} s on one input (a hang)"
    fired = []

    def fire(signum: int, frame: Any) -> None:
        fired.append(True)
        raise DecoderHung(message)

    previous = signal.signal(signal.SIGALRM, fire)
    started = time.monotonic()
    outer_remaining, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_remaining:
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, outer_remaining - (time.monotonic() - started)))
    if fired:
        raise DecoderHung(message)


def call_decoder(
    decode: Callable[[], Any],
    promised: type[BaseException] | tuple[type[BaseException], ...],
    what: str,
    input_bytes: int = 0,
) -> Any:
    """``decode()``'s result, or None when it raised one of ``promised``.

    Fails the example when it raised anything else (the traceback is chained), ran past
    :data:`CALL_TIMEOUT_S`, or allocated more than ``input_bytes`` + :data:`MAX_ALLOCATED_BYTES`.
    """
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    try:
        with _alarm(CALL_TIMEOUT_S, what):
            try:
                result = decode()
            except promised as e:
                assert len(str(e)) <= MAX_MESSAGE_CHARS, f"{what}'s error is {len(str(e))} characters: {str(e)[:300]}"
                result = None
            except DecoderHung:
                raise
            except BaseException as e:  # the point: anything not promised is a bug
                raise AssertionError(
                    f"{what} raised {type(e).__name__}: {str(e)[:300]}; it promises {promised} only"
                ) from e
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if started:
            tracemalloc.stop()
    assert peak - base <= input_bytes + MAX_ALLOCATED_BYTES, f"{what} allocated {peak - base} bytes"
    return result


# ---------------------------------------------------------------------------------------------
# Strategies

HUGE_INTS = (2**31, 2**53 + 1, 2**62 + 1, 2**63 - 1, 2**64 - 1, -(2**63))
"""Beyond every range a decoder accepts, and at msgpack's own limits."""

hostile_text = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),
    st.text(st.characters(min_codepoint=0, max_codepoint=0x1F), min_size=1, max_size=8),  # control characters
    st.sampled_from(["", " ", "\x00", "a\nb", "../etc/passwd", "a/b", "g0\x1b[31m", "\u202e", "é" * 5]),
    st.integers(1, 20_000).map(lambda n: "x" * n),  # longer than any limit
)
"""Strings a decoder must survive: empty, control characters, path separators, too long."""

hostile_numbers = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -1, -1.0, 0.5, -0.0, 1e300, *HUGE_INTS]),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
)


def nested(depth: int) -> Any:
    """A list of lists ``depth`` deep: a decoder that recurses on it raises RecursionError."""
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def nested_map(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = {"a": value}
    return value


scalars = st.one_of(st.none(), st.booleans(), hostile_numbers, hostile_text, st.binary(max_size=40))
msgpack_values = st.recursive(
    scalars,
    lambda children: st.one_of(st.lists(children, max_size=5), st.dictionaries(hostile_text, children, max_size=5)),
    max_leaves=20,
)
"""Any value msgpack can carry, leaning to the hostile end (map keys are strings, as every
decoder unpacks with ``strict_map_key``)."""

hostile_values = st.one_of(
    msgpack_values,
    st.sampled_from([nested(DEEP), nested_map(DEEP), [], {}, [[]], {"": None}]),
)
"""A value to put where a field belongs: wrong type, out of range, non-finite, deeply nested."""
shallow_hostile_values = st.one_of(msgpack_values, st.sampled_from([nested(500), nested_map(500), [], {}]))
"""The same for JSON and TOML files, whose writers in these tests stop at 1000 levels."""


def without_bytes(value: Any) -> Any:
    """``value`` with bytes as latin-1 text, for formats that have no bytes (JSON, TOML)."""
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, list):
        return [without_bytes(v) for v in value]
    if isinstance(value, dict):
        return {k: without_bytes(v) for k, v in value.items()}
    return value


@st.composite
def mutated_map(
    draw: st.DrawFn,
    valid: Mapping[str, Any],
    protected: frozenset[str] = frozenset(),
    values: st.SearchStrategy[Any] = hostile_values,
) -> dict[str, Any]:
    """``valid`` with one change: a field replaced by one of ``values``, removed, or an extra
    field added; ``protected`` fields (the envelope's version) are left alone."""
    out = dict(valid)
    names = sorted(set(out) - protected)
    action = draw(st.sampled_from(["replace", "replace", "replace", "drop", "add"]))
    if action == "add" or not names:
        out[draw(hostile_text)] = draw(values)
        return out
    name = draw(st.sampled_from(names))
    if action == "drop":
        del out[name]
    elif isinstance(out[name], list) and out[name] and draw(st.booleans()):
        # Inside a column or a nested record: one element replaced.
        column = list(out[name])
        column[draw(st.integers(0, len(column) - 1))] = draw(values)
        out[name] = column
    else:
        out[name] = draw(values)
    return out


@st.composite
def damaged_bytes(draw: st.DrawFn, valid: bytes) -> bytes:
    """``valid`` truncated, with bytes flipped, or with random bytes spliced in."""
    raw = bytearray(valid)
    action = draw(st.sampled_from(["truncate", "flip", "splice"]))
    if action == "truncate":
        return bytes(raw[: draw(st.integers(0, max(0, len(raw) - 1)))])
    if action == "flip":
        for _ in range(draw(st.integers(1, 4))):
            if raw:
                raw[draw(st.integers(0, len(raw) - 1))] ^= draw(st.integers(1, 255))
        return bytes(raw)
    at = draw(st.integers(0, len(raw)))
    return bytes(raw[:at]) + draw(st.binary(min_size=1, max_size=16)) + bytes(raw[at:])
