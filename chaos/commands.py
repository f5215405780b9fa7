"""The command lines and environments of a run's processes. Pure: the runner starts what these describe.

A group is ``examples/train_ddp.py`` (or the scenario's ``script``): one process when W = 1, or W ranks under torchrun
(``python -m torch.distributed.run --standalone``; its rendezvous stays on the namespace's
own loopback). Everything replicaft needs arrives through ``REPLICAFT_*`` variables, the way
an orchestrator would set them; the caller's own ``REPLICAFT_*`` variables never leak in
(``chaos.processes.python_env``).

In a network lab (``chaos/network.py``) each process binds its namespace address:
``REPLICAFT_HOST`` is the address the group's store and state server listen on and announce,
and ``GLOO_SOCKET_IFNAME=eth0`` makes Gloo use the veth rather than the hostname's address
(which does not exist inside the namespace, so Gloo would fall back to loopback and peers in
other namespaces could not connect).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from chaos.scenario import Scenario

REPO_ROOT = Path(__file__).resolve().parent.parent
S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "replicaft-chaos",
    "AWS_SECRET_ACCESS_KEY": "replicaft-chaos",
    "AWS_DEFAULT_REGION": "us-east-1",
}
"""What the groups sign their requests to the harness's S3 server with (it checks none)."""
EXAMPLE = REPO_ROOT / "examples" / "train_ddp.py"
NOTICE_POLL_S = 0.2
"""How often a group looks at its preemption-notice file: a notice is acted on within a step or two."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupPlacement:
    """Where one group runs and what it talks to."""

    lighthouse: str
    """``host:port`` of the lighthouse."""
    events_dir: Path
    checkpoint_dir: Path | None = None
    host: str | None = None
    """The group's own address (network lab); None = replicaft's loopback default."""
    interface: str | None = None
    """The network interface Gloo must use (network lab)."""
    fault_points: str | None = None
    object_store: str | None = None
    """``s3://bucket/prefix`` of the checkpoints' object-store tier (cold_start)."""
    object_store_endpoint: str | None = None
    preemption_notice: Path | None = None
    """The file whose existence announces this group's preemption (preemption_notice); absolute."""


def group_script(scenario: Scenario) -> list[str]:
    """The training script of every rank and its arguments (what a warm standby runs, too)."""
    s = scenario
    if s.script is not None:
        return [s.script, *s.script_args]
    script = [str(EXAMPLE), "--steps", str(s.steps), "--width", str(s.width), "--step-delay", str(s.step_delay_s)]
    if s.deterministic:
        script += ["--batch-size", str(s.global_batch)]
    return script


def group_command(scenario: Scenario) -> list[str]:
    """The command line of one group (before any ``ip netns exec`` prefix)."""
    s = scenario
    script = group_script(s)
    if s.ranks_per_group == 1:
        return [sys.executable, *script]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(s.ranks_per_group),
        *script,
    ]


def group_env(scenario: Scenario, group_id: str, placement: GroupPlacement) -> dict[str, str]:
    """The variables a group gets on top of the runner's environment."""
    p = placement
    env = {
        "REPLICAFT_LIGHTHOUSE": p.lighthouse,
        "REPLICAFT_REPLICA_ID": group_id,
        "REPLICAFT_EVENTS_DIR": str(p.events_dir),
        "REPLICAFT_COLLECTIVE_TIMEOUT_S": str(scenario.collective_timeout_s),
    }
    if p.checkpoint_dir is not None and scenario.checkpoint_interval_steps:
        env["REPLICAFT_CHECKPOINT_DIR"] = str(p.checkpoint_dir)
        if scenario.checkpoint_interval == "auto":
            env["REPLICAFT_CHECKPOINT_INTERVAL"] = "auto"
            env["REPLICAFT_CHECKPOINT_INTERVAL_MIN_S"] = str(scenario.checkpoint_interval_min_s)
            env["REPLICAFT_CHECKPOINT_INTERVAL_MAX_S"] = str(scenario.checkpoint_interval_max_s)
        else:
            env["REPLICAFT_CHECKPOINT_INTERVAL_STEPS"] = str(scenario.checkpoint_interval_steps)
    if p.object_store is not None and "REPLICAFT_CHECKPOINT_DIR" in env:
        env["REPLICAFT_CHECKPOINT_OBJECT_STORE"] = p.object_store
        env["REPLICAFT_CHECKPOINT_OBJECT_STORE_ENDPOINT"] = p.object_store_endpoint or ""
        env.update(S3_CREDENTIALS)
    if p.preemption_notice is not None:
        env["REPLICAFT_PREEMPTION_NOTICE"] = f"file:{p.preemption_notice}"
        env["REPLICAFT_PREEMPTION_POLL_S"] = str(NOTICE_POLL_S)
    if p.host is not None:
        env["REPLICAFT_HOST"] = p.host
    if p.interface is not None:
        env["GLOO_SOCKET_IFNAME"] = p.interface
    if p.fault_points:
        env["REPLICAFT_FAULT_POINTS"] = p.fault_points
    if scenario.deterministic:
        env["REPLICAFT_DETERMINISTIC"] = "1"
        env["REPLICAFT_VIRTUAL_SHARDS"] = str(scenario.virtual_shards)
    return env


def lighthouse_command(scenario: Scenario, *, host: str | None, port: int) -> list[str]:
    s = scenario
    args = [
        sys.executable,
        "-m",
        "lighthouse",
        "--port",
        str(port),
        "--heartbeat-timeout",
        str(s.heartbeat_timeout_s),
        "--progress-timeout",
        str(s.progress_timeout_s),
    ]
    if host is not None:
        args += ["--host", host]
    return args
