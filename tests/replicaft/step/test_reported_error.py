"""A rank that reports an error mid-step (``Manager.report_error``) keeps its column in step.

Before, such a rank skipped the step's remaining all-reduces while the other groups ran them;
its next operation, the "ok" flag, met one of theirs, and Gloo aborted its process on the
size mismatch ("Received data size doesn't match expected size"). Now it runs them with zeros
and the step is not committed anywhere; the next step commits with the same quorum. The
same holds for a deterministic-mode step whose backward ran for fewer shards than the group
owns: it fails with a message that says so.
"""

from __future__ import annotations

import pytest
from conftest import REPO_ROOT, start_lighthouse
from support.training_events import assert_digests_agree, read_events, start_group

pytestmark = pytest.mark.slow

SCRIPT = str(REPO_ROOT / "tests" / "support" / "reported_error_train.py")
FAIL_STEP = 5


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("mode", "deterministic", "wrapper"),
    [
        ("allreduce", "0", "ddp"),
        ("backward", "0", "ddp"),
        ("skip-backward", "0", "ddp"),
        ("backward", "1", "ddp"),
        ("skip-backward", "1", "ddp"),
        ("short-backward", "1", "ddp"),
        ("backward", "0", "fsdp"),
        ("skip-backward", "0", "fsdp"),
    ],
)
def test_a_reported_error_fails_the_step_everywhere_and_no_process_dies(
    tmp_path, mode: str, deterministic: str, wrapper: str
) -> None:
    lh = start_lighthouse("--min-replicas", "2", status=False)
    groups = {
        rid: start_group(
            lh.grpc_address,
            rid,
            tmp_path,
            "12",
            mode,
            str(FAIL_STEP),
            wrapper,
            script=SCRIPT,
            REPLICAFT_DETERMINISTIC=deterministic,
        )
        for rid in ("g0", "g1")
    }
    for rid, g in groups.items():
        assert g.wait_exit(90) == 0, f"{rid}\n{g.output_tail()}"
    events = read_events(tmp_path)
    at_fail = [e for e in events if e["event"] == "commit" and e["step"] == FAIL_STEP]
    failed = [e for e in at_fail if not e["committed"]]
    assert {e["replica_id"] for e in failed} == {"g0", "g1"}, f"the step with the error committed somewhere: {at_fail}"
    reason = next(e["reason"] for e in failed if e["replica_id"] == "g0")
    assert ("backward ran 1 of the" if mode == "short-backward" else "injected by the test") in reason, reason
    retried = [e for e in at_fail if e["committed"]]
    assert {e["replica_id"] for e in retried} == {"g0", "g1"}, at_fail
    assert len({e["quorum_id"] for e in at_fail}) == 1, f"the failed step cost a new quorum: {at_fail}"
    assert_digests_agree(tmp_path, min_steps=12)
