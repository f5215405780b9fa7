"""The chaos runner on the launcher's supervisor (issue 20): with ``warm_standby = true`` a group
killed by a fault is restarted in the warm standby the supervisor keeps, exactly as
``replicaft-launch`` restarts it. A real run: a lighthouse, two groups of the example, a real
SIGKILL; the evidence is the run's own record and events, never a sleep."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from support.training_events import read_events

from chaos.experiment import run_experiment
from chaos.scenario import scenario_from_dict


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_warm_standby_scenario_restarts_the_killed_group_from_the_pool(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    # 2 groups: g1 is killed once the standby is ready (the fault waits for it); the run lasts
    # long enough (steps x step_delay_s) for the standby's imports and g1's heal after the kill.
    scenario = scenario_from_dict({
        "name": "standby-test", "groups": 2, "steps": 80, "step_delay_s": 0.15, "width": 16, "warm_standby": True,
        "restart_delay_s": 0.2, "heartbeat_timeout_s": 3.0, "progress_timeout_s": 20.0, "run_timeout_s": 110.0,
        "hang_bound_s": 25.0, "faults": [{"kind": "sigkill", "target": "g1", "at_step": 3}],
    })  # fmt: skip
    summary = run_experiment(scenario, tmp_path / "run")

    assert summary["violations"] == [], summary["violations"]
    assert summary["faults_injected"] == {"sigkill": 1}, summary["faults_skipped"]
    assert summary["restarts"] == {"g0": 0, "g1": 1}
    assert summary["restarts_in_standby"] == {"g0": 0, "g1": 1}
    # The standby the pool made ready is the process g1's second incarnation ran in: its
    # ``start`` event carries that pid.
    messages = [r.getMessage() for r in caplog.records]
    ready = {int(m.split()[3]) for m in messages if re.fullmatch(r"warm standby pid \d+ ready", m)}
    (restarted,) = [m for m in messages if m.startswith("started g1#2 ")]
    standby_pid = int(re.search(r"in warm standby pid (\d+)", restarted).group(1))  # type: ignore[union-attr]
    assert standby_pid in ready, (restarted, ready)
    starts = [e for e in read_events(tmp_path / "run" / "events") if e["event"] == "start" and e["replica_id"] == "g1"]
    assert [s["pid"] for s in starts][1:] == [standby_pid]
    commits_after = [
        e
        for e in read_events(tmp_path / "run" / "events")
        if e["event"] == "commit" and e["committed"] and e["replica_id"] == "g1" and e["ts"] > starts[1]["ts"]
    ]
    assert commits_after, "the restarted group rejoined and committed"
