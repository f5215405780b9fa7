"""Chaos scenarios as data: which job to run and which faults to inject when.

A scenario is a frozen :class:`Scenario` loaded from a TOML file (``chaos/scenarios/*.toml``
ship with the package), the way torchtitan declares its integration runs: reading the file
tells you the whole experiment, and the runner has no per-scenario code.

Each fault fires at an *observable* moment, never after a blind sleep:

* ``at_step = N`` — once the job has committed step N (read from the event logs; the highest
  step ever committed, so after a resume from disk it does not count the redone steps again);
* ``at_s = T`` — T seconds after training starts, which is defined as the first committed
  step of the job, so the minutes spent importing torch on a loaded machine do not shift it.

and only when its target can take it: a fault aimed at one group waits while that group is
down, stopped or not yet committing, and while it is the last healthy group (taking down
every group is ``kill_all_groups``, a different experiment).

Fault kinds (``kind``), what the harness does, and the outcome it then checks:

=======================  ==================================================================
``sigkill``              SIGKILL every process of group ``target``; the supervisor restarts
                         it ``restart_delay_s`` later; it heals from peers and rejoins.
``sigkill_rank``         SIGKILL rank ``rank`` of a W > 1 group (the pid of its ``start``
                         event); torchrun takes the rest of the group down; it restarts.
``sigstop``              SIGSTOP the group for ``duration_s`` (a hang), then SIGCONT: the
                         lighthouse drops it, the others continue, it heals and rejoins.
``sigterm``              SIGTERM (preemption notice): the group leaves at the next step
                         boundary with status 143 (the writer group saves first); restarted.
``preemption_notice``    Write group ``target``'s preemption-notice file (every group watches
                         ``<out>/notices/<group>`` when a scenario has this kind): it leaves at
                         the next step boundary with status 143 and no signal (the writer group
                         saves first); the file is removed before it is restarted.
``kill_donor_mid_heal``  SIGKILL group ``healer`` at ``at_step``; group ``target`` is armed
                         with the ``serve`` fault point at every later step, so it kills
                         itself right after publishing the snapshot of the first heal it
                         serves, i.e. in the middle of ``healer``'s heal. The heal must finish
                         from the other donor. Needs 3 groups and W = 1.
``kill_lighthouse``      SIGKILL the lighthouse; restarted on the same address.
``kill_all_groups``      SIGKILL every group at once; all restart and resume from the newest
                         valid checkpoint (needs ``checkpoint_interval_steps``): work lost is
                         at most one interval plus ``resume_slack_steps``.
``corrupt_checkpoint``   ``kill_all_groups``, and while every group is down, flip a byte in
                         the first chunk pack of the newest published checkpoint: the
                         resume must skip it and load an older one. Waits for two published
                         checkpoints (one to corrupt, one to fall back to).
``cold_start``           Checkpoints are also uploaded to an S3-API store the harness starts
                         (chaos/s3_server.py). SIGKILL every group and delete the checkpoint
                         directory (new machines, empty disks): all restart, fetch the newest
                         checkpoint from the object store and resume from it. Waits for one
                         checkpoint in the store.
``cold_start_corrupt``   ``cold_start``, and while every group is down, flip a byte of the
                         newest checkpoint *in the object store* (its newest increment): the
                         resume must skip it and load an older one, never a mix.
``fill_disk``            Fill the checkpoint directory's file system (a tmpfs the harness
                         mounts there) for ``duration_s``: saves are refused or fail with a
                         clear reason, training continues; then the space is freed.
``partition``            Cut group ``target``'s network link for ``duration_s`` (every
                         process lives in its own network namespace on a bridge): the others
                         continue once the lighthouse drops it; after the link is back it
                         rejoins and heals.
``slow_link``            Shape group ``target``'s link for ``duration_s``: ``rate_mbit``
                         (tc tbf) and/or ``delay_ms`` (tc netem); training continues.
``fault_point``          The group kills itself at ``point`` of step ``at_step`` of its own
                         loop (``replicaft/process/faults.py``); armed when the target first starts,
                         so it takes ``at_step`` only. W = 1 only.
``kill_lighthouse_leader``  (``lighthouse_replicas = 3``, chaos/lighthouse_set.py) SIGKILL
                         the leading lighthouse; a follower leads; it restarts as a follower.
``partition_lighthouse_leader``  Cut the leader off etcd for ``duration_s`` while it runs: it
                         stops serving on its lease clock, before another lighthouse leads.
``kill_etcd_member``     SIGKILL one etcd member for ``duration_s``: etcd keeps its quorum.
``lose_etcd_quorum``     SIGKILL two of the three etcd members for ``duration_s``: no quorum
                         forms, training waits, and resumes once etcd is back.
=======================  ==================================================================

``partition`` and ``slow_link`` put every process of the run (lighthouse and groups) in
network namespaces, which needs root and ``ip``; where they cannot be created, the run uses
loopback and those faults are reported in ``faults_skipped`` with the reason, never faked.

Validation has two layers, and every error is a :class:`ScenarioError` naming the file, the
field, the value and the fix. First each field's TOML type and range, derived from the
dataclasses' annotations (:func:`check_field_types`: whole numbers where counts are meant,
finite non-negative numbers, nothing huge), so that no rule ever compares a string or a
NaN; then the rules between fields, in ``__post_init__``. A file that is not UTF-8 or not
TOML, or whose ``faults`` is not an array of tables, is refused the same way, never with a
traceback (bug 6).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from chaos.random_faults import random_faults_from_dict
from lighthouse.errors import shown

FaultKind = Literal[
    "sigkill",
    "sigkill_rank",
    "sigstop",
    "sigterm",
    "kill_donor_mid_heal",
    "kill_lighthouse",
    "kill_all_groups",
    "corrupt_checkpoint",
    "fill_disk",
    "partition",
    "slow_link",
    "fault_point",
    "kill_lighthouse_leader",
    "partition_lighthouse_leader",
    "kill_etcd_member",
    "lose_etcd_quorum",
    "cold_start",
    "cold_start_corrupt",
    "preemption_notice",
]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
FAULT_POINTS = ("allreduce", "heal", "serve", "commit")
"""Mirrors ``replicaft.process.faults.POINTS``; kept here so loading a scenario does not import torch."""

REPLICATED_LIGHTHOUSE_KINDS = frozenset(
    {"kill_lighthouse_leader", "partition_lighthouse_leader", "kill_etcd_member", "lose_etcd_quorum"}
)
"""Kinds of the replicated lighthouse (``lighthouse_replicas = 3``; chaos/lighthouse_set.py)."""
OBJECT_STORE_KINDS = frozenset({"cold_start", "cold_start_corrupt"})
"""Kinds that need the object-store checkpoint tier (the harness starts an S3 server)."""
CORRUPTING_KINDS = frozenset({"corrupt_checkpoint", "cold_start_corrupt"})
"""Kinds that damage the newest checkpoint: the resume must fall back past it."""
JOB_WIDE_KINDS = (
    frozenset({"kill_lighthouse", "kill_all_groups", "corrupt_checkpoint", "fill_disk"})
    | REPLICATED_LIGHTHOUSE_KINDS
    | OBJECT_STORE_KINDS
)
"""Kinds that hit the job rather than one group: they take no ``target``."""
ALL_GROUPS_KINDS = frozenset({"kill_all_groups", "corrupt_checkpoint"}) | OBJECT_STORE_KINDS
"""Kinds after which every group resumes from disk (a sanctioned rollback to a checkpoint)."""
CHECKPOINT_KINDS = frozenset({"kill_all_groups", "corrupt_checkpoint", "fill_disk"}) | OBJECT_STORE_KINDS
NETWORK_KINDS = frozenset({"partition", "slow_link"})
TIMED_KINDS = frozenset(
    {
        "sigstop",
        "partition",
        "slow_link",
        "fill_disk",
        "partition_lighthouse_leader",
        "kill_etcd_member",
        "lose_etcd_quorum",
    }
)
"""Kinds that last ``duration_s`` and are then undone."""
RESTARTING_KINDS = frozenset({"sigkill", "sigterm", "preemption_notice", "kill_donor_mid_heal"})
"""Kinds that the harness injects to have one group restart (with ``warm_standby``, in the standby)."""
SELF_ARMED_KINDS = frozenset({"fault_point", "kill_donor_mid_heal"})
"""Kinds whose death the group inflicts on itself (``REPLICAFT_FAULT_POINTS``), armed at its first start."""

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"


class ScenarioError(ValueError):
    """A scenario file is missing, unreadable or describes an impossible experiment."""


MAX_NUMBER = 10**9
"""The largest number any field takes: no run has a billion steps or waits 30 years, so a
larger one is a typo, and some would become loops or allocations of that size (issue 19)."""
MAX_PROCESSES = 256
"""The most groups, and ranks per group, one harness starts (every one is a process on this
machine); the group ids are built from ``groups``, so a huge one would exhaust memory."""
_RANGES: dict[str, tuple[int, int]] = {"groups": (1, MAX_PROCESSES), "ranks_per_group": (1, MAX_PROCESSES)}
"""Fields with a tighter range than ``0..MAX_NUMBER``; finer rules stay in ``__post_init__``."""


def toml_type(value: Any) -> str:
    """What TOML calls the type of a parsed value, for messages about a scenario file."""
    names = {
        bool: "boolean",
        int: "integer",
        float: "float",
        str: "string",
        list: "array",
        tuple: "array",
        dict: "table",
    }
    return names.get(type(value), type(value).__name__)


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_problem(name: str, value: Any, hint: Any) -> str | None:
    """What is wrong with ``value`` for a field annotated ``hint``, or None."""
    if isinstance(hint, types.UnionType):
        if value is None and type(None) in hint.__args__:
            return None
        (hint,) = [h for h in hint.__args__ if h is not type(None)]
    got = f"got {toml_type(value)} {shown(value)}"
    if hint is int or hint is float:
        lo, hi = _RANGES.get(name, (0, MAX_NUMBER))
        if hint is int and (type(value) is not int or not lo <= value <= hi):
            return f"must be a whole number from {lo} to {hi}, {got}"
        if hint is float and (type(value) not in (int, float) or not math.isfinite(value) or not lo <= value <= hi):
            return f"must be a finite number from {lo} to {hi:g}, {got}"
    elif hint is bool and type(value) is not bool:
        return f"must be a boolean (true or false), {got}"
    elif hint is str and not isinstance(value, str):
        return f"must be a string, {got}"
    elif typing.get_origin(hint) is Literal and value not in get_args(hint):
        return f"must be one of {list(get_args(hint))}, {got}"
    elif typing.get_origin(hint) is tuple:
        (item,) = {h for h in get_args(hint) if h is not Ellipsis}
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, item) for v in value):
            what = "strings" if item is str else "tables"
            return f"must be an array of {what}, {got}"
    return None


def check_field_types(cls: type, values: Mapping[str, Any], where: str) -> None:
    """Raise ScenarioError naming ``where`` and the first field of ``values`` whose type or range
    does not fit its annotation on ``cls`` (Scenario or FaultSpec): TOML's types, finite
    numbers, no fractions where whole numbers are meant, no negatives, nothing huge.

    Checked before any rule compares fields, so that a rule never meets a string where it
    expects a number (a TypeError) or a NaN that every comparison lets through."""
    hints = _field_types(cls)
    for f in dataclasses.fields(cls):
        if f.name in values:
            problem = _type_problem(f.name, values[f.name], hints[f.name])
            if problem is not None:
                raise ScenarioError(f"{where}{f.name} {problem}")


@dataclass(frozen=True, kw_only=True, slots=True)
class FaultSpec:
    kind: FaultKind
    at_s: float | None = None
    """Seconds after the job's first committed step."""
    at_step: int | None = None
    """Inject once the job has committed this step."""
    target: str | None = None
    """Replica id of the group to hit (``g0`` ... ``g{groups-1}``); none for job-wide kinds.
    For ``kill_donor_mid_heal``, the donor that dies."""
    duration_s: float = 0.0
    """``sigstop``, ``partition``, ``slow_link``, ``fill_disk``: how long until it is undone."""
    point: str | None = None
    """``fault_point`` only: where in the step the group kills itself (allreduce, heal, serve, commit)."""
    rank: int | None = None
    """``sigkill_rank`` only: the group rank to kill."""
    healer: str | None = None
    """``kill_donor_mid_heal`` only: the group SIGKILLed (and restarted) so that a heal happens."""
    rate_mbit: float | None = None
    """``slow_link``: bandwidth cap of the target's link, both directions."""
    delay_ms: float | None = None
    """``slow_link``: added one-way delay (needs the kernel's netem qdisc)."""

    def __post_init__(self) -> None:
        check_field_types(FaultSpec, {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, "fault: ")

    def describe(self) -> str:
        what = self.kind if self.point is None else f"{self.kind}:{self.point}"
        where = f" {self.target}" if self.target else ""
        if self.rank is not None:
            where += f" rank {self.rank}"
        if self.healer is not None:
            where += f" (healing {self.healer})"
        how = []
        if self.rate_mbit is not None:
            how.append(f"{self.rate_mbit:g} Mbit/s")
        if self.delay_ms is not None:
            how.append(f"+{self.delay_ms:g} ms")
        if self.duration_s:
            how.append(f"for {self.duration_s:g}s")
        when = f"step {self.at_step}" if self.at_step is not None else f"t+{self.at_s:g}s"
        return f"{what}{where}{' ' + ' '.join(how) if how else ''} at {when}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Scenario:
    name: str
    description: str = ""
    groups: int = 3
    """R: how many replica groups."""
    ranks_per_group: int = 1
    """W: ranks per group; W > 1 runs each group under torchrun."""
    steps: int = 50
    step_delay_s: float = 0.0
    """Extra seconds of work per step (``--step-delay`` of the example): paces a demo."""
    width: int = 32
    """Hidden width of the example model (``examples/train_ddp.py`` only)."""
    script: str | None = None
    """The training script each rank runs, instead of ``examples/train_ddp.py``. In a TOML file
    a relative path is relative to the file. It gets ``script_args`` and nothing else on its
    command line (so they must make it train ``steps`` steps), and ``REPLICAFT_*`` variables;
    ``width`` and ``step_delay_s`` do not apply."""
    script_args: tuple[str, ...] = ()
    """Arguments of ``script``."""
    faults: tuple[FaultSpec, ...] = ()
    lighthouse_replicas: int = 1
    """1: the single lighthouse. 3: a replicated one on a three-node etcd started on loopback
    (chaos/lighthouse_set.py), which the replicated-lighthouse fault kinds need."""
    restart_delay_s: float = 1.0
    """How long the supervisor waits before restarting a dead group or lighthouse, as an
    orchestrator would (Kubernetes' back-off, Slurm's requeue)."""
    warm_standby: bool = False
    """Keep a warm standby (``replicaft.process.standby``, as ``replicaft-launch`` does) and restart a
    group in it when one is ready, its memory reserve sized by the groups' state; a fault that
    restarts a group (sigkill, sigterm, preemption_notice, the healer of kill_donor_mid_heal)
    then waits until the standby is ready, so that it is the restart under test. W = 1 only,
    and no network faults (a standby started outside a group's network namespace cannot enter it)."""
    heartbeat_timeout_s: float = 2.0
    """Lighthouse ``--heartbeat-timeout``: how fast a SIGSTOPped or partitioned group is dropped."""
    progress_timeout_s: float = 15.0
    """Lighthouse ``--progress-timeout``."""
    collective_timeout_s: float = 10.0
    """``REPLICAFT_COLLECTIVE_TIMEOUT_S`` for every group."""
    checkpoint_interval_steps: int = 0
    """Persistent checkpoints every N committed steps into ``<out>/checkpoints`` (0 = none).
    With ``checkpoint_interval = "auto"``, the most steps one interval can span, which the
    resume check allows to be lost."""
    checkpoint_interval: Literal["fixed", "auto"] = "fixed"
    """``auto``: the groups choose their interval in seconds (``REPLICAFT_CHECKPOINT_INTERVAL=auto``,
    replicaft/checkpoint/cadence.py) between the two bounds below, and report each choice."""
    checkpoint_interval_min_s: float = 1.0
    """``auto``: the groups' ``checkpoint_interval_min_s``."""
    checkpoint_interval_max_s: float = 3.0
    """``auto``: the groups' ``checkpoint_interval_max_s``; at most ``checkpoint_interval_steps``
    steps of ``step_delay_s`` each, so that the resume check's bound holds."""
    resume_slack_steps: int = 2
    """After every group died, the resume may lose one checkpoint interval plus this many steps
    (the save of the newest checkpoint still in flight, the step in flight)."""
    run_timeout_s: float = 120.0
    """Overall deadline: the run is stopped (and reported as hung) when it passes."""
    hang_bound_s: float = 30.0
    """Invariant 4: every fault must be followed by a committed step within this many seconds."""
    loss_tolerance: float = 0.1
    """Invariant 5: allowed relative difference of the final loss from a fault-free run."""
    loss_window: int = 100
    """Invariant 5 compares the median loss of this many last steps, not one batch's loss."""
    deterministic: bool = False
    """Run replicaft's deterministic mode (``REPLICAFT_DETERMINISTIC=1``): the example's
    ``global_batch`` is cut into ``virtual_shards``, and with ``--reference`` the run must end
    bit for bit where the fault-free run ends (invariant ``bitwise_equal_to_reference``)."""
    virtual_shards: int = 6
    """``REPLICAFT_VIRTUAL_SHARDS`` in the deterministic mode: at least ``groups``."""
    global_batch: int = 48
    """The example's ``--batch-size`` in the deterministic mode (the step's global batch), a
    multiple of ``virtual_shards``."""

    @property
    def group_ids(self) -> tuple[str, ...]:
        """Replica ids of the groups, ``g0`` ... ``g{groups-1}``."""
        return tuple(f"g{i}" for i in range(self.groups))

    @property
    def needs_network(self) -> bool:
        """Whether the run must put its processes in network namespaces (partition, slow_link)."""
        return any(f.kind in NETWORK_KINDS for f in self.faults)

    @property
    def needs_object_store(self) -> bool:
        """Whether checkpoints must be tiered to an S3 server the harness starts (cold_start)."""
        return any(f.kind in OBJECT_STORE_KINDS for f in self.faults)

    @property
    def needs_notices(self) -> bool:
        """Whether every group must watch a preemption-notice file (preemption_notice)."""
        return any(f.kind == "preemption_notice" for f in self.faults)

    @property
    def needs_disk(self) -> bool:
        """Whether the checkpoint directory must be a small tmpfs (fill_disk)."""
        return any(f.kind == "fill_disk" for f in self.faults)

    def __post_init__(self) -> None:
        check_field_types(
            Scenario, {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, f"scenario {self.name!r}: "
        )
        if not self.name:
            raise ScenarioError('scenario name is empty; set name = "..."')
        for name in ("groups", "ranks_per_group", "steps", "width", "loss_window"):
            if getattr(self, name) < 1:
                raise ScenarioError(f"scenario {self.name!r}: {name}={getattr(self, name)}; it must be at least 1")
        for name in (
            "heartbeat_timeout_s",
            "progress_timeout_s",
            "collective_timeout_s",
            "run_timeout_s",
            "hang_bound_s",
        ):
            if not getattr(self, name) > 0:
                raise ScenarioError(f"scenario {self.name!r}: {name}={getattr(self, name)}; it must be positive")
        if self.progress_timeout_s <= self.heartbeat_timeout_s:
            raise ScenarioError(
                f"scenario {self.name!r}: progress_timeout_s={self.progress_timeout_s} is not above "
                f"heartbeat_timeout_s={self.heartbeat_timeout_s} (the lighthouse requires it); raise progress_timeout_s"
            )
        if self.script is not None and not Path(self.script).is_file():
            raise ScenarioError(f"scenario {self.name!r}: script={self.script!r} is not a file")
        if self.script_args and self.script is None:
            raise ScenarioError(f"scenario {self.name!r}: script_args without script; name the script they are for")
        if self.checkpoint_interval_steps and self.ranks_per_group > 1 and self.script is None:
            raise ScenarioError(
                f"scenario {self.name!r}: checkpoint_interval_steps={self.checkpoint_interval_steps} with "
                f"ranks_per_group={self.ranks_per_group}: W > 1 checkpoints need torch.distributed initialised "
                "inside the group, which examples/train_ddp.py does not do; use ranks_per_group = 1"
            )
        if self.checkpoint_interval == "auto":
            self._check_auto_interval()
        if self.deterministic and (self.virtual_shards < self.groups or self.global_batch % self.virtual_shards):
            raise ScenarioError(
                f"scenario {self.name!r}: virtual_shards={self.virtual_shards}, global_batch="
                f"{self.global_batch} with groups={self.groups}; the deterministic mode needs at least "
                "one shard per group and a global batch that the shards divide"
            )
        if self.warm_standby and (self.ranks_per_group > 1 or self.needs_network):
            raise ScenarioError(
                f"scenario {self.name!r}: warm_standby = true with ranks_per_group={self.ranks_per_group} and "
                f"{'partition/slow_link faults' if self.needs_network else 'no network faults'}: torchrun starts the "
                "ranks of a W > 1 group and network faults put each group in a namespace of its own, and a "
                "standby can be neither; use ranks_per_group = 1 without partition or slow_link, or warm_standby = "
                "false"
            )
        if self.lighthouse_replicas not in (1, 3):
            raise ScenarioError(
                f"scenario {self.name!r}: lighthouse_replicas={self.lighthouse_replicas!r}; use 1 "
                "(the single lighthouse) or 3 (replicated on etcd)"
            )
        for i, fault in enumerate(self.faults):
            self._check_fault(i, fault)
            if fault.kind in REPLICATED_LIGHTHOUSE_KINDS and self.lighthouse_replicas == 1:
                raise ScenarioError(
                    f"scenario {self.name!r}, faults[{i}] ({fault.kind}): needs a replicated "
                    "lighthouse; set lighthouse_replicas = 3"
                )

    def _check_auto_interval(self) -> None:
        where = f'scenario {self.name!r}: checkpoint_interval = "auto"'
        if not self.checkpoint_interval_steps or self.ranks_per_group > 1:
            raise ScenarioError(
                f"{where} needs checkpoint_interval_steps (the most steps one interval spans) and "
                f"ranks_per_group = 1 (got {self.checkpoint_interval_steps}, {self.ranks_per_group})"
            )
        if not 0 < self.checkpoint_interval_min_s <= self.checkpoint_interval_max_s:
            raise ScenarioError(
                f"{where}: checkpoint_interval_min_s={self.checkpoint_interval_min_s} must be positive "
                f"and at most checkpoint_interval_max_s={self.checkpoint_interval_max_s}"
            )
        if self.checkpoint_interval_max_s > self.checkpoint_interval_steps * self.step_delay_s:
            raise ScenarioError(
                f"{where}: checkpoint_interval_max_s={self.checkpoint_interval_max_s} spans more than "
                f"checkpoint_interval_steps={self.checkpoint_interval_steps} steps of step_delay_s="
                f"{self.step_delay_s}; lower it or raise checkpoint_interval_steps"
            )

    def _check_fault(self, i: int, f: FaultSpec) -> None:
        where = f"scenario {self.name!r}, faults[{i}] ({f.kind})"
        if f.kind not in FAULT_KINDS:
            raise ScenarioError(f"{where}: kind {f.kind!r} is not one of {list(FAULT_KINDS)}")
        if (f.at_s is None) == (f.at_step is None):
            raise ScenarioError(f"{where}: give exactly one of at_s (seconds after the first commit) or at_step")
        if f.at_step is not None and not 0 <= f.at_step < self.steps:
            raise ScenarioError(f"{where}: at_step={f.at_step} is outside the run's steps 0..{self.steps - 1}")
        if f.kind in JOB_WIDE_KINDS:
            if f.target is not None:
                raise ScenarioError(f"{where}: {f.kind} hits the whole job and takes no target (got {f.target!r})")
        elif f.target not in self.group_ids:
            raise ScenarioError(f"{where}: target={f.target!r}; expected one of {list(self.group_ids)}")
        if f.kind in TIMED_KINDS and not f.duration_s > 0:
            raise ScenarioError(f"{where}: duration_s={f.duration_s}; a {f.kind} needs how long it lasts")
        if f.kind not in TIMED_KINDS and f.duration_s:
            raise ScenarioError(f"{where}: duration_s applies to {sorted(TIMED_KINDS)} only")
        if f.kind in CHECKPOINT_KINDS and not self.checkpoint_interval_steps:
            raise ScenarioError(
                f"{where}: {f.kind} needs persistent checkpoints; set checkpoint_interval_steps (e.g. 10)"
            )
        if f.kind in SELF_ARMED_KINDS:
            self._check_self_armed(where, f)
        self._check_kind_fields(where, f)

    def _check_self_armed(self, where: str, f: FaultSpec) -> None:
        if f.at_step is None:
            raise ScenarioError(f"{where}: the group arms itself with a step of its own loop; use at_step")
        if self.ranks_per_group > 1:
            raise ScenarioError(
                f"{where}: needs ranks_per_group = 1 (got {self.ranks_per_group}): torchrun reports a rank's "
                "self-inflicted SIGKILL as exit code 1, which the harness cannot tell from a crash"
            )
        armed = [g for g in self.faults if g.kind in SELF_ARMED_KINDS and g.target == f.target]
        if len(armed) > 1:
            raise ScenarioError(
                f"{where}: only one fault_point or kill_donor_mid_heal per target group "
                "(the group is armed once, when it first starts)"
            )

    def _check_kind_fields(self, where: str, f: FaultSpec) -> None:
        if f.kind == "fault_point":
            if f.point not in FAULT_POINTS:
                raise ScenarioError(f"{where}: point={f.point!r}; expected one of {list(FAULT_POINTS)}")
        elif f.point is not None:
            raise ScenarioError(f"{where}: point applies to fault_point only")
        if f.kind == "sigkill_rank":
            if self.ranks_per_group < 2:
                raise ScenarioError(f"{where}: needs groups of several ranks; set ranks_per_group = 2 (or more)")
            if f.rank is None or not f.rank < self.ranks_per_group:
                raise ScenarioError(f"{where}: rank={f.rank!r}; expected a group rank in 0..{self.ranks_per_group - 1}")
        elif f.rank is not None:
            raise ScenarioError(f"{where}: rank applies to sigkill_rank only")
        if f.kind == "kill_donor_mid_heal":
            if self.groups < 3:
                raise ScenarioError(
                    f"{where}: needs 3 groups or more (the healer, the donor that dies, and a donor "
                    f"that finishes the heal); got groups={self.groups}"
                )
            if f.healer not in self.group_ids or f.healer == f.target:
                raise ScenarioError(
                    f"{where}: healer={f.healer!r}; expected a group other than the target "
                    f"{f.target!r}, one of {list(self.group_ids)}"
                )
        elif f.healer is not None:
            raise ScenarioError(f"{where}: healer applies to kill_donor_mid_heal only")
        if f.kind == "slow_link":
            if f.rate_mbit is None and f.delay_ms is None:
                raise ScenarioError(f"{where}: give rate_mbit (a bandwidth cap) and/or delay_ms (added delay)")
            for name in ("rate_mbit", "delay_ms"):
                value = getattr(f, name)
                if value is not None and not value > 0:
                    raise ScenarioError(f"{where}: {name}={value}; it must be positive")
        elif f.rate_mbit is not None or f.delay_ms is not None:
            raise ScenarioError(f"{where}: rate_mbit and delay_ms apply to slow_link only")

    def fault_points_for(self, group_id: str) -> str | None:
        """``REPLICAFT_FAULT_POINTS`` for the first start of ``group_id`` (restarts are not re-armed).

        A ``kill_donor_mid_heal`` donor is armed with ``serve`` at every step from ``at_step``
        on: it dies at the first heal it serves once the healer has been killed, whenever the
        restarted healer gets there (its restart takes seconds of torch import).
        """
        armed = []
        for f in self.faults:
            if f.target != group_id or f.at_step is None:
                continue
            if f.kind == "fault_point":
                armed.append(f"{f.point}@{f.at_step}")
            elif f.kind == "kill_donor_mid_heal":
                armed += [f"serve@{step}" for step in range(f.at_step, self.steps)]
        return ",".join(armed) or None


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: tomllib arrived in 3.11
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            raise ScenarioError(
                f"cannot read {path}: TOML support needs Python 3.11+ (tomllib) or the 'tomli' "
                "package on Python 3.10; run the chaos harness with Python 3.11 or `pip install tomli`"
            ) from None
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ScenarioError(f"cannot read scenario file {path}: {e}") from None
    except UnicodeDecodeError as e:
        raise ScenarioError(
            f"scenario file {path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset "
            f"{e.start}); TOML files are UTF-8"
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"scenario file {path} is not valid TOML: {e}") from None
    except RecursionError:
        # tomllib recurses per level of nested arrays and tables; a few hundred levels end here.
        raise ScenarioError(
            f"scenario file {path} nests arrays or tables deeper than Python can parse; a scenario needs two levels"
        ) from None


def scenario_from_dict(data: dict[str, Any], *, source: str = "<dict>", base_dir: Path | None = None) -> Scenario:
    """Build a scenario from parsed TOML; unknown keys are errors (a typo must not be ignored).

    A ``[random_faults]`` table (``chaos/random_faults.py``) is expanded into faults appended
    to the ``[[faults]]`` given by hand. A relative ``script`` is taken relative to ``base_dir``
    (the TOML file's directory) when given.
    """
    where = f"scenario {source}: "
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}a scenario is a table of fields, got {toml_type(data)}")
    data = dict(data)
    raw_faults = data.pop("faults", [])
    if not isinstance(raw_faults, list):
        raise ScenarioError(
            f"{where}faults must be an array of tables ([[faults]]), got {toml_type(raw_faults)} {shown(raw_faults)}"
        )
    raw_random = data.pop("random_faults", None)
    known = (set(Scenario.__dataclass_fields__) - {"faults"}) | {"random_faults"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ScenarioError(f"{source}: unknown keys {shown(unknown)}; known keys are {sorted(known)}")
    check_field_types(Scenario, data, where)
    if "script" in data and base_dir is not None:
        data["script"] = str((base_dir / data["script"]).resolve())
    if "script_args" in data:
        data["script_args"] = tuple(data["script_args"])
    raw_faults = list(raw_faults)
    if raw_random is not None:
        try:
            drawn = random_faults_from_dict(raw_random)
            groups = data.get("groups", Scenario.__dataclass_fields__["groups"].default)
            num_groups = groups if isinstance(groups, int) and groups > 0 else 1  # Scenario reports a bad one
            raw_faults += drawn.expand(tuple(f"g{i}" for i in range(num_groups)))
        except ValueError as e:
            raise ScenarioError(f"{source}: {e}") from None
    fault_keys = set(FaultSpec.__dataclass_fields__)
    faults = []
    for i, raw in enumerate(raw_faults):
        if not isinstance(raw, dict):
            raise ScenarioError(f"{source}: faults[{i}] is {shown(raw)}; write each fault as a [[faults]] table")
        bad = sorted(set(raw) - fault_keys)
        if bad:
            raise ScenarioError(
                f"{source}: faults[{i}] has unknown keys {shown(bad)}; known keys are {sorted(fault_keys)}"
            )
        check_field_types(FaultSpec, raw, f"{where}faults[{i}].")
        if "kind" not in raw:
            raise ScenarioError(f"{where}faults[{i}] has no kind; set kind to one of {list(FAULT_KINDS)}")
        faults.append(FaultSpec(**raw))
    try:
        return Scenario(**data, faults=tuple(faults))
    except TypeError as e:  # a required field missing (name)
        raise ScenarioError(f"{source}: {e}") from None
    except ScenarioError as e:
        raise ScenarioError(f"{source}: {e}") from None


def load_scenario(name_or_path: str) -> Scenario:
    """A shipped scenario by name (``smoke``, ``demo``) or a TOML file by path."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = SCENARIO_DIR / f"{name_or_path}.toml"
        if not path.exists():
            shipped = sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))
            raise ScenarioError(
                f"no scenario named {name_or_path!r}; shipped scenarios: {shipped}, or pass a .toml path"
            )
    try:
        return scenario_from_dict(_load_toml(path), source=str(path), base_dir=path.parent)
    except ScenarioError as e:
        if str(path) in str(e):
            raise
        raise ScenarioError(f"{path}: {e}") from None
