"""replicaft under Ray Train, on a real one-node Ray cluster (issue 39): Ray's own torchft
integration running unchanged on the shim, and replicaft's native integration (replicaft/ray/).

One cluster for the module (chaos/ray_cluster.py: ``ray start --head`` on loopback, every port
asked of the OS): a start takes 7-30 s here. Each test runs a real driver process against it,
SIGKILLs one group's Ray worker process mid-training, and checks what the issue asks: Ray Train
replaces that group (a new worker process, the same replica id), the group heals from its peers
and commits again, the other groups never stop (never restarted, committing all through the
restart), the run ends by itself, and every group's state digest is equal at every committed step.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT, ManagedProcess, spawn_python
from support.training_events import assert_digests_agree, read_events, wait_for_event

from chaos.ray_cluster import RayCluster, RayNotAvailable
from replicaft.compat import TORCHFT_ALIAS_DIR

START_TIMEOUT_S = 150.0
"""Driver start to every group's first commit: 25-40 s here (Ray Train's controller, placement
group and workers are new processes, two started at a time on 2 cores)."""
RESTART_TIMEOUT_S = 90.0
"""SIGKILL to the replacement's first commit: 9-14 s here (Ray Train polls its workers every
2 s, then starts a new worker process)."""
MAX_SURVIVOR_GAP_S = 5.0
"""The longest a surviving group may go without a commit while the victim is down: the loss is
seen at once (the lighthouse session breaks) and the next quorum forms without it."""


# -- the pure parts (no cluster) ---------------------------------------------------------------


def _replicaft_ray():  # type: ignore[no-untyped-def]
    return pytest.importorskip("replicaft.ray", reason="Ray Train is not installed: pip install 'replicaft[ray]'")


def test_replicaft_ray_exports_its_three_names() -> None:
    module = _replicaft_ray()
    assert sorted(module.__all__) == ["GroupExited", "ReplicaftConfig", "run_script"]


def test_workers_get_the_drivers_replicaft_settings_but_not_the_ones_of_its_own_node() -> None:
    from replicaft.ray.script import worker_env

    env = worker_env(
        {
            "REPLICAFT_TOKEN": "t",
            "REPLICAFT_EVENTS_DIR": "/e",
            "REPLICAFT_HOST": "10.0.0.1",
            "REPLICAFT_REPLICA_ID": "g7",
            "REPLICAFT_LIGHTHOUSE": "h:1",
            "HOME": "/root",
        }
    )
    assert env == {
        "REPLICAFT_TOKEN": "t",
        "REPLICAFT_EVENTS_DIR": "/e",
        "OMP_NUM_THREADS": "1",
        "GRPC_ENABLE_FORK_SUPPORT": "0",
    }


def test_a_bad_lighthouse_flag_fails_in_the_driver_and_each_job_gets_a_token_unless_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = _replicaft_ray()
    from lighthouse.errors import OptionsError

    with pytest.raises(OptionsError, match="unknown"):
        module.ReplicaftConfig(lighthouse_args=["--min-replica", "2"])
    monkeypatch.delenv("REPLICAFT_TOKEN", raising=False)
    a, b = module.ReplicaftConfig(), module.ReplicaftConfig()
    assert a.token and b.token and a.token != b.token and a.token not in repr(a)
    monkeypatch.setenv("REPLICAFT_TOKEN", "shared")
    assert module.ReplicaftConfig(lighthouse_args=("--min-replicas", 2)).token == "shared"


def test_the_interface_of_an_address_is_found_and_an_unknown_address_has_none() -> None:
    from replicaft.ray.host import interface_of

    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("192.0.2.254") is None


@pytest.mark.parametrize(("code", "fails"), [("0", False), ("None", False), ("3", True)])
def test_a_groups_script_exit_status_decides_whether_ray_restarts_it(tmp_path: Path, code: str, fails: bool) -> None:
    _replicaft_ray()
    from replicaft.ray.script import GroupExited, run_group

    script = tmp_path / "train.py"
    script.write_text(f"import sys\nassert sys.argv[1:] == ['--steps', '3']\nsys.exit({code})\n")
    config = {"script": str(script), "args": ["--steps", "3"], "cwd": str(tmp_path)}
    if fails:
        with pytest.raises(GroupExited, match="exited with status 3"):
            run_group(config)
    else:
        run_group(config)


# -- on a real Ray cluster -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    try:
        cluster = RayCluster()
    except RayNotAvailable as e:
        pytest.skip(str(e))
    with cluster:
        yield cluster


@dataclass(frozen=True)
class Restart:
    killed_step: int
    restart_s: float
    """SIGKILL to the replacement's first commit."""
    heal: dict[str, Any]
    survivor_commits: int
    """Commits of the survivors between the SIGKILL and the replacement's first commit."""


def _committed(replica_id: str, min_step: int = 0, after_ts: float = 0.0) -> Callable[[dict[str, Any]], bool]:
    return lambda e: (
        e["event"] == "committed" and e["replica_id"] == replica_id and e["step"] >= min_step and e["ts"] > after_ts
    )


def kill_one_and_watch(events: Path, victim: str, survivors: list[str], driver: ManagedProcess) -> Restart:
    """SIGKILL ``victim``'s worker once every group has committed step 5; check that Ray replaces it,
    that it heals and commits again, and that the survivors commit throughout."""
    for rid in (victim, *survivors):
        wait_for_event(events, _committed(rid, 5), START_TIMEOUT_S, f"{rid} committed step 5", driver)
    (start,) = [e for e in read_events(events) if e["event"] == "start" and e["replica_id"] == victim]
    os.kill(start["pid"], signal.SIGKILL)
    killed_at = time.time()
    killed_step = max(e["step"] for e in read_events(events) if _committed(victim)(e))
    replacement = wait_for_event(
        events,
        lambda e: e["event"] == "start" and e["replica_id"] == victim and e["ts"] > killed_at,
        RESTART_TIMEOUT_S,
        f"{victim} restarted by Ray",
        driver,
    )
    assert replacement["pid"] != start["pid"], "Ray must run the group in a new worker process"
    heal = wait_for_event(
        events,
        lambda e: e["event"] == "heal_end" and e["replica_id"] == victim and e["ts"] > killed_at,
        RESTART_TIMEOUT_S,
        f"{victim} healed",
        driver,
    )
    assert heal["ok"], heal
    first = wait_for_event(
        events, _committed(victim, 0, killed_at), RESTART_TIMEOUT_S, f"{victim} committed after its heal", driver
    )
    assert first["step"] == heal["step"] + 1, (first, heal)

    everything = read_events(events)
    survivor_commits = 0
    for rid in survivors:
        starts = [e for e in everything if e["event"] == "start" and e["replica_id"] == rid]
        assert len(starts) == 1, f"survivor {rid} was restarted: {starts}"
        times = (
            [killed_at]
            + sorted(e["ts"] for e in everything if _committed(rid, 0, killed_at)(e) and e["ts"] <= first["ts"])
            + [first["ts"]]
        )
        gap = max(b - a for a, b in zip(times, times[1:], strict=False))
        assert gap < MAX_SURVIVOR_GAP_S, f"survivor {rid} stopped for {gap:.1f}s while {victim} was down"
        survivor_commits += len(times) - 2
    return Restart(killed_step, first["ts"] - killed_at, heal, survivor_commits)


def finish_and_compare(driver: ManagedProcess, events: Path, restart: Restart, what: str) -> None:
    """The run ends by itself with exit 0; digests agree at every committed step, the victim's
    steps after its heal included."""
    assert driver.wait_exit(START_TIMEOUT_S) == 0, driver.output_tail(60)
    num_steps = assert_digests_agree(events, min_steps=restart.heal["step"] + 2)
    print(
        f"{what}: {num_steps} committed steps, equal digests at each; killed at step {restart.killed_step}, "
        f"first commit {restart.restart_s:.1f}s after the SIGKILL (heal to step {restart.heal['step']} in "
        f"{restart.heal['seconds']:.2f}s); survivors committed {restart.survivor_commits} steps meanwhile",
        file=sys.stderr,
    )


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_ray_trains_torchfts_own_example_on_the_shim_through_a_sigkilled_group(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    events = tmp_path / "events"
    env = ray_cluster.driver_env()
    env.update(REPLICAFT_EVENTS_DIR=str(events), PYTHONPATH=os.pathsep.join([str(TORCHFT_ALIAS_DIR), str(REPO_ROOT)]))
    # 3000 steps of the example: ~35 s with three groups, so the survivors are still training when
    # the replacement comes back (~1000 steps later) and it trains the last ones beside them.
    driver = spawn_python(
        str(REPO_ROOT / "tests" / "support" / "ray_torchft_driver.py"),
        "--steps",
        "3000",
        "--storage-path",
        str(tmp_path / "ray"),
        name="ray-torchft",
        env=env,
    )
    _, resolved = driver.wait_for_json(lambda o: o.get("event") == "torchft_is", 60)
    assert Path(resolved["file"]).is_relative_to(REPO_ROOT / "replicaft" / "compat"), resolved
    restart = kill_one_and_watch(events, "train_ddp_1", ["train_ddp_0", "train_ddp_2"], driver)
    finish_and_compare(driver, events, restart, "Ray TorchftConfig on the shim")
    assert driver.wait_for_json(lambda o: o.get("event") == "ray_result", 5)[1]["error"] is None
    log = "\n".join(line.text for stream in ("stdout", "stderr") for line in driver.lines(stream))
    assert "Replacing failing replica groups: {1}" in log, "Ray Train must replace the one failed group"


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_replicaft_ray_runs_a_script_in_three_groups_through_a_sigkilled_group(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    events = tmp_path / "events"
    env = ray_cluster.driver_env()
    env["REPLICAFT_EVENTS_DIR"] = str(events)
    driver = spawn_python(
        "-m",
        "replicaft.ray",
        "--groups",
        "3",
        "--max-restarts",
        "3",
        "--storage-path",
        str(tmp_path / "ray"),
        str(REPO_ROOT / "examples" / "train_ddp.py"),
        "--steps",
        "400",
        "--step-delay",
        "0.03",
        name="replicaft.ray",
        env=env,
    )
    restart = kill_one_and_watch(events, "g1", ["g0", "g2"], driver)
    finish_and_compare(driver, events, restart, "replicaft.ray")
    assert "replicaft.ray: every group trained all its steps" in [line.text for line in driver.lines()]
