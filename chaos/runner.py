"""Run one scenario: a lighthouse, R groups of ``examples/train_ddp.py``, a supervisor, the faults.

The runner is the I/O shell of the harness. One thread runs one loop; each turn (every
``POLL_S``) it reads the events appended since the last turn, then acts on what it saw:

1. reaps exited groups — a clean exit means the group trained all its steps; any other exit is
   explained by the fault the harness injected into it, by an armed fault point firing, or
   is a crash;
2. restarts dead groups and a killed lighthouse ``restart_delay_s`` later, as an orchestrator
   would, and sends SIGCONT to groups whose stop has lasted its duration;
3. injects each scenario fault once its condition holds (a committed step, or seconds since
   the first commit) and its target is running;
4. ends the run when the job has finished, or when ``run_timeout_s`` passes (then the
   invariant checks report the hang).

No wait in here is unbounded: the loop itself ends at the run deadline, the lighthouse start
has its own deadline, and every child is SIGKILLed in a ``finally``.

When the first group finishes training (its ``stop`` event at the target step, or a clean
exit), the job is done: no more faults or restarts, and a group that has not rejoined yet
(restarted too late, or still stopped) is stopped, because alone it would start a new job
from step 0 — a rollback the checker would rightly flag, caused by the harness rather than
by replicaft.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from chaos.event_tail import EventTail
from chaos.job_view import JobView
from chaos.processes import Child, python_env
from chaos.record import LIGHTHOUSE, InjectedFault, ProcessExit, RunRecord
from chaos.scenario import FaultSpec, Scenario

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = REPO_ROOT / "examples" / "train_ddp.py"
POLL_S = 0.1
LIGHTHOUSE_START_TIMEOUT_S = 30.0
"""A torch-free process; seconds on an idle box, but this one is shared by 2 cores."""
TEARDOWN_GRACE_S = 3.0
"""How long a group that finished training may take to exit before it is killed."""
_GRPC_LINE = re.compile(r"^lighthouse serving gRPC at (\S+)$", re.MULTILINE)


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
    gid: str
    child: Child | None = None
    """The running process; None once it exited (and was reaped) or before the first start."""
    incarnation: int = 0
    restart_at: float | None = None
    """Monotonic time of the pending restart."""
    resume_at: float | None = None
    """Monotonic time of the pending SIGCONT."""
    cause: str | None = None
    """Why the current process will end, when the harness ended it: a fault kind, ``run_end``
    (stopped because the job finished without it) or ``teardown`` (killed after training)."""
    armed: bool = False
    """The current process carries the scenario's fault point."""
    finished_at: float | None = None
    """Monotonic time this group completed its training steps."""


def is_due(spec: FaultSpec, step: int, first_commit_ts: float | None, now: float) -> bool:
    """Whether the condition of a harness-injected fault holds (fault points fire themselves)."""
    if spec.at_step is not None:
        return step >= spec.at_step
    assert spec.at_s is not None
    return first_commit_ts is not None and now >= first_commit_ts + spec.at_s


class Runner:
    """One run of one scenario. ``run()`` blocks until the job ends or the deadline passes."""

    def __init__(self, scenario: Scenario, out_dir: Path, *, on_progress: Callable[[Progress], None] | None = None) -> None:
        self.scenario = scenario
        self.out_dir = out_dir
        self.events_dir = out_dir / "events"
        self.logs_dir = out_dir / "logs"
        self._on_progress = on_progress
        self._groups = {gid: _Group(gid) for gid in scenario.group_ids}
        self._lighthouse: Child | None = None
        self._lighthouse_port = 0
        self._lighthouse_address = ""
        self._lighthouse_incarnation = 0
        self._lighthouse_restart_at: float | None = None
        self._tail = EventTail(self.events_dir)
        self._job = JobView()
        self._pending = list(range(len(scenario.faults)))
        """Indices of scenario faults not yet injected."""
        self._faults: list[InjectedFault] = []
        self._awaiting_resume: dict[str, int] = {}
        """Target -> index into ``_faults`` whose ``resumed_ts`` is still unknown."""
        self._exits: list[ProcessExit] = []
        self._restarts = {gid: 0 for gid in scenario.group_ids}
        self._finishing_since: float | None = None
        self._stopped_at_end: list[str] = []

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> RunRecord:
        """Run the scenario to its end; raises RuntimeError if it cannot start (lighthouse, reused directory)."""
        if any(self.events_dir.glob("*.jsonl")):
            # The runner reads every event file in there: an earlier run's would be taken for this one's.
            raise RuntimeError(f"{self.events_dir} already holds events of an earlier run; pass a new --out directory")
        self.events_dir.mkdir(parents=True, exist_ok=True)
        started_ts, started = time.time(), time.monotonic()
        deadline = started + self.scenario.run_timeout_s
        try:
            self._start_lighthouse()
            for g in self._groups.values():
                self._start_group(g)
            while not self._done():
                if time.monotonic() > deadline:
                    logger.error("run deadline of %gs passed at step %d; stopping", self.scenario.run_timeout_s, self._job.step)
                    break
                self._turn()
                if self._on_progress is not None:
                    self._on_progress(self._progress(time.monotonic() - started))
                time.sleep(POLL_S)
            deadline_exceeded = not self._done()
        finally:
            self._stop_all()
        return RunRecord(
            scenario=self.scenario,
            out_dir=self.out_dir,
            events_dir=self.events_dir,
            started_ts=started_ts,
            ended_ts=time.time(),
            faults=tuple(self._faults),
            skipped=tuple(self._skipped_reasons()),
            exits=tuple(self._exits),
            restarts=dict(self._restarts),
            stopped_at_end=tuple(self._stopped_at_end),
            deadline_exceeded=deadline_exceeded,
        )

    def _turn(self) -> None:
        self._job.absorb(self._tail.poll())
        now_m = time.monotonic()
        for g in self._groups.values():
            self._note_finished(g, now_m)
            self._reap(g, now_m)
        self._reap_lighthouse(now_m)
        for g in self._groups.values():
            if g.resume_at is not None and now_m >= g.resume_at:
                self._resume(g)
            if g.restart_at is not None and now_m >= g.restart_at:
                self._start_group(g)
        if self._lighthouse_restart_at is not None and now_m >= self._lighthouse_restart_at:
            self._restart_lighthouse(now_m)
        if self._finishing_since is None:
            self._inject_due()
        else:
            self._wind_down(now_m)

    def _done(self) -> bool:
        return self._finishing_since is not None and all(g.child is None for g in self._groups.values())

    def _progress(self, elapsed_s: float) -> Progress:
        running = sum(1 for g in self._groups.values() if g.child is not None and not g.child.stopped)
        return Progress(elapsed_s, self._job.step, self.scenario.steps, self._job.quorum_size, len(self._faults),
                        len(self.scenario.faults), running)

    # -- groups --------------------------------------------------------------------------------

    def _start_group(self, g: _Group) -> None:
        s = self.scenario
        g.incarnation += 1
        g.restart_at, g.resume_at, g.cause = None, None, None
        extra = {
            "REPLICAFT_LIGHTHOUSE": self._lighthouse_address,
            "REPLICAFT_REPLICA_ID": g.gid,
            "REPLICAFT_EVENTS_DIR": str(self.events_dir),
            "REPLICAFT_COLLECTIVE_TIMEOUT_S": str(s.collective_timeout_s),
        }
        # Fault points are armed in the first process only: a restarted group heals to the
        # job's step and could reach the same point@step again, dying in a loop.
        points = s.fault_points_for(g.gid) if g.incarnation == 1 else None
        if points:
            extra["REPLICAFT_FAULT_POINTS"] = points
        g.armed = points is not None
        args = [sys.executable, str(EXAMPLE), "--steps", str(s.steps), "--width", str(s.width),
                "--step-delay", str(s.step_delay_s)]
        log = self.logs_dir / f"{g.gid}-{g.incarnation}.log"
        g.child = Child(f"{g.gid}#{g.incarnation}", args, log_path=log, env=python_env(REPO_ROOT, extra), cwd=REPO_ROOT).start()
        if g.incarnation > 1:
            self._restarts[g.gid] += 1
            self._mark_resumed(g.gid)

    def _note_finished(self, g: _Group, now_m: float) -> None:
        """A process that reached the target step has finished training, whether or not it has exited yet.

        Exiting takes long after the ``stop`` event (3 s alone, 11 s with three groups on the
        loaded 2-core box: interpreter teardown), which is no part of what the harness measures.
        """
        if g.finished_at is None and g.child is not None and self._job.finished_training(g.child.pid, self.scenario.steps):
            g.finished_at = now_m
            self._begin_finishing(now_m)

    def _reap(self, g: _Group, now_m: float) -> None:
        if g.child is None:
            return
        code = g.child.poll()
        if code is None:
            return
        cause = g.cause
        if cause == "teardown" and code == 0:
            cause = None  # it exited by itself just as the grace period ran out
        if cause is None and g.armed and code == -signal.SIGKILL:
            cause = "fault_point"
            self._record_fault_point(g)
        if code == 0 and cause is None and g.finished_at is None:
            g.finished_at = now_m  # the script ended by itself: it trained what it was asked to
            self._begin_finishing(now_m)
        detail = g.child.output_tail() if cause is None and code != 0 else ""
        self._exits.append(ProcessExit(g.gid, time.time(), code, cause, self._job.step, detail))
        if detail:
            logger.error("%s crashed with exit code %d: %s", g.child.name, code, detail)
        name, g.child = g.child.name, None
        if g.finished_at is None and self._finishing_since is None:
            g.restart_at = now_m + self.scenario.restart_delay_s
            logger.info("%s exited (code %d, %s); restarting in %gs", name, code, cause or "no fault", self.scenario.restart_delay_s)

    def _resume(self, g: _Group) -> None:
        if g.child is not None:
            g.child.signal(signal.SIGCONT)
        g.resume_at = None
        self._mark_resumed(g.gid)

    def _begin_finishing(self, now_m: float) -> None:
        if self._finishing_since is None:
            logger.info("a group finished training at step %d; winding down", self._job.step)
            self._finishing_since = now_m
            self._lighthouse_restart_at = None

    def _wind_down(self, now_m: float) -> None:
        """End the processes that have nothing left to do for the finished job.

        A finished group gets ``TEARDOWN_GRACE_S`` to exit. An unfinished one that has not
        committed since it started, or is stopped, cannot rejoin a job that is over and is
        stopped at once; the others get ``hang_bound_s`` to finish their last steps.
        """
        assert self._finishing_since is not None
        grace_over = now_m - self._finishing_since > self.scenario.hang_bound_s
        for g in self._groups.values():
            g.restart_at = None
            if g.child is None or g.cause is not None:
                continue
            if g.finished_at is not None:
                if now_m - g.finished_at > TEARDOWN_GRACE_S:
                    logger.info("killing %s: still tearing down %.0fs after it finished", g.child.name, now_m - g.finished_at)
                    g.cause = "teardown"
                    g.child.kill()
                continue
            if g.child.stopped or g.child.pid not in self._job.committed_pids or grace_over:
                logger.info("stopping %s: the job finished without it", g.child.name)
                g.cause = "run_end"
                g.resume_at = None
                g.child.kill()
                self._stopped_at_end.append(g.gid)

    # -- the lighthouse ------------------------------------------------------------------------

    def _lighthouse_child(self) -> Child:
        s = self.scenario
        self._lighthouse_incarnation += 1
        args = [sys.executable, "-m", "lighthouse", "--port", str(self._lighthouse_port),
                "--heartbeat-timeout", str(s.heartbeat_timeout_s), "--progress-timeout", str(s.progress_timeout_s)]
        log = self.logs_dir / f"lighthouse-{self._lighthouse_incarnation}.log"
        return Child(f"lighthouse#{self._lighthouse_incarnation}", args, log_path=log,
                     env=python_env(REPO_ROOT, {}), cwd=REPO_ROOT)

    def _start_lighthouse(self) -> None:
        """Start the lighthouse, wait (bounded) for its address; restarts reuse the first port."""
        child = self._lighthouse_child().start()
        self._lighthouse = child
        match = child.wait_for_output(_GRPC_LINE, LIGHTHOUSE_START_TIMEOUT_S)
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
        self._mark_resumed(LIGHTHOUSE)

    def _reap_lighthouse(self, now_m: float) -> None:
        lh = self._lighthouse
        if lh is None or self._lighthouse_restart_at is not None or lh.poll() is None:
            return
        if LIGHTHOUSE not in self._awaiting_resume:
            self._exits.append(ProcessExit(LIGHTHOUSE, time.time(), lh.poll() or 0, None, self._job.step, lh.output_tail()))
            logger.error("the lighthouse died on its own: %s", lh.output_tail())
        if self._finishing_since is None:
            self._lighthouse_restart_at = now_m + self.scenario.restart_delay_s

    # -- faults --------------------------------------------------------------------------------

    def _inject_due(self) -> None:
        now = time.time()
        for i in list(self._pending):
            spec = self.scenario.faults[i]
            if spec.kind == "fault_point" or not is_due(spec, self._job.step, self._job.first_commit_ts, now):
                continue
            if spec.kind == "kill_lighthouse":
                if self._lighthouse is None or self._lighthouse.poll() is not None:
                    continue
                self._lighthouse.kill()
                self._record(spec, LIGHTHOUSE, i)
                continue
            assert spec.target is not None
            g = self._groups[spec.target]
            if g.child is None or g.child.stopped or g.cause is not None:
                continue  # wait until the target runs again
            if spec.kind == "sigstop":
                g.child.signal(signal.SIGSTOP)
                g.resume_at = time.monotonic() + spec.duration_s
            else:
                g.cause = spec.kind
                g.child.signal(signal.SIGKILL if spec.kind == "sigkill" else signal.SIGTERM)
            self._record(spec, spec.target, i)

    def _record(self, spec: FaultSpec, target: str, index: int) -> None:
        self._pending.remove(index)
        self._faults.append(InjectedFault(spec.kind, target, time.time(), label=spec.describe()))
        self._awaiting_resume[target] = len(self._faults) - 1
        logger.info("injected %s (job at step %d)", spec.describe(), self._job.step)

    def _record_fault_point(self, g: _Group) -> None:
        for i in self._pending:
            spec = self.scenario.faults[i]
            if spec.kind == "fault_point" and spec.target == g.gid:
                self._pending.remove(i)
                self._faults.append(InjectedFault("fault_point", g.gid, time.time(), label=spec.describe()))
                self._awaiting_resume[g.gid] = len(self._faults) - 1
                logger.info("fault point fired: %s", spec.describe())
                return

    def _mark_resumed(self, target: str) -> None:
        index = self._awaiting_resume.pop(target, None)
        if index is not None:
            self._faults[index] = dataclasses.replace(self._faults[index], resumed_ts=time.time())

    def _skipped_reasons(self) -> list[tuple[str, str]]:
        out = []
        for i in self._pending:
            spec = self.scenario.faults[i]
            if spec.kind == "fault_point":
                reason = f"{spec.target}'s first process never reached {spec.point} at step {spec.at_step}"
            else:
                reason = f"its condition or target was not ready before the job ended (job step {self._job.step})"
            out.append((spec.describe(), reason))
        return out

    # -- teardown ------------------------------------------------------------------------------

    def _stop_all(self) -> None:
        """SIGKILL every child still running (noting the groups among them)."""
        for g in self._groups.values():
            if g.child is not None and g.child.poll() is None:
                self._stopped_at_end.append(g.gid)
            if g.child is not None:
                g.child.kill()
        if self._lighthouse is not None:
            self._lighthouse.kill()
