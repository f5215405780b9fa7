"""A torchft-style script runs on replicaft.compat.torchft and survives a SIGKILL of a group."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import REPO_ROOT, ManagedProcess, spawn_python, start_lighthouse

from replicaft.compat import TORCHFT_ALIAS_DIR, torchft
from replicaft.compat.torchft.process_group import FakeProcessGroupWrapper
from replicaft.errors import OptionsError

SCRIPT = str(REPO_ROOT / "tests" / "support" / "torchft_style_train.py")


def start(lighthouse: str, replica_id: str, steps: int) -> ManagedProcess:
    # The alias folder first on the path: the script imports `torchft` and runs unmodified.
    alias = TORCHFT_ALIAS_DIR
    env = dict(
        os.environ,
        TORCHFT_LIGHTHOUSE=f"http://{lighthouse}",
        REPLICA_GROUP_ID=replica_id,
        REPLICA_GROUP_NUM=replica_id.removeprefix("g"),
        PYTHONPATH=f"{alias}{os.pathsep}{REPO_ROOT}",
    )
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return spawn_python(SCRIPT, str(steps), "0.1", name=replica_id, env=env)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_unmodified_torchft_script_survives_a_killed_group_with_equal_weights_at_every_step(tmp_path: Path) -> None:
    lh = start_lighthouse(status=False)
    g0 = start(lh.grpc_address, "g0", 80)
    g1 = start(lh.grpc_address, "g1", 80)
    g1.wait_for_json(lambda o: o.get("event") == "step" and o["step"] >= 8, 90, what="g1 at step 8")
    g1.kill()
    g1 = start(lh.grpc_address, "g1", 80)
    _, final0 = g0.wait_for_json(lambda o: o.get("event") == "final", 120, what="g0 final weights")
    _, final1 = g1.wait_for_json(lambda o: o.get("event") == "final", 120, what="g1 final weights")
    assert g0.wait_exit(30) == 0 and g1.wait_exit(30) == 0
    assert final0["digest"] == final1["digest"]
    by_step: dict[int, set[str]] = {}
    for g in (g0, g1):
        for o in g.json_lines():
            if o.get("event") == "step":
                by_step.setdefault(o["step"], set()).add(o["digest"])
    assert all(len(d) == 1 for d in by_step.values()), {s: d for s, d in by_step.items() if len(d) > 1}
    steps_after_restart = [o["step"] for o in g1.json_lines() if o.get("event") == "step"]
    assert steps_after_restart and steps_after_restart[0] > 8, "the restarted group should heal, not start over"


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"world_size_mode": torchft.WorldSizeMode.FIXED_WITH_SPARES}, "FIXED_WITH_SPARES"),
        ({"checkpoint_transport": object()}, "checkpoint_transport"),
        ({"lighthouse_addr": None}, "TORCHFT_LIGHTHOUSE"),
    ],
)
def test_unsupported_arguments_raise_a_clear_error(
    kwargs: dict, fragment: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    args = dict(
        pg=torchft.ProcessGroupGloo(),
        load_state_dict=None,
        state_dict=None,
        min_replica_size=1,
        lighthouse_addr="127.0.0.1:1",
        replica_id="g0",
    )
    args.update(kwargs)
    with pytest.raises(OptionsError, match=fragment):
        torchft.Manager(**args)


def test_the_shim_has_torchft_020s_public_import_paths() -> None:
    import importlib

    for module, names in {
        "replicaft.compat.torchft": [
            "DistributedSampler",
            "Manager",
            "Optimizer",
            "DistributedDataParallel",
            "ProcessGroupGloo",
            "ProcessGroupNCCL",
            "ProcessGroupBabyNCCL",
            "ProcessGroupXCCL",
        ],
        "replicaft.compat.torchft.optim": ["OptimizerWrapper"],
        "replicaft.compat.torchft.local_sgd": ["LocalSGD", "DiLoCo"],
        "replicaft.compat.torchft.checkpointing": ["CheckpointTransport", "PGTransport", "HTTPTransport"],
        "replicaft.compat.torchft.checkpointing.pg_transport": ["PGTransport"],
        "replicaft.compat.torchft.coordination": [
            "LighthouseServer",
            "LighthouseClient",
            "ManagerServer",
            "ManagerClient",
            "Quorum",
            "QuorumMember",
        ],
        "replicaft.compat.torchft._torchft": ["LighthouseServer"],
    }.items():
        m = importlib.import_module(module)
        assert all(hasattr(m, n) for n in names), (module, [n for n in names if not hasattr(m, n)])


def test_import_torchft_resolves_to_the_shim_through_the_alias_folder() -> None:
    import subprocess
    import sys

    alias = TORCHFT_ALIAS_DIR
    code = (
        "import torchft, torchft.manager, torchft.process_group as pg, replicaft.compat.torchft as shim;"
        "print(torchft is shim, torchft.manager.Manager is shim.Manager, pg.ProcessGroupGloo is shim.ProcessGroupGloo)"
    )
    env = dict(os.environ, PYTHONPATH=f"{alias}{os.pathsep}{REPO_ROOT}")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["True", "True", "True"]


@pytest.mark.parametrize("build", [torchft.ProcessGroupXCCL, lambda: FakeProcessGroupWrapper(object())])
def test_process_groups_replicaft_cannot_honour_fail_at_construction(build: type) -> None:
    with pytest.raises(OptionsError, match="XCCL|wrap a process group"):
        build()


def test_an_error_injected_through_fake_process_group_wrapper_fails_the_step() -> None:
    wrapper = FakeProcessGroupWrapper(torchft.ProcessGroupGloo())
    wrapper.report_future_error(RuntimeError("injected allreduce error"))
    assert str(wrapper.take_error()) == "injected allreduce error" and wrapper.take_error() is None


def test_a_checkpoint_transport_is_accepted_and_the_log_says_replicaft_moves_the_state(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replicaft.compat.torchft.checkpointing import PGTransport
    from replicaft.compat.torchft.manager import Manager

    started = []
    monkeypatch.setattr("replicaft.Manager.start", lambda self: started.append(self) or self)
    with caplog.at_level("INFO", logger="replicaft.compat.torchft.manager"):
        Manager(
            pg=torchft.ProcessGroupGloo(),
            load_state_dict=None,
            state_dict=None,
            min_replica_size=1,
            lighthouse_addr="127.0.0.1:1",
            replica_id="g0",
            checkpoint_transport=PGTransport(None),
        )
    assert started and "replicaft's own transfer" in caplog.text


def test_distributed_sampler_shards_by_group_and_rank_as_torchft_does() -> None:
    shards = [
        list(
            torchft.DistributedSampler(
                range(12), replica_rank=g, num_replica_groups=2, group_rank=r, num_replicas=2, shuffle=False
            )
        )
        for g in range(2)
        for r in range(2)
    ]
    assert shards == [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]


@pytest.mark.timeout(60)
def test_coordination_lighthouse_forms_a_quorum_for_two_replica_ids() -> None:
    import datetime
    import threading

    from replicaft.compat.torchft.coordination import LighthouseClient, LighthouseServer

    server = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=100)
    client = LighthouseClient(server.address(), connect_timeout=datetime.timedelta(seconds=5))
    try:
        results = {}

        def join(rid: str) -> None:
            results[rid] = client.quorum(
                rid,
                timeout=datetime.timedelta(seconds=20),
                address=f"{rid}:1",
                store_address=f"{rid}:2",
                step=3,
                world_size=1,
            )

        threads = [threading.Thread(target=join, args=(rid,)) for rid in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results["a"] == results["b"]
        assert [(m.replica_id, m.store_address, m.step) for m in results["a"].participants] == [
            ("a", "a:2", 3),
            ("b", "b:2", 3),
        ]
    finally:
        client.close()
        server.shutdown()


def test_torchfts_lighthouse_test_arguments_are_accepted_issue_43() -> None:
    """torchft's own lighthouse test runs ``LighthouseServer(heartbeat_timeout_ms=100)``; the
    0.25 s floor on a hung member's silence, above that timeout, refused it."""
    from replicaft.compat.torchft.coordination import LighthouseServer

    server = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=100, heartbeat_timeout_ms=100)
    try:
        assert server.address()
    finally:
        server.shutdown()


def _unstarted_manager(monkeypatch: pytest.MonkeyPatch, **kwargs: object) -> torchft.Manager:
    """A compat manager whose replicaft manager never starts (no lighthouse): for the facade's own rules."""
    monkeypatch.setattr("replicaft.Manager.start", lambda self: self)
    args: dict[str, object] = dict(
        pg=torchft.ProcessGroupGloo(),
        load_state_dict=None,
        state_dict=None,
        min_replica_size=1,
        lighthouse_addr="127.0.0.1:1",
        replica_id="g0",
    )
    args.update(kwargs)
    return torchft.Manager(**args)


@pytest.mark.timeout(60)
def test_a_per_call_deadline_that_runs_out_raises_timeout_error_within_it() -> None:
    """torchft's start_quorum(timeout=) and should_commit(timeout=) are that call's deadline:
    here a group of two ranks whose second never starts, so neither the group's quorum nor its
    vote can complete. Each call raises TimeoutError (torchft's message) soon after its 0.2 s,
    not after the manager's 10 s deadlines."""
    import datetime
    import time

    import torch.distributed as dist

    from replicaft.compat.torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1)
    store = dist.TCPStore(host_name="127.0.0.1", port=0, is_master=True, wait_for_workers=False)
    manager = torchft.Manager(
        pg=torchft.ProcessGroupGloo(),
        min_replica_size=1,
        load_state_dict=lambda s: None,
        state_dict=lambda: {},
        replica_id="alone",
        lighthouse_addr=lighthouse.address(),
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=2,
        timeout=datetime.timedelta(seconds=5),
        quorum_timeout=datetime.timedelta(seconds=10),
        use_async_quorum=False,
    )
    try:
        for call in (manager.start_quorum, manager.should_commit):
            started = time.monotonic()
            with pytest.raises(TimeoutError, match="status: Cancelled, message: Timeout expired"):
                call(timeout=datetime.timedelta(seconds=0.2))
            assert 0.2 <= time.monotonic() - started < 2.0, call
    finally:
        manager.shutdown(wait=False)
        lighthouse.shutdown()


def test_user_state_is_neither_served_nor_loaded_once_kept_per_group(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    loaded: list[object] = []
    manager = _unstarted_manager(monkeypatch, state_dict=lambda: {"w": torch.ones(2)}, load_state_dict=loaded.append)
    served = manager.inner.state_dict()
    assert torch.equal(served["default"]["w"], torch.ones(2)) and "rng" not in served
    manager.keep_user_state_per_group()
    assert manager.inner.state_dict()["default"] == {}
    manager.inner.load_state_dict({**served, "default": {}})
    assert loaded == []
    assert torch.equal(manager._manager_state_dict()["user"]["default"]["w"], torch.ones(2))


def _run_replicas(steps: object, num_replicas: int = 2) -> list[object]:
    """Run ``steps(replica_index, manager)`` for ``num_replicas`` compat managers of one job, each on
    its own thread as torchft's tests do, against an in-process lighthouse; their results in order."""
    import datetime
    from concurrent.futures import ThreadPoolExecutor

    from replicaft.compat.torchft.coordination import LighthouseServer

    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=num_replicas, join_timeout_ms=100)

    def replica(i: int) -> object:
        # init_sync=False: no heal at step 0, whose timing (a healer commits once its fetch has
        # arrived) is not what these tests are about.
        manager = torchft.Manager(
            pg=torchft.ProcessGroupGloo(),
            min_replica_size=num_replicas,
            init_sync=False,
            load_state_dict=lambda s: None,
            state_dict=lambda: {},
            replica_id=f"r{i}",
            lighthouse_addr=lighthouse.address(),
            rank=0,
            world_size=1,
            timeout=datetime.timedelta(seconds=5),
            quorum_timeout=datetime.timedelta(seconds=10),
            use_async_quorum=False,
        )
        try:
            return steps(i, manager)  # type: ignore[operator]
        finally:
            manager.shutdown()

    try:
        with ThreadPoolExecutor(num_replicas) as pool:
            return [f.result(60) for f in [pool.submit(replica, i) for i in range(num_replicas)]]
    finally:
        lighthouse.shutdown()


@pytest.mark.timeout(90)
def test_should_commit_after_should_commit_commits_the_next_step_on_its_own_quorum() -> None:
    """torchft's diloco_regression_test commits twice after one start_quorum(); the second
    commit used to re-vote the first step's plan and leave the step at 1."""

    def steps(_: int, manager: torchft.Manager) -> list[object]:
        manager.start_quorum()
        return [manager.should_commit(), manager.should_commit(), manager.current_step()]

    assert _run_replicas(steps) == [[True, True, 2], [True, True, 2]]


@pytest.mark.timeout(90)
def test_state_dict_fns_and_the_managers_own_counters_as_torchtitan_uses_them_issue_43() -> None:
    """torchtitan hands its state over with the deprecated ``set_state_dict_fns`` and saves and
    restores the manager's counters in its own checkpoint (``state_dict``/``load_state_dict``):
    a job restored at step 5 commits step 6 next, in both groups; a restore once the job has
    started is refused, naming the step."""
    import torch

    from replicaft.errors import StateError

    def steps(i: int, manager: torchft.Manager) -> list[object]:
        manager.set_state_dict_fns(lambda s: None, lambda: {"w": torch.full((2,), 3.0)})
        manager.load_state_dict({"step": 5, "batches_committed": 5})
        manager.start_quorum()
        committed = manager.should_commit()
        with pytest.raises(StateError, match=r"restore_step\(2\) after the job started \(at step 6\)"):
            manager.load_state_dict({"step": 2, "batches_committed": 2})
        user = manager._manager_state_dict()["user"]
        return [committed, manager.state_dict(), sorted(user), float(user["set_state_dict_fns"]["w"].sum())]

    expected = [True, {"step": 6, "batches_committed": 6}, ["default", "set_state_dict_fns"], 6.0]
    assert _run_replicas(steps) == [expected, expected]


def test_torchft_managed_process_group_is_replicaft_s_c10d_group(tmp_path) -> None:
    import torch.distributed as dist

    import replicaft
    from replicaft.compat.torchft.process_group import ManagedProcessGroup

    manager = replicaft.Manager(
        replicaft.ManagerOptions(lighthouse="127.0.0.1:1", replica_id="u", events_dir=str(tmp_path))
    )
    pg = ManagedProcessGroup(manager)
    assert isinstance(pg, dist.ProcessGroup) and isinstance(pg, replicaft.ManagedProcessGroup)
