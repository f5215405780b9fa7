"""Injecting a scenario's faults: when each may fire, what it does, when it is undone.

The :class:`Injector` owns the faults of one run: those still pending (and what each is
waiting for), those injected (the record the checks read), and the timers that undo timed
faults (SIGCONT, link restored, disk freed). It acts on the job only through the narrow
:class:`Supervision` interface the runner implements, so what a fault *is* lives here and how
processes are started and reaped lives in the runner.

A fault fires when its condition holds (``chaos.scenario``: a committed step or seconds since
the first commit) *and* its target can take it:

* a group fault waits until the target runs, is not stopped or impaired, has committed since
  it (re)started and since its last fault was undone (a group just continued after SIGCONT
  has been dropped and must heal first), and is not the last such group: taking every group
  down is
  ``kill_all_groups``, a separate experiment with its own checks, never an accident of
  timing in a random soak;
* with ``warm_standby``, a fault that restarts its group also waits for a ready standby;
* ``kill_all_groups`` waits for a published checkpoint, ``corrupt_checkpoint`` for two (one
  to damage, one to fall back to); ``cold_start`` and ``cold_start_corrupt`` for as many in
  the object store.

What a fault needs from the machine (network namespaces, a tmpfs) is set up by the runner at
the start; a fault whose environment could not be built is skipped with that reason at once.
A fault still waiting when the job ends is skipped with what it was waiting for.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from chaos.disk import DiskUnavailable, SmallDisk, corrupt_newest_checkpoint, published_checkpoints
from chaos.environment import OBJECT_STORE_BUCKET, OBJECT_STORE_PREFIX
from chaos.job_view import JobView
from chaos.network import NetworkLab, NetworkUnavailable
from chaos.record import ALL_GROUPS, DISK, LIGHTHOUSE, InjectedFault
from chaos.s3_server import S3Server
from chaos.scenario import (
    ALL_GROUPS_KINDS,
    CORRUPTING_KINDS,
    NETWORK_KINDS,
    OBJECT_STORE_KINDS,
    REPLICATED_LIGHTHOUSE_KINDS,
    RESTARTING_KINDS,
    SELF_ARMED_KINDS,
    FaultSpec,
    Scenario,
)

logger = logging.getLogger(__name__)


class Supervision(Protocol):
    """What the injector may ask of the runner that supervises the processes."""

    job: JobView

    def is_healthy(self, group: str) -> bool:
        """Running, not stopped, committed since it started, no fault in progress on it."""
        ...

    def is_armed(self, group: str) -> bool:
        """Its current process carries the scenario's fault points (its first incarnation)."""
        ...

    def signal_group(self, group: str, sig: int, cause: str | None) -> None:
        """Send ``sig`` to every process of the group; ``cause`` explains the exit it leads to."""
        ...

    def kill_rank(self, group: str, rank: int, cause: str) -> bool:
        """SIGKILL one rank of the group's current processes; False while its pid is unknown."""
        ...

    def kill_every_group(self, cause: str) -> None:
        """SIGKILL all groups, reap them, and schedule all their restarts for the same moment."""
        ...

    def kill_lighthouse(self) -> bool:
        """SIGKILL the lighthouse; False when it is not running (being restarted)."""
        ...

    def lighthouse_fault(self, kind: str, duration_s: float) -> str | None:
        """A replicated-lighthouse fault (chaos/lighthouse_set.py); why not now, or None."""
        ...

    def standby_ready(self) -> bool:
        """A warm standby has done its imports and waits to become a restarted group."""
        ...


@dataclass(slots=True)
class _Undo:
    at: float
    """Monotonic time."""
    target: str
    action: Callable[[], None]
    what: str


def is_due(spec: FaultSpec, step: int, first_commit_ts: float | None, now: float) -> bool:
    """Whether the condition of a harness-injected fault holds (fault points fire themselves)."""
    if spec.at_step is not None:
        return step >= spec.at_step
    assert spec.at_s is not None
    return first_commit_ts is not None and now >= first_commit_ts + spec.at_s


class Injector:
    def __init__(
        self, scenario: Scenario, sup: Supervision, *, checkpoint_dir: Path | None, notices_dir: Path | None = None
    ) -> None:
        self.scenario = scenario
        self._notices_dir = notices_dir
        """Where each group's preemption-notice file lives (``preemption_notice``), or None."""
        self._sup = sup
        self._lab: NetworkLab | None = None
        self._disk: SmallDisk | None = None
        self._s3: S3Server | None = None
        self._checkpoint_dir = checkpoint_dir
        self.pending = list(range(len(scenario.faults)))
        """Indices of scenario faults not yet injected."""
        self._waiting: dict[int, str] = {}
        self._healer_killed: set[int] = set()
        """``kill_donor_mid_heal`` faults whose healer is down: the donor's death is still to come."""
        self.injected: list[InjectedFault] = []
        self._awaiting_resume: dict[str, int] = {}
        """Target -> index into ``injected`` whose ``resumed_ts`` is still unknown."""
        self._undo: list[_Undo] = []
        self.skipped: list[tuple[str, str]] = []
        self._impaired: set[str] = set()
        self._back_at: dict[str, float] = {}
        """Group -> when its last timed fault was undone: it is healthy again once it commits after that."""

    # -- the runner's calls --------------------------------------------------------------------

    def use_network(self, lab: NetworkLab) -> None:
        """The run's processes live in ``lab``: partition and slow_link act on its links."""
        self._lab = lab

    def use_disk(self, disk: SmallDisk) -> None:
        """The checkpoint directory is ``disk``, which fill_disk fills."""
        self._disk = disk

    def use_object_store(self, server: S3Server) -> None:
        """The checkpoints are tiered to ``server``, which cold_start restores from."""
        self._s3 = server

    def skip_unavailable(self, kinds: frozenset[str], reason: str) -> None:
        """Skip every fault of ``kinds`` now: its environment could not be built."""
        for i in list(self.pending):
            spec = self.scenario.faults[i]
            if spec.kind in kinds:
                self.pending.remove(i)
                self.skipped.append((spec.describe(), reason))

    def impaired(self, group: str) -> bool:
        """A network fault is in progress on ``group``."""
        return group in self._impaired

    def inject_due(self) -> None:
        now = time.time()
        for i in list(self.pending):
            spec = self.scenario.faults[i]
            if spec.kind == "fault_point" or i in self._healer_killed:
                continue  # the group fires it itself
            if not is_due(spec, self._sup.job.step, self._sup.job.first_commit_ts, now):
                self._waiting[i] = f"its condition ({spec.describe()}) never held (job step {self._sup.job.step})"
                continue
            waiting = self._try(i, spec)
            if waiting is not None:
                self._waiting[i] = waiting

    def undo_due(self, now_m: float, *, everything: bool = False) -> None:
        """Undo timed faults whose duration is over (all of them with ``everything``)."""
        for u in [u for u in self._undo if everything or now_m >= u.at]:
            self._undo.remove(u)
            try:
                u.action()
            except (NetworkUnavailable, DiskUnavailable, OSError) as e:
                logger.error("could not undo %s: %s", u.what, e)
            self._impaired.discard(u.target)
            self._back_at[u.target] = time.time()
            self.target_back(u.target)
            logger.info("undone: %s", u.what)

    def target_back(self, target: str) -> None:
        """The target can run again (restarted, SIGCONT, link restored, disk freed)."""
        index = self._awaiting_resume.pop(target, None)
        if index is not None:
            self.injected[index] = dataclasses.replace(self.injected[index], resumed_ts=time.time())

    def notice_path(self, group: str) -> Path | None:
        """The file whose existence tells ``group`` it is preempted, or None when nothing is watched."""
        return None if self._notices_dir is None else self._notices_dir / group

    def withdraw_notice(self, group: str) -> bool:
        """Remove ``group``'s notice before it is restarted (else it would leave again at once);
        True if there was one, i.e. the group was told to leave."""
        path = self.notice_path(group)
        if path is None or not path.exists():
            return False
        path.unlink()
        logger.info("withdrew the preemption notice of %s (%s)", group, path)
        return True

    def awaiting(self, target: str) -> bool:
        return target in self._awaiting_resume

    def self_inflicted(self, group: str) -> str | None:
        """An armed group died of SIGKILL by itself: record the fault it fired; returns its kind."""
        for i in self.pending:
            spec = self.scenario.faults[i]
            if spec.target == group and spec.kind in SELF_ARMED_KINDS:
                self.pending.remove(i)
                self._healer_killed.discard(i)
                self._add(spec, group)
                logger.info("%s fired: %s", spec.kind, spec.describe())
                return spec.kind
        return None

    def skipped_reasons(self) -> list[tuple[str, str]]:
        out = list(self.skipped)
        for i in self.pending:
            spec = self.scenario.faults[i]
            if spec.kind == "fault_point":
                reason = f"{spec.target}'s first process never reached {spec.point} at step {spec.at_step}"
            elif i in self._healer_killed:
                reason = (
                    f"{spec.healer} was killed, but {spec.target}'s first process served no heal at or after "
                    f"step {spec.at_step} before the job ended"
                )
            else:
                reason = self._waiting.get(i, "the job ended first")
            out.append((spec.describe(), reason))
        return out

    # -- the faults ----------------------------------------------------------------------------

    def _try(self, i: int, spec: FaultSpec) -> str | None:
        """Inject fault ``i`` if its target can take it; else return what it is waiting for."""
        kind = spec.kind
        if kind == "kill_lighthouse":
            if not self._sup.kill_lighthouse():
                return "the lighthouse was not running (being restarted)"
            return self._done(i, spec, LIGHTHOUSE)
        if kind in REPLICATED_LIGHTHOUSE_KINDS:
            return self._sup.lighthouse_fault(kind, spec.duration_s) or self._done(i, spec, LIGHTHOUSE)
        if kind in ALL_GROUPS_KINDS:
            return self._kill_all(i, spec)
        if kind == "fill_disk":
            return self._fill_disk(i, spec)
        group = spec.healer if kind == "kill_donor_mid_heal" else spec.target
        assert group is not None
        waiting = self._group_ready(group)
        if waiting is not None:
            return waiting
        if kind in RESTARTING_KINDS and self.scenario.warm_standby and not self._sup.standby_ready():
            return "no warm standby was ready to restart it in (warm_standby = true)"
        if kind == "sigstop":
            self._sup.signal_group(group, signal.SIGSTOP, None)
            self._impaired.add(group)
            self._schedule(spec, group, lambda: self._sup.signal_group(group, signal.SIGCONT, None), f"SIGCONT {group}")
        elif kind in ("sigkill", "sigterm"):
            self._sup.signal_group(group, signal.SIGKILL if kind == "sigkill" else signal.SIGTERM, kind)
        elif kind == "preemption_notice":
            path = self.notice_path(group)
            assert path is not None, "the runner gives a notices directory to a scenario with preemption_notice"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("preempted by the chaos harness\n")
        elif kind == "sigkill_rank":
            assert spec.rank is not None
            if not self._sup.kill_rank(group, spec.rank, kind):
                return f"the pid of {group} rank {spec.rank} was not known yet (no start event)"
        elif kind == "kill_donor_mid_heal":
            return self._kill_healer(i, spec, group)
        elif kind in NETWORK_KINDS:
            return self._network(i, spec, group)
        return self._done(i, spec, group)

    def _healthy(self, group: str) -> bool:
        return (
            self._sup.is_healthy(group)
            and group not in self._impaired
            and self._sup.job.last_commit_ts.get(group, 0.0) > self._back_at.get(group, 0.0)
        )

    def _group_ready(self, group: str) -> str | None:
        if not self._healthy(group):
            return f"{group} was not running and committing (down, stopped, restarting, impaired or not yet caught up)"
        others = [g for g in self.scenario.group_ids if g != group and self._healthy(g)]
        if not others:
            return (
                f"{group} was the last healthy group (a fault must not take down every group; "
                "that experiment is kill_all_groups)"
            )
        return None

    def _kill_healer(self, i: int, spec: FaultSpec, healer: str) -> str | None:
        assert spec.target is not None
        if not self._sup.is_armed(spec.target):
            self.pending.remove(i)
            self.skipped.append(
                (
                    spec.describe(),
                    f"{spec.target}'s first process, armed to die serving a heal, "
                    "ended before the healer could be killed",
                )
            )
            return None
        self._sup.signal_group(healer, signal.SIGKILL, "kill_donor_mid_heal")
        self._healer_killed.add(i)
        self.injected.append(
            InjectedFault("sigkill", healer, time.time(), label=f"sigkill {healer} (the healer of {spec.describe()})")
        )
        self._awaiting_resume[healer] = len(self.injected) - 1
        logger.info("killed %s so that %s dies serving its heal", healer, spec.target)
        return None

    def _kill_all(self, i: int, spec: FaultSpec) -> str | None:
        needed = 2 if spec.kind in CORRUPTING_KINDS else 1
        if spec.kind in OBJECT_STORE_KINDS:
            assert self._s3 is not None, "skip_unavailable() removes cold_start faults without an object store"
            stored = self._s3.checkpoints(OBJECT_STORE_BUCKET, OBJECT_STORE_PREFIX)
            if len(stored) < needed:
                return f"{needed} checkpoint(s) needed in the object store, {len(stored)} uploaded"
        else:
            published = published_checkpoints(self._checkpoint_dir) if self._checkpoint_dir is not None else []
            if len(published) < needed:
                return f"{needed} published checkpoint(s) needed, {len(published)} found in {self._checkpoint_dir}"
        if not any(self._sup.is_healthy(g) for g in self.scenario.group_ids):
            return "no group was running and committing"
        ts = time.time()
        self._sup.kill_every_group(spec.kind)
        if spec.kind in OBJECT_STORE_KINDS:
            return self._cold_start(i, spec, ts)
        if spec.kind == "kill_all_groups":
            return self._done(i, spec, ALL_GROUPS, ts=ts)
        # Damaged while every group is down and reaped: no writer can publish a newer one meanwhile.
        assert self._checkpoint_dir is not None
        try:
            damage = corrupt_newest_checkpoint(self._checkpoint_dir)
        except (DiskUnavailable, OSError) as e:
            return self._done(
                i, spec, ALL_GROUPS, ts=ts, detail=f"every group was killed, but the checkpoint was not damaged: {e}"
            )
        return self._done(
            i,
            spec,
            ALL_GROUPS,
            ts=ts,
            checkpoint_step=damage.step,
            detail=f"flipped byte {damage.offset} of {damage.path.parent.name}/{damage.path.name}",
        )

    def _cold_start(self, i: int, spec: FaultSpec, ts: float) -> None:
        """Every group is down and reaped: empty their disk (new machines); for the corrupt
        variant, damage the newest checkpoint in the object store."""
        assert self._checkpoint_dir is not None and self._s3 is not None
        shutil.rmtree(self._checkpoint_dir, ignore_errors=True)
        self._checkpoint_dir.mkdir(parents=True)
        detail = f"deleted {self._checkpoint_dir}"
        if spec.kind == "cold_start":
            return self._done(i, spec, ALL_GROUPS, ts=ts, detail=detail)
        step, key = self._s3.corrupt_newest(OBJECT_STORE_BUCKET, OBJECT_STORE_PREFIX)
        return self._done(
            i,
            spec,
            ALL_GROUPS,
            ts=ts,
            checkpoint_step=step,
            detail=f"{detail}; flipped a byte of s3://{OBJECT_STORE_BUCKET}/{key}",
        )

    def _fill_disk(self, i: int, spec: FaultSpec) -> str | None:
        assert self._disk is not None, "skip_unavailable() removes fill_disk faults without a disk"
        try:
            num_bytes = self._disk.fill()
        except OSError as e:
            self._disk.unfill()
            self.pending.remove(i)
            self.skipped.append((spec.describe(), f"could not fill {self._disk.path}: {e}"))
            return None
        self._schedule(spec, DISK, self._disk.unfill, f"free {self._disk.path}")
        return self._done(i, spec, DISK, detail=f"filled {self._disk.path} with {num_bytes} bytes")

    def _network(self, i: int, spec: FaultSpec, group: str) -> str | None:
        assert self._lab is not None, "skip_unavailable() removes network faults without a lab"
        lab = self._lab
        try:
            if spec.kind == "partition":
                lab.cut(group)
                self._schedule(spec, group, lambda: lab.restore(group), f"restore {group}'s link")
            else:
                lab.shape(group, spec.rate_mbit, spec.delay_ms)
                self._schedule(spec, group, lambda: lab.unshape(group), f"unshape {group}'s link")
        except NetworkUnavailable as e:
            self.pending.remove(i)
            self.skipped.append(
                (spec.describe(), f"the link could not be {'cut' if spec.kind == 'partition' else 'shaped'}: {e}")
            )
            return None
        self._impaired.add(group)
        return self._done(i, spec, group)

    def _schedule(self, spec: FaultSpec, target: str, action: Callable[[], None], what: str) -> None:
        self._undo.append(_Undo(time.monotonic() + spec.duration_s, target, action, what))

    def _done(
        self,
        i: int,
        spec: FaultSpec,
        target: str,
        *,
        ts: float | None = None,
        detail: str = "",
        checkpoint_step: int | None = None,
    ) -> None:
        self.pending.remove(i)
        self._add(spec, target, ts=ts, detail=detail, checkpoint_step=checkpoint_step)
        logger.info(
            "injected %s (job at step %d)%s", spec.describe(), self._sup.job.step, f": {detail}" if detail else ""
        )
        return None

    def _add(
        self,
        spec: FaultSpec,
        target: str,
        *,
        ts: float | None = None,
        detail: str = "",
        checkpoint_step: int | None = None,
    ) -> None:
        self.injected.append(
            InjectedFault(
                spec.kind,
                target,
                time.time() if ts is None else ts,
                label=spec.describe(),
                detail=detail,
                checkpoint_step=checkpoint_step,
            )
        )
        self._awaiting_resume[target] = len(self.injected) - 1
