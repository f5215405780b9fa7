"""What the runner knows of the job (chaos/job_view.py): each rank's process by the pid of its
start event, so a restarted group's new processes and W > 1 ranks are told apart."""

from __future__ import annotations

from typing import Any

from chaos.job_view import JobView


def ev(event: str, group: str, ts: float, *, rank: int = 0, step: int = 0, **fields: Any) -> dict[str, Any]:
    return {"ts": ts, "event": event, "step": step, "quorum_id": 1, "replica_id": group, "group_rank": rank, **fields}


def test_ranks_of_a_group_have_their_own_pids_and_restarts_replace_them() -> None:
    job = JobView()
    job.absorb(
        [
            ev("start", "g1", 1.0, rank=0, pid=10),
            ev("start", "g1", 1.1, rank=1, pid=11),
            ev("commit", "g1", 2.0, rank=1, step=1, committed=True),
        ]
    )
    assert job.rank_pids("g1", since_ts=0.5) == {0: 10, 1: 11}
    assert job.committed_since("g1", 0.5)
    # Restarted at t=5: nothing of the new incarnation has started or committed yet.
    assert job.rank_pids("g1", since_ts=5.0) == {}
    assert not job.committed_since("g1", 5.0)
    job.absorb([ev("start", "g1", 6.0, rank=0, pid=20), ev("start", "g1", 6.1, rank=1, pid=21)])
    assert job.rank_pids("g1", since_ts=5.0) == {0: 20, 1: 21}
    assert not job.committed_since("g1", 5.0)


def test_finished_means_a_current_process_stopped_at_the_target() -> None:
    job = JobView()
    job.absorb([ev("start", "g0", 1.0, pid=10), ev("stop", "g0", 2.0, step=7, reason="preempted (SIGTERM)")])
    assert not job.finished_since("g0", 0.5, target_steps=10)
    job.absorb([ev("start", "g0", 3.0, pid=12), ev("stop", "g0", 9.0, step=10, reason="shutdown")])
    assert job.finished_since("g0", 2.5, target_steps=10)
    assert not job.finished_since("g0", 4.0, target_steps=10)


def test_job_step_and_published_checkpoints_are_folded_in() -> None:
    job = JobView()
    job.absorb(
        [
            ev("commit", "g0", 2.0, step=4, committed=True),
            ev("commit", "g1", 1.9, step=3, committed=True),
            ev("commit", "g0", 2.5, step=5, committed=False),
            ev("checkpoint", "g0", 3.0, checkpoint_step=4, ok=True),
            ev("checkpoint", "g0", 4.0, checkpoint_step=5, ok=False),
        ]
    )
    assert (job.step, job.first_commit_ts) == (4, 1.9)
    assert job.checkpoints == [(3.0, 4)]
