"""Run one scenario: a lighthouse, R groups of ``examples/train_ddp.py``, a supervisor, the faults.

The runner is the I/O shell of the harness. One thread runs one loop; each turn (every
``POLL_S``) it reads the events appended since the last turn, then acts on what it saw:

1. reaps exited groups — a clean exit means the group trained all its steps; any other exit is
   explained by the fault the harness injected into it, by an armed fault point firing, or
   is a crash;
2. restarts dead groups and a killed lighthouse ``restart_delay_s`` later, as an orchestrator
   would. The groups are kept by the launcher's own supervisor
   (``replicaft.launch.groups.GroupSupervisor``, to which this runner is the ``GroupHooks``:
   command lines, log files, and the restart rule above), so a chaos run restarts groups
   exactly as ``replicaft-launch`` does; with ``warm_standby`` a restart runs in a warm
   standby holding a memory reserve, as the launcher's do;
3. undoes timed faults whose duration is over, and injects each scenario fault once its
   condition holds and its target can take it (``chaos/injector.py`` owns the faults; this
   module owns the processes and implements the injector's ``Supervision`` interface);
4. ends the run when the job has finished, or when ``run_timeout_s`` passes (then the
   invariant checks report the hang).

Before the first process starts, the runner builds what the scenario's faults need: network
namespaces for ``partition``/``slow_link`` (``chaos/network.py``; every process then runs in
one) and a small tmpfs as the checkpoint directory for ``fill_disk`` (``chaos/disk.py``). If
either cannot be built, the run goes on without it and the faults that needed it are skipped
with the reason. Both are torn down in the same ``finally`` that stops the processes.

No wait in here is unbounded: the loop itself ends at the run deadline, the lighthouse start
has its own deadline, reaping a SIGKILLed child has one, and every child is SIGKILLed in a
``finally``.

When the first group finishes training (its ``stop`` event at the target step, or a clean
exit), the job is done: no more faults or restarts, and a group that has not rejoined yet
(restarted too late, or still stopped) is stopped, because alone it would start a new job
from step 0 — a rollback the checker would rightly flag, caused by the harness rather than
by replicaft.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chaos.commands import (
    REPO_ROOT,
    GroupPlacement,
    group_command,
    group_env,
    group_script,
    lighthouse_command,
)
from chaos.environment import RunEnvironment
from chaos.injector import Injector
from chaos.job_view import JobView
from chaos.lighthouse_set import LighthouseSet
from chaos.network import LIGHTHOUSE as LAB_LIGHTHOUSE
from chaos.outcomes import PREEMPTED_EXIT_CODE
from chaos.processes import Child, log_tail, python_env
from chaos.record import ALL_GROUPS, LIGHTHOUSE, ProcessExit, RunRecord
from chaos.scenario import Scenario
from lighthouse.server.announce import GRPC_LINE
from replicaft.launch.children import SpawnSettings
from replicaft.launch.groups import Group, GroupSupervisor
from replicaft.launch.reaper import Reaper
from replicaft.launch.restart_policy import RestartDecision
from replicaft.telemetry.events import EventTail

logger = logging.getLogger(__name__)

POLL_S = 0.1
LIGHTHOUSE_START_TIMEOUT_S = 30.0
"""A torch-free process; seconds on an idle box, but this one is shared by 2 cores."""
TEARDOWN_GRACE_S = 3.0
"""How long a group that finished training may take to exit before it is killed."""
OUTPUT_DRAIN_S = 1.0
"""How long a crashed group's last lines may take to reach its log, for the crash's message."""


@dataclass(frozen=True, slots=True)
class Progress:
    """What the live progress line shows; handed to ``on_progress`` every loop turn."""

    elapsed_s: float
    step: int
    target_steps: int
    quorum_size: int
    faults_injected: int
    faults_planned: int
    groups_running: int


@dataclass(slots=True)
class _Group:
    """What the harness knows of a group beyond its supervision (``Group``: process, state, restarts)."""

    gid: str
    log_path: Path | None = None
    """The current incarnation's log file."""
    stopped: bool = False
    """True between SIGSTOP and SIGCONT sent by the harness."""
    cause: str | None = None
    """Why the current process will end, when the harness ended it: a fault kind, ``run_end``
    (stopped because the job finished without it) or ``teardown`` (killed after training)."""
    armed: bool = False
    """The current process carries the scenario's fault points."""
    finished_at: float | None = None
    """Monotonic time this group completed its training steps."""


class Runner:
    """One run of one scenario. ``run()`` blocks until the job ends or the deadline passes.

    It is the :class:`~replicaft.launch.groups.GroupHooks` of the supervisor that keeps its
    groups (``group_variables`` ... ``exited``), and the injector's
    :class:`~chaos.injector.Supervision` (``is_healthy`` ... ``standby_ready``)."""

    def __init__(
        self, scenario: Scenario, out_dir: Path, *, on_progress: Callable[[Progress], None] | None = None
    ) -> None:
        self.scenario = scenario
        self.out_dir = out_dir.resolve()
        self.events_dir = self.out_dir / "events"
        self.logs_dir = self.out_dir / "logs"
        self.checkpoint_dir = self.out_dir / "checkpoints" if scenario.checkpoint_interval_steps else None
        self.job = JobView()
        self._on_progress = on_progress
        self._groups = {gid: _Group(gid) for gid in scenario.group_ids}
        self._lighthouse: Child | None = None
        self._lighthouse_port = 0
        self._lighthouse_address = ""
        self._lighthouse_incarnation = 0
        self._lighthouse_restart_at: float | None = None
        self._lighthouse_set: LighthouseSet | None = None
        """The replicated lighthouse (``lighthouse_replicas = 3``), which then replaces the single one."""
        self._tail = EventTail(self.events_dir)
        self._env = RunEnvironment(scenario, self.checkpoint_dir)
        self._injector = Injector(
            scenario,
            self,
            checkpoint_dir=self.checkpoint_dir,
            notices_dir=self.out_dir / "notices" if scenario.needs_notices else None,
        )
        # Groups run in the run's directory, so whatever a script writes beside itself (Lightning's
        # logs) stays with the run instead of landing in the repository.
        # No subreaper and other children of its own (the lighthouse): the reaper stops only
        # what is below the groups and standbys it is asked to stop.
        self._reaper = Reaper(lambda: self._supervisor.children(), lambda: False, leftovers=False)
        self._supervisor = GroupSupervisor(
            scenario.group_ids, self, reaper=self._reaper, base_env=lambda: python_env(REPO_ROOT, {}),
            standby_script=group_script(scenario), num_standbys=1 if scenario.warm_standby else 0,
            standby_reserve=True, write_line=self._write_standby_line,
            settings=SpawnSettings(cwd=self.out_dir, die_with_parent=sys.platform == "linux"),
        )  # fmt: skip
        self._exits: list[ProcessExit] = []
        self._finishing_since: float | None = None
        self._stopped_at_end: list[str] = []

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> RunRecord:
        """Run the scenario to its end; raises RuntimeError if it cannot start (lighthouse, reused directory)."""
        if any(self.events_dir.glob("*.jsonl")):
            # The runner reads every event file in there: an earlier run's would be taken for this one's.
            raise RuntimeError(f"{self.events_dir} already holds events of an earlier run; pass a new --out directory")
        self.events_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        started_ts, started = time.time(), time.monotonic()
        deadline = started + self.scenario.run_timeout_s
        try:
            self._prepare_environment()
            self._start_lighthouse()
            self._supervisor.tick(time.monotonic())  # every group starts
            while not self._done():
                if time.monotonic() > deadline:
                    logger.error(
                        "run deadline of %gs passed at step %d; stopping", self.scenario.run_timeout_s, self.job.step
                    )
                    break
                self._turn()
                if self._on_progress is not None:
                    self._on_progress(self._progress(time.monotonic() - started))
                time.sleep(POLL_S)
            deadline_exceeded = not self._done()
        finally:
            self._stop_all()
            self._teardown_environment()
        groups = self._supervisor.groups
        return RunRecord(
            scenario=self.scenario,
            out_dir=self.out_dir,
            events_dir=self.events_dir,
            started_ts=started_ts,
            ended_ts=time.time(),
            faults=tuple(self._injector.injected),
            skipped=tuple(self._injector.skipped_reasons()),
            exits=tuple(self._exits),
            restarts={gid: g.num_restarts for gid, g in groups.items()},
            standby_restarts={gid: g.num_standby_restarts for gid, g in groups.items()},
            stopped_at_end=tuple(self._stopped_at_end),
            deadline_exceeded=deadline_exceeded,
            environment=dict(self._env.notes),
        )

    def _turn(self) -> None:
        events = self._tail.poll()
        self.job.absorb(events)
        for event in events:
            self._supervisor.note_event(event)
        now_m = time.monotonic()
        for g in self._groups.values():
            self._note_finished(g, now_m)
        self._supervisor.reap(now_m)
        self._reap_lighthouse(now_m)
        self._injector.undo_due(now_m)
        if self._finishing_since is None:
            self._supervisor.tick(now_m)  # restarts due, and the standbys
        if self._lighthouse_restart_at is not None and now_m >= self._lighthouse_restart_at:
            self._restart_lighthouse(now_m)
        if self._finishing_since is None:
            self._injector.inject_due()
        else:
            self._wind_down(now_m)

    def _done(self) -> bool:
        return self._finishing_since is not None and not any(g.running for g in self._supervisor.groups.values())

    def _progress(self, elapsed_s: float) -> Progress:
        running = sum(1 for gid, g in self._supervisor.groups.items() if g.running and not self._groups[gid].stopped)
        # A kill_donor_mid_heal is recorded as two faults: the healer's kill and the donor's death.
        planned = len(self.scenario.faults) + sum(f.kind == "kill_donor_mid_heal" for f in self.scenario.faults)
        return Progress(
            elapsed_s,
            self.job.step,
            self.scenario.steps,
            self.job.quorum_size,
            len(self._injector.injected),
            planned,
            running,
        )

    # -- environment ---------------------------------------------------------------------------

    def _prepare_environment(self) -> None:
        """Network namespaces and the checkpoint tmpfs, as the faults need; skips what cannot be built."""
        self._env.build()
        if self._env.lab is not None:
            self._injector.use_network(self._env.lab)
        if self._env.disk is not None:
            self._injector.use_disk(self._env.disk)
        if self._env.s3 is not None:
            self._injector.use_object_store(self._env.s3)
        for kinds, reason in self._env.unavailable:
            self._injector.skip_unavailable(kinds, reason)

    def _teardown_environment(self) -> None:
        self._injector.undo_due(time.monotonic(), everything=True)
        self._env.close()

    # -- the injector's interface (chaos.injector.Supervision) ---------------------------------

    def _alive(self, group: str) -> bool:
        """The group's current process runs (it may be stopped)."""
        g = self._supervisor.groups[group]
        return g.running and g.child is not None and g.child.popen.poll() is None

    def is_healthy(self, group: str) -> bool:
        g = self._groups[group]
        return (
            self._alive(group)
            and not g.stopped
            and g.cause is None
            and g.finished_at is None
            and self.job.committed_since(group, self._supervisor.groups[group].started_ts)
        )

    def is_armed(self, group: str) -> bool:
        return self._groups[group].armed and self._alive(group)

    def signal_group(self, group: str, sig: int, cause: str | None) -> None:
        g = self._groups[group]
        if not self._supervisor.groups[group].running:
            return
        if cause is not None:
            g.cause = cause
        if self._supervisor.signal(group, signal.Signals(sig)):
            if sig == signal.SIGSTOP:
                g.stopped = True
            elif sig == signal.SIGCONT:
                g.stopped = False

    def kill_rank(self, group: str, rank: int, cause: str) -> bool:
        pid = self.job.rank_pids(group, self._supervisor.groups[group].started_ts).get(rank)
        if pid is None:
            return False
        if pid not in self._supervisor.processes(group):
            logger.warning(
                "%s rank %d (pid %d) is not a process of its current incarnation; not signalling it", group, rank, pid
            )
            return False
        self._groups[group].cause = cause
        os.kill(pid, signal.SIGKILL)
        return True

    def kill_every_group(self, cause: str) -> None:
        # Every signal first, then the reaping (a bounded wait): killing and reaping one by one
        # let the last group train on for 0.6 s (measured under load).
        running = [gid for gid, g in self._supervisor.groups.items() if g.running]
        for gid in running:
            self._groups[gid].cause = cause
            self._supervisor.signal(gid, signal.SIGKILL)
        now_m = time.monotonic()
        self._supervisor.postpone_restarts(now_m + self.scenario.restart_delay_s)  # all come back together
        self._supervisor.kill(running)
        self._supervisor.reap(now_m)

    def lighthouse_fault(self, kind: str, duration_s: float) -> str | None:
        assert self._lighthouse_set is not None, "the scenario check requires lighthouse_replicas = 3"
        return self._lighthouse_set.fault(kind, duration_s)

    def kill_lighthouse(self) -> bool:
        if self._lighthouse is None or self._lighthouse.poll() is not None:
            return False
        self._lighthouse.kill()
        return True

    def standby_ready(self) -> bool:
        return self._supervisor.standbys.num_ready() > 0

    # -- the groups' hooks (replicaft.launch.groups.GroupHooks) --------------------------------

    def group_variables(self, group: Group) -> dict[str, str]:
        # Fault points are armed in the first process only: a restarted group heals to the
        # job's step and could reach the same point@step again, dying in a loop.
        gid = group.replica_id
        placement = GroupPlacement(
            lighthouse=self._lighthouse_address,
            events_dir=self.events_dir,
            checkpoint_dir=self.checkpoint_dir,
            host=self._env.lab.address(gid) if self._env.lab is not None else None,
            interface="eth0" if self._env.lab is not None else None,
            fault_points=self.scenario.fault_points_for(gid) if group.incarnation == 1 else None,
            object_store=self._env.object_store,
            object_store_endpoint=self._env.s3.endpoint if self._env.s3 is not None else None,
            preemption_notice=self._injector.notice_path(gid),
        )
        return group_env(self.scenario, gid, placement)

    def cold_argv(self, group: Group) -> list[str]:
        args = group_command(self.scenario)
        return self._env.lab.wrap(group.replica_id, args) if self._env.lab is not None else args

    def on_line(self, group: Group) -> Callable[[str], None]:
        path = self.logs_dir / f"{group.replica_id}-{group.incarnation}.log"
        self._groups[group.replica_id].log_path = path

        def write(line: str) -> None:  # on the child's reader thread; opened per line, so nothing is left open
            with open(path, "a", encoding="utf-8", errors="replace") as log:
                log.write(line + "\n")

        return write

    def started(self, group: Group) -> None:
        g = self._groups[group.replica_id]
        g.cause, g.stopped = None, False
        g.armed = group.incarnation == 1 and self.scenario.fault_points_for(g.gid) is not None
        assert group.child is not None
        how = "in warm standby pid" if group.in_standby else "as pid"
        logger.info("started %s#%d %s %d, log %s", g.gid, group.incarnation, how, group.child.pid, g.log_path)
        if group.num_restarts:
            self._injector.target_back(g.gid)
            if self._injector.awaiting(ALL_GROUPS) and all(x.running for x in self._supervisor.groups.values()):
                self._injector.target_back(ALL_GROUPS)

    def exited(self, group: Group, exit_code: int, now: float) -> RestartDecision:
        g, code = self._groups[group.replica_id], exit_code
        cause = g.cause
        if cause == "teardown" and code == 0:
            cause = None  # it exited by itself just as the grace period ran out
        if cause is None and g.armed and code == -signal.SIGKILL:
            cause = self._injector.self_inflicted(g.gid)
        # A group told to leave by its notice file exits 143 with no signal from us; any other
        # death of a notified group withdraws the notice too, so the restart does not leave again.
        if self._injector.withdraw_notice(g.gid) and cause is None and code == PREEMPTED_EXIT_CODE:
            cause = "preemption_notice"
        if code == 0 and cause is None and g.finished_at is None:
            g.finished_at = now  # the script ended by itself: it trained what it was asked to
            self._begin_finishing(now)
        name = f"{g.gid}#{group.incarnation}"
        detail = ""
        if cause is None and code != 0:
            assert group.child is not None
            group.child.join_output(OUTPUT_DRAIN_S)
            detail = log_tail(g.log_path) if g.log_path is not None else ""
            logger.error("%s crashed with exit code %d: %s", name, code, detail)
        self._exits.append(ProcessExit(g.gid, time.time(), code, cause, self.job.step, detail))
        g.stopped = False
        if g.finished_at is not None or self._finishing_since is not None:
            return RestartDecision("done", 0.0, f"exited with code {code}; the job has finished")
        delay = self.scenario.restart_delay_s
        logger.info("%s exited (code %d, %s); restarting in %gs", name, code, cause or "no fault", delay)
        return RestartDecision("restart", delay, f"exited with code {code} ({cause or 'no fault'})")

    def _write_standby_line(self, line: str) -> None:
        """A standby's own output, before it becomes a group (on its reader thread)."""
        with open(self.logs_dir / "standbys.log", "a", encoding="utf-8", errors="replace") as log:
            log.write(line + "\n")

    # -- groups --------------------------------------------------------------------------------

    def _note_finished(self, g: _Group, now_m: float) -> None:
        """A process that reached the target step has finished training, whether or not it has exited yet.

        Exiting takes long after the ``stop`` event (3 s alone, 11 s with three groups on the
        loaded 2-core box: interpreter teardown), which is no part of what the harness measures.
        """
        sg = self._supervisor.groups[g.gid]
        if g.finished_at is None and sg.running and self.job.finished_since(g.gid, sg.started_ts, self.scenario.steps):
            g.finished_at = now_m
            self._begin_finishing(now_m)

    def _begin_finishing(self, now_m: float) -> None:
        if self._finishing_since is None:
            logger.info("a group finished training at step %d; winding down", self.job.step)
            self._finishing_since = now_m
            self._lighthouse_restart_at = None
            self._supervisor.cancel_restarts()

    def _wind_down(self, now_m: float) -> None:
        """End the processes that have nothing left to do for the finished job.

        A finished group gets ``TEARDOWN_GRACE_S`` to exit. An unfinished one that has not
        committed since it started, or is stopped, cannot rejoin a job that is over and is
        stopped at once; the others get ``hang_bound_s`` to finish their last steps.
        """
        assert self._finishing_since is not None
        grace_over = now_m - self._finishing_since > self.scenario.hang_bound_s
        for g in self._groups.values():
            sg = self._supervisor.groups[g.gid]
            if not sg.running or g.cause is not None:
                continue
            name = f"{g.gid}#{sg.incarnation}"
            if g.finished_at is not None:
                if now_m - g.finished_at > TEARDOWN_GRACE_S:
                    logger.info("killing %s: still tearing down %.0fs after it finished", name, now_m - g.finished_at)
                    g.cause = "teardown"
                    self._supervisor.kill([g.gid])
                continue
            if g.stopped or not self.job.committed_since(g.gid, sg.started_ts) or grace_over:
                logger.info("stopping %s: the job finished without it", name)
                g.cause = "run_end"
                self._supervisor.kill([g.gid])
                self._stopped_at_end.append(g.gid)

    # -- the lighthouse ------------------------------------------------------------------------

    def _lighthouse_child(self) -> Child:
        self._lighthouse_incarnation += 1
        host = self._env.lab.address(LAB_LIGHTHOUSE) if self._env.lab is not None else None
        args = lighthouse_command(self.scenario, host=host, port=self._lighthouse_port)
        if self._env.lab is not None:
            args = self._env.lab.wrap(LAB_LIGHTHOUSE, args)
        log = self.logs_dir / f"lighthouse-{self._lighthouse_incarnation}.log"
        return Child(
            f"lighthouse#{self._lighthouse_incarnation}",
            args,
            log_path=log,
            env=python_env(REPO_ROOT, {}),
            cwd=REPO_ROOT,
        )

    def _start_lighthouse(self) -> None:
        """Start the lighthouse, wait (bounded) for its address; restarts reuse the first port."""
        if self.scenario.lighthouse_replicas > 1:
            extra = [
                "--heartbeat-timeout",
                str(self.scenario.heartbeat_timeout_s),
                "--progress-timeout",
                str(self.scenario.progress_timeout_s),
            ]
            self._lighthouse_set = LighthouseSet(
                self.logs_dir,
                self.out_dir / "etcd",
                python_env(REPO_ROOT, {}),
                REPO_ROOT,
                extra,
                self.scenario.restart_delay_s,
            )
            self._lighthouse_address = self._lighthouse_set.start()
            logger.info("replicated lighthouse serving at %s", self._lighthouse_address)
            return
        child = self._lighthouse_child().start()
        self._lighthouse = child
        match = child.wait_for_output(GRPC_LINE, LIGHTHOUSE_START_TIMEOUT_S)
        self._lighthouse_address = match.group(1)
        self._lighthouse_port = int(self._lighthouse_address.rsplit(":", 1)[1])
        logger.info("lighthouse serving at %s", self._lighthouse_address)

    def _restart_lighthouse(self, now_m: float) -> None:
        try:
            self._start_lighthouse()
        except RuntimeError as e:
            logger.error("lighthouse restart failed: %s; retrying in %gs", e, self.scenario.restart_delay_s)
            if self._lighthouse is not None:
                self._lighthouse.kill()
            self._lighthouse_restart_at = now_m + self.scenario.restart_delay_s
            return
        self._lighthouse_restart_at = None
        self._injector.target_back(LIGHTHOUSE)

    def _reap_lighthouse(self, now_m: float) -> None:
        if self._lighthouse_set is not None:
            self._lighthouse_set.tick(now_m, restarting=self._finishing_since is None)
            return
        lh = self._lighthouse
        if lh is None or self._lighthouse_restart_at is not None or lh.poll() is None:
            return
        if not self._injector.awaiting(LIGHTHOUSE):
            self._exits.append(
                ProcessExit(LIGHTHOUSE, time.time(), lh.poll() or 0, None, self.job.step, lh.output_tail())
            )
            logger.error("the lighthouse died on its own: %s", lh.output_tail())
        if self._finishing_since is None:
            self._lighthouse_restart_at = now_m + self.scenario.restart_delay_s

    # -- teardown ------------------------------------------------------------------------------

    def _stop_all(self) -> None:
        """SIGKILL every child still running (noting the groups among them), standbys too."""
        self._stopped_at_end += [gid for gid in self._groups if self._alive(gid)]
        self._reaper.kill(self._supervisor.children())
        if self._lighthouse is not None:
            self._lighthouse.kill()
        if self._lighthouse_set is not None:
            self._lighthouse_set.stop()
