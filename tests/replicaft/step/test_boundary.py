"""The step boundary's digest (replicaft/step/boundary.py): the ``committed`` event carries the
digest of exactly the state committed at that step, whatever writes the state afterwards, and
two groups holding the same state report the same digest.

The chaos harness's identical_digests invariant trusts this: a digest hashed later (on a thread,
from bytes the next optimizer step already changed) would compare states of different steps.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from replicaft.config.options import ManagerOptions
from replicaft.persistence.duties import Persistence
from replicaft.state.content import CHUNK_BYTES
from replicaft.state.flat import flatten, step_digest
from replicaft.state.registry import StateRegistry
from replicaft.step.boundary import StepBoundary
from replicaft.telemetry.events import EventLog
from replicaft.transfer.spare import SpareBuffer

EVENT_TIMEOUT_S = 10.0


class CommittedDigests:
    """The boundary's ``emit``: keeps each ``committed`` event's digest, in order."""

    def __init__(self) -> None:
        self.digests: list[str] = []
        self._arrived = threading.Condition()

    def emit(self, event: str, **fields: Any) -> None:
        if event == "committed":
            with self._arrived:
                self.digests.append(fields["digest"])
                self._arrived.notify_all()

    def wait(self, count: int) -> list[str]:
        """The first ``count`` digests, once they have been emitted (an assertion error past the deadline)."""
        with self._arrived:
            assert self._arrived.wait_for(lambda: len(self.digests) >= count, EVENT_TIMEOUT_S), (
                f"{len(self.digests)} committed digests after {EVENT_TIMEOUT_S} s, expected {count}"
            )
            return self.digests[:count]


def training_state(shift: float = 0.0) -> dict[str, torch.Tensor]:
    """Parameters spanning several hash pieces (the last one partial) plus a small buffer."""
    return {
        "w": torch.arange(2 * CHUNK_BYTES // 4 + 3, dtype=torch.float32) + shift,
        "running_mean": torch.full((5,), 0.5),
    }


Boundaries = Callable[..., tuple[StepBoundary, CommittedDigests]]


@pytest.fixture
def boundaries(tmp_path: Path) -> Iterator[Boundaries]:
    """Makes a group's boundary over ``state`` (registered as ``model``), with its event log in
    ``tmp_path``; closes the logs after the test."""
    logs: list[EventLog] = []

    def make(name: str, state: dict[str, torch.Tensor], every: int = 1) -> tuple[StepBoundary, CommittedDigests]:
        registry = StateRegistry()
        registry.register_state("model", lambda: state, state.update)
        recorder = CommittedDigests()
        options = ManagerOptions(lighthouse="127.0.0.1:1", replica_id=name)
        persistence = Persistence(options, recorder.emit, SpareBuffer())
        logs.append(EventLog(tmp_path, name, 0))
        return StepBoundary(every, registry, persistence, logs[-1], recorder.emit), recorder

    yield make
    for log in logs:
        log.close()


def digest_of(state: dict[str, torch.Tensor]) -> str:
    return step_digest(flatten({"model": state}))


def test_the_committed_digest_is_of_the_state_at_the_boundary_not_after_the_next_write(
    boundaries: Boundaries,
) -> None:
    state = training_state()
    committed = digest_of({k: v.clone() for k, v in state.items()})
    step, recorder = boundaries("g0", state)
    step.committed(7)
    step.close(None)
    with torch.no_grad():  # the next step's optimizer step and forward, right after the boundary
        state["w"].add_(1.0)
        state["running_mean"].mul_(0.9)
    (reported,) = recorder.wait(1)
    assert reported == committed
    assert reported != digest_of(state)


def test_groups_holding_the_same_state_report_the_same_digest_and_a_changed_element_shows(
    boundaries: Boundaries,
) -> None:
    same = training_state()
    # The same values in another layout (a transposed copy viewed back): the digest is of the
    # values, dtype and shape, not of where they sit in memory.
    w = same["w"]
    relaid = {"w": w.reshape(1, -1).t().contiguous().t().reshape(-1), "running_mean": same["running_mean"].clone()}
    changed = training_state()
    changed["w"][CHUNK_BYTES // 4 + 1] += 1  # one element, in the second piece
    reports = []
    for name, state in (("g0", same), ("g1", relaid), ("g2", changed)):
        step, recorder = boundaries(name, state)
        step.committed(3)
        step.close(None)
        reports.append(recorder.wait(1)[0])
    assert reports[0] == reports[1] != reports[2]


def test_a_digest_every_n_steps_is_of_those_steps_states(boundaries: Boundaries) -> None:
    state = training_state()
    step, recorder = boundaries("g0", state, every=2)
    expected = []
    for n in (1, 2, 3, 4):
        with torch.no_grad():
            state["w"].add_(1.0)
        if n % 2 == 0:
            expected.append(digest_of(state))
        step.committed(n)
        step.close(None)
    assert recorder.wait(2) == expected
    assert len(recorder.digests) == 2
