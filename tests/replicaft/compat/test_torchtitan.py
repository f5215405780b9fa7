"""torchtitan 0.3.0's torchft experiment runs on replicaft (issue 43): its stock
``llama3_torchft_debugmodel`` with ``--checkpoint.enable``, two groups under
``replicaft-launch --torchft``, one SIGKILLed mid-run, restarted and healed from the other,
the loss going on from where training was, and the replicated state's digests equal across
the groups at every committed sync.

torchtitan needs a torch with ``torch.distributed.set_timeout`` (2.14; this project's venv has
2.13), so it runs from its own venv: ``make venv-torchtitan`` builds ``.venv-torchtitan``
(torch 2.14.1, torchtitan 0.3.0, replicaft editable), or ``REPLICAFT_TORCHTITAN_PYTHON``
names another interpreter that has them; without either the tests skip, saying so. torchtitan
0.3.0 has no CPU path, so it runs through tests/support/torchtitan_cpu/ (its docstrings, and
the README's "Coming from torchft", say exactly what that changes). The overrides below only
shrink the work to what two shared cores do in a minute: a 128-token sequence, a batch of 2,
a sync every 4 steps, and a step count the test never reaches (it stops the launcher).
It runs in DiLoCo, LocalSGD and per-step mode (HSDP through ``ManagedProcessGroup``); per-step
mode needs the inner optimizers' live learning rate healed (replicaft/compat/torchft/optim.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from conftest import REPO_ROOT, ManagedProcess, spawn, start_lighthouse, stop_gracefully
from support.training_events import assert_digests_agree, kill_and_wait_for_heal, read_events, wait_for_event

from replicaft.compat.torchft.aliasing import ALIASED, resolve_aliased, restore_dtensors, strip_aliased, tensor_keys

PYTHON_ENV = "REPLICAFT_TORCHTITAN_PYTHON"
VENV_PYTHON = REPO_ROOT / ".venv-torchtitan" / "bin" / "python"
WRAPPER = REPO_ROOT / "tests" / "support" / "torchtitan_cpu" / "train.py"
PREFIX = "torchtitan_ft_"
"""torchtitan names its manager's replica ``torchtitan_ft_<replica_id>``; the launcher's ids match."""
TORCHTITAN_ARGS = (
    "--module", "torchft.llama3", "--config", "llama3_torchft_debugmodel", "--checkpoint.enable",
    "--training.steps", "100000", "--training.seq_len", "128", "--training.local_batch_size", "2",
    "--fault_tolerance.sync_steps", "4", "--metrics.disable_color_printing",
)  # fmt: skip
SYNC_TIMEOUT_S = 120.0
"""A start (imports, the model on the meta device, the first sync) takes ~25 s on two cores,
a sync of 4 steps ~5 s; room for a loaded CI."""
LOSS_LINE = re.compile(r"^\[(?P<rid>\w+)/0\] .* step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>[\d.]+)")


def _torchtitan_python() -> str:
    given = os.environ.get(PYTHON_ENV)
    python = Path(given) if given else VENV_PYTHON
    if not python.is_file():
        pytest.skip(
            f"torchtitan 0.3.0 needs torch 2.14 (torch.distributed.set_timeout) in its own venv: "
            f"`make venv-torchtitan` builds {VENV_PYTHON}, or set {PYTHON_ENV} to a python with "
            f"torch 2.14, torchtitan 0.3.0 and replicaft; {python} does not exist"
        )
    return str(python)


def _committed(replica_id: str, min_step: int, after_ts: float = 0.0) -> Callable[[dict[str, Any]], bool]:
    return lambda e: (
        e["event"] == "committed" and e["replica_id"] == replica_id and e["step"] >= min_step and e["ts"] > after_ts
    )


def _losses(launcher: ManagedProcess, replica_id: str, after: int = 0) -> list[tuple[int, float]]:
    """``(stdout line index, loss)`` of each step ``replica_id`` logged from line ``after`` on."""
    found = []
    for line in launcher.lines("stdout")[after:]:
        match = LOSS_LINE.match(line.text)
        if match and match["rid"] == replica_id:
            found.append((line.index, float(match["loss"])))
    return found


def _start(tmp_path: Path, method: str) -> tuple[ManagedProcess, Path]:
    events = tmp_path / "events"
    env = dict(os.environ)
    env["REPLICAFT_TOKEN"] = secrets.token_urlsafe(32)
    lighthouse = start_lighthouse(status=False, env=env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    launcher = spawn(
        ["env", "-C", str(tmp_path), _torchtitan_python(), "-m", "replicaft.launch", "--torchft",
         "--lighthouse", lighthouse.grpc_address, "--groups", "2", "--replica-prefix", PREFIX,
         "--restart-delay", "0", "--standbys", "0", "--stop-grace", "5", "--events-dir", str(events),
         str(WRAPPER), *TORCHTITAN_ARGS, "--fault_tolerance.semi_sync_method", method],
        name="launcher", env=env,
    )  # fmt: skip
    return launcher, events


def _kill_heal_and_compare(launcher: ManagedProcess, events: Path) -> str:
    survivor, victim = f"{PREFIX}0", f"{PREFIX}1"
    for rid in (survivor, victim):
        wait_for_event(events, _committed(rid, 3), SYNC_TIMEOUT_S * 2, f"{rid} committed step 3", launcher)
    (start,) = [e for e in read_events(events) if e["event"] == "start" and e["replica_id"] == victim]
    before_kill = _losses(launcher, victim)
    mark = launcher.mark("stdout")
    heal, killed_at = kill_and_wait_for_heal(events, start["pid"], victim, SYNC_TIMEOUT_S * 2, launcher)
    assert heal["ok"], heal
    after = wait_for_event(
        events, _committed(victim, heal["step"] + 2, killed_at), SYNC_TIMEOUT_S, f"{victim} synced twice", launcher
    )
    wait_for_event(
        events, _committed(survivor, after["step"]), SYNC_TIMEOUT_S, f"{survivor} committed {after['step']}", launcher
    )
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait_exit(60) == 128 + signal.SIGTERM, launcher.output_tail()

    num_steps = assert_digests_agree(events, min_steps=after["step"])
    log = [line.text for line in launcher.lines("stderr")]
    assert f"[launcher] {victim} killed by SIGKILL; restart 1 of 10 in 0s" in log, log
    committed = {(e["replica_id"], e["step"]) for e in read_events(events) if e["event"] == "committed"}
    both = sorted(s for rid, s in committed if rid == victim and (survivor, s) in committed)
    assert after["step"] in both and both[0] < heal["step"], f"syncs both groups committed: {both}"
    # The loss goes on: a few steps after its restart (the first ones run on the weights it
    # started with, before the heal at its first sync), the restarted group's loss is nearer
    # the survivor's at that time than its own first loss of the fresh model.
    restarted = _losses(launcher, victim, after=mark)
    survivor_before = [loss for index, loss in _losses(launcher, survivor, after=mark) if index < restarted[0][0]]
    assert before_kill and restarted and survivor_before, (before_kill, restarted, survivor_before)
    first_loss, survivor_loss = before_kill[0][1], survivor_before[-1]
    resumed = min(loss for _, loss in restarted[:6])
    assert resumed < (first_loss + survivor_loss) / 2, (before_kill, restarted, survivor_before)
    return (
        f"{num_steps} committed syncs, every one with equal digests; {victim} killed and healed at sync "
        f"{heal['step']} in {heal['seconds']:.2f}s ({heal['num_bytes'] / 1e6:.1f} MB); its loss {first_loss:.3f} "
        f"at its first step, {resumed:.3f} after the heal, where the survivor's was {survivor_loss:.3f}"
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "method",
    [
        "diloco",
        "local_sgd",
        pytest.param("None", id="per_step"),  # HSDP, ManagedProcessGroup as the dp_replicate dimension
    ],
)
def test_torchtitan_torchft_debugmodel_heals_a_sigkilled_group_with_equal_state_every_sync(
    tmp_path: Path, method: str
) -> None:
    launcher, events = _start(tmp_path, method)
    try:
        print(f"{method}: {_kill_heal_and_compare(launcher, events)}", file=sys.stderr)
    finally:
        # conftest's cleanup SIGKILLs the launcher, which would leave its groups running.
        if launcher.popen.poll() is None:
            with contextlib.suppress(AssertionError):
                stop_gracefully(launcher, 60)


# -- the shim's DTensor handling torchtitan needs (FSDP2 even on one rank) -------------------


@pytest.fixture
def one_rank_mesh() -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        if started:
            dist.destroy_process_group()


def test_dtensors_are_aliased_by_their_local_shard_and_healed_ones_become_dtensors_again(one_rank_mesh: Any) -> None:
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    weight = distribute_tensor(torch.arange(4.0).reshape(2, 2), one_rank_mesh, [Shard(0)])
    moment = distribute_tensor(torch.ones(2, 2), one_rank_mesh, [Shard(0)])
    own = {"model": {"w": weight}, "optim": {"m": moment}, "step": torch.tensor(3.0)}
    # a DTensor has no storage of its own: before, its identity raised ("invalid python storage")
    served = strip_aliased(own, tensor_keys([{"m": moment}]))
    assert served["optim"] == {"m": ALIASED} and served["model"]["w"] is weight
    healed = {"model": {"w": torch.full((2, 2), 7.0)}, "optim": {"m": ALIASED}, "step": torch.tensor(4.0)}
    loaded = resolve_aliased(healed, own)
    assert isinstance(loaded["model"]["w"], DTensor) and loaded["model"]["w"].placements == weight.placements
    assert torch.equal(loaded["model"]["w"].to_local(), torch.full((2, 2), 7.0))
    assert loaded["optim"]["m"] is moment and not isinstance(loaded["step"], DTensor)
    assert restore_dtensors([torch.zeros(2, 2)], [weight])[0].device_mesh == one_rank_mesh
