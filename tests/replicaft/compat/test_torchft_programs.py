"""torchft's own example programs run unchanged under ``replicaft-launch --torchft`` (issue 21).

``train_ddp.py`` and ``train_diloco.py`` come from torchft 0.2.0's sdist, fetched and checked
against its pinned sha256 by ``benchmarks/torchft_examples.py`` (no copy is kept in this
repository); without network the tests skip, naming the URL. ``train_ddp.py``'s CIFAR-10
download is replaced by the offline stand-in ``benchmarks/torchft_offline/torchvision``. Each
program runs as torchft ships it, 1 GB of ``useless`` embedding included, with loops that stop
only at step 10,000 (train_ddp.py) or 15 syncs (train_diloco.py, ~15 minutes here), so the
tests stop the launcher themselves. train_diloco.py's test takes ~5 minutes and runs only when
asked for (``RUN_TORCHFT_DILOCO=1``, with tensorboard installed).

First the pure parts (the launcher's flag, the fetch's checks), then the real runs, then the
shim's parts these programs needed.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import signal
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import PYTHON, REPO_ROOT, ManagedProcess, spawn, start_lighthouse, stop_gracefully
from support.training_events import assert_digests_agree, kill_and_wait_for_heal, read_events, wait_for_event

from benchmarks.torchft_examples import (
    OFFLINE_DATA_DIR,
    PROGRAMS,
    SDIST_URL,
    ProgramUnavailable,
    check_sha256,
    extract_programs,
    program_path,
)
from replicaft.compat import TORCHFT_ALIAS_DIR
from replicaft.compat.torchft.aliasing import ALIASED, resolve_aliased, strip_aliased, tensor_keys
from replicaft.launch import Launcher, parse_args
from replicaft.launch.console import Console
from replicaft.launch.groups import Group

# -- the launcher's --torchft ------------------------------------------------------------------


def _launcher(tmp_path: Path, *flags: str) -> Launcher:
    script = tmp_path / "train.py"
    script.write_text("")
    options = parse_args(
        ["--lighthouse", "127.0.0.1:29510", "--events-dir", str(tmp_path), "--groups", "3", *flags, str(script)]
    )
    return Launcher(options, Console(io.StringIO(), io.StringIO(), live=False))


def test_torchft_flag_gives_each_group_torchfts_variables_and_the_alias_folder_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", "/mine")
    launcher = _launcher(tmp_path, "--torchft", "--replica-prefix", "train_ddp_")
    variables = launcher.group_variables(Group("train_ddp_2"))
    assert (variables["REPLICA_GROUP_ID"], variables["NUM_REPLICA_GROUPS"]) == ("2", "3")
    assert variables["REPLICAFT_REPLICA_ID"] == "train_ddp_2"
    assert launcher._base_env()["PYTHONPATH"] == f"{TORCHFT_ALIAS_DIR}{os.pathsep}/mine"


def test_without_torchft_flag_the_groups_get_neither(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/mine")
    launcher = _launcher(tmp_path)
    assert not {"REPLICA_GROUP_ID", "NUM_REPLICA_GROUPS"} & set(launcher.group_variables(Group("g0")))
    assert launcher._base_env()["PYTHONPATH"] == "/mine"


@pytest.mark.parametrize(("caller", "expected"), [(None, "0"), ("1", "1")])
def test_launched_groups_run_without_grpc_fork_handlers_unless_the_caller_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caller: str | None, expected: str
) -> None:
    if caller is None:
        monkeypatch.delenv("GRPC_ENABLE_FORK_SUPPORT", raising=False)
    else:
        monkeypatch.setenv("GRPC_ENABLE_FORK_SUPPORT", caller)
    assert _launcher(tmp_path)._base_env()["GRPC_ENABLE_FORK_SUPPORT"] == expected


# -- fetching the programs ---------------------------------------------------------------------


def _sdist(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_a_download_other_than_the_pinned_sdist_is_refused() -> None:
    with pytest.raises(ValueError, match="not the torchft 0.2.0 release; refusing to run it"):
        check_sha256(b"something else", "0" * 64, SDIST_URL)


def test_only_the_two_programs_leave_the_archive(tmp_path: Path) -> None:
    sdist = _sdist(
        {f"torchft-0.2.0/{name}": name.encode() for name in PROGRAMS}
        | {"torchft-0.2.0/setup.py": b"x", "../escape.py": b"x"}
    )
    extract_programs(sdist, tmp_path / "cache")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(PROGRAMS)
    assert (tmp_path / "cache" / "train_ddp.py").read_bytes() == b"train_ddp.py"


# -- the real run ------------------------------------------------------------------------------


DILOCO_OPT_IN = "RUN_TORCHFT_DILOCO"
"""train_diloco.py's test runs only when this is 1: it takes ~5 minutes here, past what the
regular suite spends on one test."""


def _program(name: str) -> Path:
    try:
        return program_path(name)
    except ProgramUnavailable as e:
        pytest.skip(f"torchft's {name} is fetched from its sdist, {SDIST_URL}, which cannot be reached: {e}")


def _committed(replica_id: str, min_step: int, after_ts: float = 0.0) -> Callable[[dict[str, Any]], bool]:
    return lambda e: (
        e["event"] == "committed" and e["replica_id"] == replica_id and e["step"] >= min_step and e["ts"] > after_ts
    )


STEP_TIMEOUT_S = 150.0
"""One step of train_ddp.py on two CPU cores: ~5-14 s (AdamW over 250M parameters, the 1 GB
all-reduce, the digest of 3 GB of state); the first, with a start, ~35 s. One step (an outer
sync) of train_diloco.py: ~55 s, 20 inner steps of AdamW over 262M parameters. Room for a
loaded CI."""
LIGHTHOUSE_FLAGS = ("--progress-timeout", "120")
"""The job's lighthouse: the default liveness limits, but for the progress deadline, since a
step takes ~14 s here (train_diloco.py's ~55 s), past the 10 s default, which would fence
the groups at every step. When the restarted group still healed 6 GB (before aliasing.py),
it stalled 0.40 s loading it, past its 0.39 s adaptive silence limit, and was fenced as hung
mid-heal on each of its 10 restarts; with 3 GB it has not (the healer's limit is still the
adaptive one: a known gap)."""


def _run_killed_and_restarted(tmp_path: Path, program: str, *, max_heal_bytes: float) -> None:
    """Run torchft's ``program`` unchanged in two groups under ``replicaft-launch --torchft``,
    in ``tmp_path`` (train_diloco.py writes ``output/`` where it runs); SIGKILL the second
    group once both committed step 2, and check that it is restarted, heals (at most
    ``max_heal_bytes``) and commits again, and that the groups' digests agree at every step."""
    script = _program(program)
    prefix = program.removesuffix(".py") + "_"
    events = tmp_path / "events"
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    env["REPLICAFT_TOKEN"] = secrets.token_urlsafe(32)
    lighthouse = start_lighthouse(*LIGHTHOUSE_FLAGS, status=False, env=env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(OFFLINE_DATA_DIR), str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    # No standby: one would hold a reserve the size of a group's state beside the two groups.
    launcher = spawn(
        ["env", "-C", str(tmp_path), PYTHON, "-m", "replicaft.launch", "--torchft", "--lighthouse",
         lighthouse.grpc_address, "--groups", "2", "--replica-prefix", prefix, "--restart-delay", "0",
         "--standbys", "0", "--stop-grace", "5", "--events-dir", str(events), str(script)],
        name="launcher", env=env,
    )  # fmt: skip
    try:
        _kill_heal_and_compare(launcher, events, prefix, max_heal_bytes)
    finally:
        # conftest's cleanup SIGKILLs the launcher, which would leave its groups (~5 GB each) running.
        if launcher.popen.poll() is None:
            with contextlib.suppress(AssertionError):
                stop_gracefully(launcher, 60)


def _kill_heal_and_compare(launcher: ManagedProcess, events: Path, prefix: str, max_heal_bytes: float) -> None:
    survivor, victim = f"{prefix}0", f"{prefix}1"
    for rid in (survivor, victim):
        wait_for_event(events, _committed(rid, 2), STEP_TIMEOUT_S * 3, f"{rid} committed step 2", launcher)
    (start,) = [e for e in read_events(events) if e["event"] == "start" and e["replica_id"] == victim]
    heal, killed_at = kill_and_wait_for_heal(events, start["pid"], victim, STEP_TIMEOUT_S * 3, launcher)
    assert heal["ok"], heal
    assert heal["num_bytes"] < max_heal_bytes, f"the heal moved {heal['num_bytes']} bytes: {heal}"
    # A step trained by both groups after the heal: its digests are compared below.
    after = wait_for_event(
        events,
        _committed(victim, heal["step"] + 1, killed_at),
        STEP_TIMEOUT_S * 2,
        f"{victim} committed a step after its heal",
        launcher,
    )
    wait_for_event(
        events,
        _committed(survivor, after["step"]),
        STEP_TIMEOUT_S,
        f"{survivor} committed step {after['step']}",
        launcher,
    )
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait_exit(60) == 128 + signal.SIGTERM, launcher.output_tail()

    num_steps = assert_digests_agree(events, min_steps=after["step"])
    log = [line.text for line in launcher.lines("stderr")]
    assert f"[launcher] {victim} killed by SIGKILL; restart 1 of 10 in 0s" in log, log
    digests = {(e["replica_id"], e["step"]) for e in read_events(events) if e["event"] == "committed"}
    both = sorted(s for rid, s in digests if rid == victim and (survivor, s) in digests)
    assert after["step"] in both and both[0] < heal["step"], f"steps both groups committed: {both}"
    print(
        f"{num_steps} committed steps, every one with equal digests; {victim} killed and healed at step "
        f"{heal['step']} in {heal['seconds']:.1f}s ({heal['num_bytes'] / 1e9:.1f} GB)",
        file=sys.stderr,
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_torchft_train_ddp_runs_unchanged_through_a_sigkilled_group_with_equal_parameters_every_step(
    tmp_path: Path,
) -> None:
    _run_killed_and_restarted(tmp_path, "train_ddp.py", max_heal_bytes=3.5e9)  # its state: 3.0 GB


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(
    os.environ.get(DILOCO_OPT_IN) != "1",
    reason=f"~5 minutes on 2 cores (an outer sync is ~55 s); set {DILOCO_OPT_IN}=1 to run it",
)
def test_torchft_train_diloco_runs_unchanged_through_a_sigkilled_group_with_equal_state_every_sync(
    tmp_path: Path,
) -> None:
    pytest.importorskip(
        "tensorboard", reason="train_diloco.py writes through torch.utils.tensorboard; pip install tensorboard"
    )
    _run_killed_and_restarted(tmp_path, "train_diloco.py", max_heal_bytes=2.5e9)  # outer state: 2.1 GB


# -- the shim under the launcher ---------------------------------------------------------------


class _RecordingManager:
    """Stands in for replicaft's Manager: keeps the options the shim built and starts nothing."""

    built: list[Any] = []

    def __init__(self, options: Any, **_: Any) -> None:
        self.options = options
        _RecordingManager.built.append(options)

    def register_hooks(self, hooks: Any) -> None: ...

    def register_state(self, *args: Any, **kwargs: Any) -> None: ...

    def start(self) -> None: ...


def test_a_script_naming_no_replica_id_takes_the_launchers_not_torchfts_group_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Under --torchft a group has both: REPLICA_GROUP_ID (0, 1, ...) for torchft's examples to
    # read, and the launcher's replica id, which its restarts, status line and events go by.
    import replicaft
    from replicaft.compat import torchft

    monkeypatch.setattr(replicaft, "Manager", _RecordingManager)
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "127.0.0.1:29510")
    monkeypatch.setenv("REPLICAFT_REPLICA_ID", "g1")
    monkeypatch.setenv("REPLICA_GROUP_ID", "1")
    torchft.Manager(pg=torchft.ProcessGroupGloo(), load_state_dict=None, state_dict=None, min_replica_size=1)
    torchft.Manager(
        pg=torchft.ProcessGroupGloo(),
        load_state_dict=None,
        state_dict=None,
        min_replica_size=1,
        replica_id="train_ddp_1",
    )
    assert [o.replica_id for o in _RecordingManager.built[-2:]] == ["g1", "train_ddp_1"]


def _trained() -> tuple[torch.nn.Linear, torch.optim.AdamW]:
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_the_scripts_state_is_served_without_the_tensors_ddp_and_the_optimizer_register() -> None:
    # train_ddp.py's state_dict is {"model": ..., "optim": ...}: before, a heal moved and every
    # step hashed each of those tensors twice (6.0 GB where the program holds 3.0 GB).
    model, optimizer = _trained()
    extra = torch.ones(2)
    state = {"model": model.state_dict(), "optim": optimizer.state_dict(), "epoch": 3, "extra": extra}
    served = strip_aliased(state, tensor_keys([model.state_dict(), optimizer.state_dict()]))
    assert served["model"] == {"weight": ALIASED, "bias": ALIASED}
    assert all(v == ALIASED for moments in served["optim"]["state"].values() for v in moments.values())
    assert served["optim"]["param_groups"] == optimizer.state_dict()["param_groups"]
    assert served["epoch"] == 3 and served["extra"] is extra, "what nothing else registers is served as it is"


def test_a_healer_resolves_the_markers_to_its_own_tensors_and_drops_those_it_lacks() -> None:
    donor_model, donor_optimizer = _trained()
    state = {"model": donor_model.state_dict(), "optim": donor_optimizer.state_dict()}
    served = strip_aliased(state, tensor_keys(state.values()))
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())  # fresh: no moments yet
    own = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    loaded = resolve_aliased(served, own)
    assert loaded["model"]["weight"] is own["model"]["weight"]
    assert loaded["optim"]["state"] == {0: {}, 1: {}}
    model.load_state_dict(loaded["model"])
    optimizer.load_state_dict(loaded["optim"])  # the registered optimizer state brings the moments
