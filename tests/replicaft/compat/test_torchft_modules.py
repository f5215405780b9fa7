"""The torchft modules a program imports exist under the shim without torchft, with torchft's
semantics: ``futures``, ``work``, ``utils``, ``multiprocessing``, ``torchcomms`` (refused),
``ErrorSwallowingProcessGroupWrapper``, ``PureDistributedDataParallel`` and ``Manager.wrap_future``
(the last two in two real group processes against a real lighthouse)."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import threading
import time
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from conftest import REPO_ROOT, spawn_python, start_lighthouse

from replicaft.compat import TORCHFT_ALIAS_DIR
from replicaft.compat.torchft import ProcessGroupGloo
from replicaft.compat.torchft.futures import context_timeout, future_timeout, future_wait, stream_timeout
from replicaft.compat.torchft.multiprocessing import _MonitoredPipe
from replicaft.compat.torchft.process_group import ErrorSwallowingProcessGroupWrapper
from replicaft.compat.torchft.torchcomms import ProcessGroupTorchComms
from replicaft.compat.torchft.utils import get_stream_context, record_event, synchronize
from replicaft.compat.torchft.work import _DummyWork, _FutureWork
from replicaft.errors import OptionsError

SHORT = datetime.timedelta(seconds=0.2)
LONG_S = 10.0
"""The bound on a wait that should end at once: long enough for a loaded machine."""


def test_future_timeout_passes_a_result_and_an_exception_through() -> None:
    ok: torch.futures.Future[int] = torch.futures.Future()
    timed = future_timeout(ok, datetime.timedelta(seconds=LONG_S))
    ok.set_result(3)
    assert timed.wait() == 3
    failing: torch.futures.Future[int] = torch.futures.Future()
    timed = future_timeout(failing, datetime.timedelta(seconds=LONG_S))
    failing.set_exception(ValueError("bad input"))
    with pytest.raises(ValueError, match="bad input"):
        timed.wait()


def test_future_timeout_fails_with_timeout_error_at_its_deadline_and_drops_a_late_result() -> None:
    never: torch.futures.Future[int] = torch.futures.Future()
    started = time.monotonic()
    timed = future_timeout(never, SHORT)
    with pytest.raises(TimeoutError, match="did not complete within"):
        timed.wait()
    assert SHORT.total_seconds() <= time.monotonic() - started < LONG_S
    never.set_result(1)  # the late result is dropped, not an error
    assert timed.done()


def _deadline_in_a_forked_child(result: object) -> None:
    fired = threading.Event()
    with context_timeout(fired.set, SHORT):
        result.put(fired.wait(LONG_S))  # type: ignore[attr-defined]


def test_deadlines_fire_in_a_forked_child_after_the_parent_used_them() -> None:
    with context_timeout(lambda: None, SHORT):
        pass  # the parent's deadline thread is running now; a fork does not copy it
    ctx = multiprocessing.get_context("fork")
    result = ctx.Queue()
    child = ctx.Process(target=_deadline_in_a_forked_child, args=(result,))
    child.start()
    try:
        assert result.get(timeout=LONG_S * 3) is True
        child.join(LONG_S)
    finally:
        if child.is_alive():
            child.kill()


def test_future_wait_returns_raises_or_times_out() -> None:
    done: torch.futures.Future[str] = torch.futures.Future()
    done.set_result("x")
    assert future_wait(done, SHORT) == "x"
    failed: torch.futures.Future[str] = torch.futures.Future()
    failed.set_exception(KeyError("k"))
    with pytest.raises(KeyError):
        future_wait(failed, SHORT)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        future_wait(torch.futures.Future(), SHORT)
    assert SHORT.total_seconds() <= time.monotonic() - started < LONG_S


def test_context_timeout_calls_back_only_when_the_block_overruns() -> None:
    fired = threading.Event()
    with context_timeout(fired.set, SHORT):
        assert fired.wait(LONG_S), "the callback should run while the block is still inside"
    quiet = threading.Event()
    with context_timeout(quiet.set, SHORT):
        pass
    assert not quiet.wait(SHORT.total_seconds() * 3)


def test_stream_timeout_schedules_nothing_without_an_accelerator() -> None:
    if torch.accelerator.is_available():
        pytest.skip("an accelerator is present: its stream is checked for real")
    called = threading.Event()
    stream_timeout(called.set, datetime.timedelta(0))
    assert not called.wait(SHORT.total_seconds())


def test_timeouts_must_be_timedeltas_as_in_torchft() -> None:
    with pytest.raises(TypeError, match="timedelta"):
        future_wait(torch.futures.Future(), 5)  # type: ignore[arg-type]


def test_dummy_work_is_a_finished_work_holding_its_result() -> None:
    work = _DummyWork([torch.ones(2)])
    assert isinstance(work, torch.distributed.Work)
    assert work.wait() and work.is_completed()
    assert torch.equal(work.get_future().wait()[0], torch.ones(2))


def test_future_work_waits_for_its_future_under_a_timeout() -> None:
    fut: torch.futures.Future[object] = torch.futures.Future()
    work = _FutureWork(fut)
    assert not work.is_completed()
    with pytest.raises(TimeoutError):
        work.wait(SHORT)
    threading.Thread(target=fut.set_result, args=(5,)).start()
    assert work.wait(datetime.timedelta(seconds=LONG_S)) and work.is_completed()
    assert work.get_future() is fut and fut.value() == 5


def test_stream_helpers_are_no_ops_without_an_accelerator() -> None:
    if torch.accelerator.is_available():
        pytest.skip("an accelerator is present")
    assert isinstance(get_stream_context(None), nullcontext)
    assert record_event() is None
    synchronize()


def _child_sends(end: object) -> None:
    pipe = _MonitoredPipe(end)  # type: ignore[arg-type]
    pipe.send({"ok": 1})
    pipe.send(RuntimeError("failed in the child"))


def test_monitored_pipe_receives_from_a_child_process_raises_its_error_and_times_out() -> None:
    ctx = multiprocessing.get_context("spawn")
    mine, theirs = ctx.Pipe()
    child = ctx.Process(target=_child_sends, args=(theirs,))
    child.start()
    try:
        pipe = _MonitoredPipe(mine)
        assert pipe.recv(datetime.timedelta(seconds=60)) == {"ok": 1}
        with pytest.raises(RuntimeError, match="failed in the child"):
            pipe.recv(60)
        child.join(60)
        assert child.exitcode == 0
        with pytest.raises(TimeoutError, match="timed out after 0.1 seconds"):
            pipe.recv(0.1)
        pipe.close()
        assert pipe.closed()
    finally:
        if child.is_alive():
            child.kill()


def test_torchcomms_group_is_refused_naming_the_groups_to_use() -> None:
    with pytest.raises(OptionsError, match="ProcessGroupNCCL .*ProcessGroupGloo"):
        ProcessGroupTorchComms(object(), timeout=datetime.timedelta(seconds=1))


def test_error_swallowing_wrapper_keeps_a_reported_error_until_configure() -> None:
    wrapper = ErrorSwallowingProcessGroupWrapper(ProcessGroupGloo(timeout=datetime.timedelta(seconds=7)))
    assert wrapper.backend == "gloo" and wrapper.timeout == datetime.timedelta(seconds=7)
    assert wrapper.error() is None
    error = RuntimeError("collective failed")
    wrapper.report_error(error)
    assert wrapper.error() is error
    wrapper.configure("127.0.0.1:1/prefix", "r0", 0, 2)
    assert wrapper.error() is None
    with pytest.raises(OptionsError, match="wrap a process group"):
        ErrorSwallowingProcessGroupWrapper(object())  # type: ignore[arg-type]


GROUP = """
import datetime, json, sys, threading
import torch
from torch import nn
from torchft import Manager, ProcessGroupGloo
from torchft.ddp import PureDistributedDataParallel

group = int(sys.argv[1])
manager = Manager(pg=ProcessGroupGloo(), load_state_dict=None, state_dict=None, min_replica_size=2,
    replica_id=f"g{group}", lighthouse_addr=sys.argv[2], rank=0, world_size=1, init_sync=False,
    use_async_quorum=False, timeout=datetime.timedelta(seconds=20))

def report(**fields):
    print(json.dumps(fields), flush=True)

# 1. A future that succeeds: its value, and the step commits.
manager.start_quorum()
fut = torch.futures.Future()
wrapped = manager.wrap_future(fut, -1)
fut.set_result(7)
report(case="value", value=wrapped.wait(), committed=manager.should_commit())

# 2. Group 1's future fails on another thread: the default there, and neither group commits.
manager.start_quorum()
fut = torch.futures.Future()
wrapped = manager.wrap_future(fut, -1)
if group == 1:
    threading.Thread(target=fut.set_exception, args=(RuntimeError("failed copy"),)).start()
else:
    fut.set_result(7)
report(case="failed", value=wrapped.wait(), committed=manager.should_commit())

# 3. Group 0's future outlasts its timeout: the default there, and neither group commits.
manager.start_quorum()
fut = torch.futures.Future()
wrapped = manager.wrap_future(fut, -2, timeout=datetime.timedelta(seconds=0.3) if group == 0 else None)
if group == 1:
    fut.set_result(7)
report(case="timeout", value=wrapped.wait(), committed=manager.should_commit())

# 4. PureDistributedDataParallel averages each gradient across the groups.
model = nn.Linear(2, 1, bias=False)
with torch.no_grad():
    model.weight.fill_(1.0)
ddp = PureDistributedDataParallel(manager, model)
manager.start_quorum()
x = torch.tensor([[1.0, 0.0]]) if group == 0 else torch.tensor([[0.0, 3.0]])
ddp(x).sum().backward()
committed = manager.should_commit()
report(case="pure_ddp", grad=model.weight.grad.tolist(), committed=committed, step=manager.current_step())
manager.shutdown()
"""


@pytest.mark.timeout(180)
def test_wrap_future_and_pure_ddp_in_two_group_processes(tmp_path: Path) -> None:
    script = tmp_path / "group.py"
    script.write_text(GROUP)
    lighthouse = start_lighthouse("--min-replicas", "2", status=False)
    env = dict(os.environ, PYTHONPATH=f"{TORCHFT_ALIAS_DIR}{os.pathsep}{REPO_ROOT}")
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHFT_LIGHTHOUSE"):
        env.pop(key, None)
    groups = [spawn_python(str(script), str(i), lighthouse.grpc_address, name=f"g{i}", env=env) for i in (0, 1)]
    results = []
    for g in groups:
        g.wait_for_json(lambda o: o.get("case") == "pure_ddp", 120, what=f"{g} PureDDP step")
        assert g.wait_exit(60) == 0, g.output_tail()
        results.append({o["case"]: o for o in g.json_lines() if "case" in o})
    g0, g1 = results
    assert g0["value"] == {"case": "value", "value": 7, "committed": True} == g1["value"]
    assert (g0["failed"]["value"], g1["failed"]["value"]) == (7, -1)
    assert not g0["failed"]["committed"] and not g1["failed"]["committed"]
    assert (g0["timeout"]["value"], g1["timeout"]["value"]) == (-2, 7)
    assert not g0["timeout"]["committed"] and not g1["timeout"]["committed"]
    for r in (g0, g1):
        assert r["pure_ddp"]["committed"] and r["pure_ddp"]["grad"] == [[0.5, 1.5]], r["pure_ddp"]


WITHOUT_TORCHFT = """
import importlib, importlib.abc, importlib.machinery, importlib.metadata, json, sys
wheel = str(importlib.metadata.distribution("torchft").locate_file("torchft"))

class NoWheel(importlib.abc.MetaPathFinder):
    # As if torchft were not installed: whatever would be found in its folder is refused.
    def find_spec(self, name, path, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        places = [] if spec is None else [spec.origin or "", *(spec.submodule_search_locations or [])]
        if any(str(p).startswith(wheel) for p in places):
            raise ImportError(f"{name}: torchft's wheel is off limits")
        return None

sys.meta_path.insert(0, NoWheel())

def has(module, dotted):
    value = importlib.import_module(module)
    for part in dotted.split("."):
        if not hasattr(value, part):
            return False
        value = getattr(value, part)
    return True

wanted = json.loads(sys.argv[1])
missing = [f"{m}.{n}" for m, names in wanted.items() for n in names if not has(m, n)]
files = sorted({getattr(m, "__file__", None) or "" for n, m in sys.modules.items() if n.startswith("torchft")})
print(json.dumps({"missing": missing, "from_wheel": [f for f in files if f.startswith(wheel)]}))
"""

TORCHFT_SURFACE = {
    "torchft": ["Manager", "DistributedDataParallel", "DistributedSampler", "Optimizer", "ProcessGroupGloo"],
    "torchft.manager": ["Manager.wrap_future", "Manager.set_state_dict_fns", "Manager.state_dict", "WorldSizeMode"],
    "torchft.futures": ["future_timeout", "future_wait", "stream_timeout", "context_timeout", "WATCHDOG_TIMEOUT_SEC"],
    "torchft.work": ["_DummyWork"],
    "torchft.utils": ["get_stream_context", "record_event", "synchronize"],
    "torchft.multiprocessing": ["_MonitoredPipe"],
    "torchft.torchcomms": ["ProcessGroupTorchComms"],
    "torchft.process_group": [
        "ErrorSwallowingProcessGroupWrapper",
        "FakeProcessGroupWrapper",
        "ManagedProcessGroup",
        "ProcessGroupBabyNCCL",
    ],
    "torchft.ddp": ["DistributedDataParallel", "PureDistributedDataParallel"],
    "torchft.optim": ["OptimizerWrapper.add_param_group", "OptimizerWrapper.state", "OptimizerWrapper.param_groups"],
    "torchft.local_sgd": ["LocalSGD", "DiLoCo"],
    "torchft.data": ["DistributedSampler"],
    "torchft.checkpointing": ["CheckpointTransport.send_checkpoint", "HTTPTransport", "PGTransport"],
    "torchft.checkpointing.pg_transport": ["PGTransport.recv_checkpoint"],
    "torchft.checkpointing.http_transport": ["HTTPTransport.recv_checkpoint"],
    "torchft.coordination": ["LighthouseServer", "ManagerClient", "Quorum"],
    "torchft._torchft": ["LighthouseServer"],
}
"""torchft-nightly's public API, the part the shim serves, as ``module: [name or Class.attribute]``."""


@pytest.mark.timeout(120)
def test_torchfts_modules_import_with_its_wheel_out_of_reach() -> None:
    """``import torchft.<module>`` for every module of the surface above, with the alias folder
    first on the path and torchft's own folder refused: all resolve to the shim, none is missing."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=f"{TORCHFT_ALIAS_DIR}{os.pathsep}{REPO_ROOT}")
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCHFT, json.dumps(TORCHFT_SURFACE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"missing": [], "from_wheel": []}
