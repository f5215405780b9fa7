"""The manager's persistent-checkpoint duties: save rarely, resume only when no peer can donate.

* **Who writes**: the group at replica rank 0 of the quorum that committed the step, every
  ``checkpoint_interval_steps`` / ``checkpoint_interval_s``, asynchronously from a host
  snapshot (replicaft.checkpoint). A save due while one runs is skipped and counted.
* **Startup rule**: a starting group joins the quorum first. If any participant is ahead it
  heals from peers and reads nothing from disk. Only if the first quorum it joins is entirely
  at step 0 (every group died, or the job is new) does it load the newest *valid* checkpoint;
  that first step is then not committed, so every group enters the next quorum at the loaded
  step (groups that loaded an older checkpoint heal from the ones ahead). Whether a checkpoint
  exists is a question the object store may fail to answer: then the group does not train,
  asks again at each quorum, and stops after ``checkpoint_store_wait_s`` (resume_question.py).
* **Lineage**: the history the state belongs to (lineage.py). It is training state:
  :meth:`Persistence.state_dict` / :meth:`Persistence.load_state_dict` are registered with the
  manager under ``STATE_NAME``, so a heal hands it over with the rest.
* **Preemption**: SIGTERM is noted by a handler, carried in the rank's vote on the current
  step, and acted on at the step boundary after it, where the state is consistent: a vote
  tells every rank of the group that one of them is leaving, so all ranks of a W > 1 group
  stop after the same step even when the signal reached them on either side of a boundary.
  The writer group saves at once (bounded by ``preemption_grace_s``) and the process exits
  with status 143; other groups just leave. A preemption notice (``preemption_notice``,
  preemption.py) raises the same flag, naming its source, before any SIGTERM: same path
  (departure.py holds the flag, the handler and the notice's watcher).

W > 1: DCP then needs a process group spanning the group's ranks, taken from the default
process group the script initialised inside its group (FSDP/HSDP scripts do); each rank
writes its own shards (sharded state reaches DCP as DTensors, see replicaft.state.flat), and a
checkpoint loads into another W through DCP's resharding. Every rank must save the same
steps without talking about it: time-based intervals are refused (open_checkpoints.py), and a
save due while the previous one is still being written waits for it rather than being skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from replicaft.checkpoint.cadence import CadenceLimits
from replicaft.checkpoint.labels import CheckpointLabels
from replicaft.checkpoint.results import SaveResult
from replicaft.checkpoint.telemetry import CheckpointTelemetry
from replicaft.config.options import ManagerOptions
from replicaft.persistence.cadence import AutoCadence
from replicaft.persistence.departure import Departure
from replicaft.persistence.lineage import Lineage
from replicaft.persistence.open_checkpoints import SAVE_TIMEOUT_S, open_checkpoints
from replicaft.persistence.preemption import PreemptionFlag
from replicaft.persistence.resume_question import ResumeQuestion
from replicaft.persistence.save_events import report_save, report_upload
from replicaft.state.content import BufferHashes
from replicaft.state.flat import flatten
from replicaft.transfer.capture import BackgroundCapture
from replicaft.transfer.snapshot import Snapshot
from replicaft.transfer.spare import SpareBuffer

if TYPE_CHECKING:
    from replicaft.checkpoint import CheckpointReader, CheckpointWriter, LoadedCheckpoint
    from replicaft.checkpoint.catalog import Catalog
    from replicaft.checkpoint.tiers import Survey

logger = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 143
STATE_NAME = "checkpoint"
"""Name under which the manager registers :meth:`Persistence.state_dict` (the lineage)."""


class Persistence:
    def __init__(self, options: ManagerOptions, emit: Callable[..., None], spare: SpareBuffer) -> None:
        self.options = options
        self._emit = emit
        self._spare = spare
        """Shared with the donor's live snapshots (snapshot.py)."""
        self._writer: CheckpointWriter | None = None
        self._reader: CheckpointReader | None = None
        self.departure = Departure(options, emit)
        """SIGTERM or a preemption notice: leave at the next step boundary (departure.py)."""
        self._in_flight: Snapshot | None = None
        self._capture: BackgroundCapture | None = None
        self._copy_now: frozenset[str] = frozenset()
        """Tensors a background copy saw written mid-step: copied at once from then on."""
        self._lineage = Lineage(options.replica_id, has_checkpoints=options.checkpoint_dir is not None)
        """The history this group's state belongs to (lineage.py)."""
        self.cadence = (
            AutoCadence(
                CadenceLimits(
                    options.checkpoint_interval_min_s,
                    options.checkpoint_interval_max_s,
                    options.checkpoint_mtbf_prior_s,
                ),
                emit,
            )
            if options.checkpoint_interval == "auto" and options.checkpoint_dir is not None
            else None
        )
        """``checkpoint_interval="auto"``: chooses the writer's interval (cadence.py)."""
        self._blocked_s: dict[int, float] = {}
        """Seconds the training thread spent on each periodic save in flight, by step."""
        self.labels = CheckpointLabels()
        """Tags and metrics for the next checkpoint (``Manager.checkpoint_tags``/``report_metrics``)."""
        self._capture_labels: dict[str, Any] = {}
        """The labels taken for the save whose background copy is running (see :meth:`settle`)."""
        self.telemetry = CheckpointTelemetry(
            options.checkpoint_dir, has_object_tier=bool(options.checkpoint_object_store)
        )
        """Each save's figures and anomalies (``checkpoint``/``checkpoint_anomaly`` events)."""
        self._question: ResumeQuestion | None = None
        self._survey: Survey | None = None
        """The answer of the start-up question, which :meth:`load_latest` loads from."""
        self.on_resumed: Callable[[int], None] | None = None
        """Told the checkpoint step after :meth:`load_latest` loaded one, before its state is
        applied (the manager's resume verification, resume_check.py)."""

    @property
    def enabled(self) -> bool:
        return self.options.checkpoint_dir is not None

    def start(self) -> None:
        self.departure.start()
        if self.options.checkpoint_dir is None:
            return
        self._reader, self._writer = open_checkpoints(self.options)
        if self._writer.catalog is not None:
            self._check_catalog(self._writer.catalog)

    def _check_catalog(self, catalog: Catalog) -> None:
        """A missing or unreadable catalog is rebuilt, with a warning event; it never stops a start."""
        try:
            problem = catalog.ensure()
        except Exception as e:  # the catalog is a cache: nothing about it may stop training
            problem = f"{catalog.path} could not be rebuilt ({type(e).__name__}: {e}); saves go on without it"
        if problem is not None:
            logger.warning("[%s] checkpoint catalog: %s", self.options.replica_id, problem)
            self._emit("catalog_rebuilt", reason=problem)

    def close(self) -> None:
        self.departure.stop_watching()
        self.settle()
        if self._writer is not None:
            self._writer.close(timeout_s=self.options.preemption_grace_s)
            self._report()
        self.departure.restore()

    @property
    def preempted(self) -> PreemptionFlag:
        """Raised by SIGTERM or a preemption notice; the step carries it in the rank's vote."""
        return self.departure.preempted

    @property
    def preemption_reason(self) -> str:
        return self.departure.reason

    def preempt(self, reason: str) -> None:
        """Any thread: leave at the next step boundary, as after SIGTERM (the module docstring).
        The first reason stays."""
        self.departure.preempt(reason)

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint part of the training state, which heals carry: the lineage."""
        return self._lineage.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Adopt the lineage of a donor's state (a heal) or of a loaded checkpoint."""
        self._lineage.load_state_dict(state)

    @property
    def lineage(self) -> str:
        return self._lineage.current

    def ask_resume(self) -> bool | None:
        """At the first quorum, all at step 0: is there a checkpoint to resume from, in any tier?
        None: the object store cannot be asked yet (the step must not commit; ask again at the
        next quorum). Raises CheckpointStoreUnavailable once it has not answered for
        ``checkpoint_store_wait_s`` (resume_question.py). Validity is checked when loading."""
        if self._reader is None:
            return False
        if self._question is None:
            store = self._reader.object_store
            self._question = ResumeQuestion(
                self._reader.survey,
                where=store.where if store is not None else "the checkpoint directories",
                wait_s=self.options.checkpoint_store_wait_s,
                per_quorum_s=self.options.collective_timeout_s / 2,
                emit=self._emit,
            )
        self._survey = self._question.answer()
        return None if self._survey is None else bool(self._survey.candidates)

    def load_latest(self, template: dict[str, Any], occasion: str) -> LoadedCheckpoint | None:
        """Load the newest valid checkpoint into ``template``; the state returned carries the
        lineage this run continues (under ``STATE_NAME`` when the template has it). ``occasion``
        names this resume the same way on every group that resumes with it (their first quorum):
        a forked lineage is derived from it (layout.py, ``forked_lineage``)."""
        assert self._reader is not None
        survey, self._survey = self._survey, None
        loaded = self._reader.load_latest_valid(template, rank=self.options.group_rank, survey=survey)
        if loaded is None:
            return None
        self._lineage.resumed(loaded, occasion)
        if STATE_NAME in template:
            loaded.state[STATE_NAME] = self.state_dict()
        if self.on_resumed is not None:
            self.on_resumed(loaded.step)
        if loaded.imported:
            kept = sorted(set(template) - set(loaded.state))
            logger.warning(
                "[%s] %s was imported (replicaft-ckpt import) and holds %s; keeping this job's own %s",
                self.options.replica_id,
                loaded.path.name,
                sorted(loaded.state),
                kept,
            )
            loaded.state.update({name: template[name] for name in kept})
        return loaded

    def after_commit(
        self, step: int, is_writer: bool, state: Callable[[], dict[str, Any]], quorum_id: int, num_groups: int = 1
    ) -> None:
        """Called at the step boundary after a commit, with the committed state in place.

        A due save copies the state to a host snapshot, reusing the previous save's buffer once
        that save has finished (a fresh buffer's page faults cost about as much as the copy).
        With W = 1 the copy runs on a thread through the next step's forward and backward
        (:class:`BackgroundCapture`); :meth:`settle` must run before the state is written
        again. With W > 1 it is taken here, at once: every rank of the group must hand the
        writer the same steps, and a background copy can be refused on one rank alone.
        ``num_groups``: the groups of the quorum that committed the step (for ``cadence``).
        """
        if self.cadence is not None:
            self.cadence.observe(num_groups)
            if self._writer is not None and is_writer:
                self._writer.interval_s = self.cadence.interval_s()
        if self._writer is not None and is_writer and self._writer.decide(step).save:
            started = time.monotonic()
            spare, content = self._spare.take_with_content()
            deferred = 0
            if self.options.group_world_size > 1:
                self._in_flight = self._snapshot(state, step, quorum_id, spare, content)
                self._writer.save_async(self._in_flight, step, self.labels.take(), lineage=self.lineage)
                host_bytes = self._in_flight.buffer.numel()
            else:
                self._capture_labels = self.labels.take()
                self._capture = BackgroundCapture(
                    flatten(state()),
                    step=step,
                    quorum_id=quorum_id,
                    replica_id=self.options.replica_id,
                    out=spare,
                    copy_now=self._copy_now,
                    content=content,
                )
                deferred = self._capture.deferred_bytes
                host_bytes = self._capture.buffer.numel()
            self._blocked_s[step] = time.monotonic() - started
            self.telemetry.started(step, host_bytes)
            self._emit("checkpoint_start", checkpoint_step=step, background_copy_bytes=deferred, host_bytes=host_bytes)
        self._report()

    def settle(self) -> None:
        """Before anything writes the state: finish a background copy and queue its save."""
        capture, self._capture = self._capture, None
        if capture is None or self._writer is None:
            return
        started = time.monotonic()
        snapshot, why = capture.finish(timeout_s=SAVE_TIMEOUT_S)
        self._blocked_s[capture.step] = self._blocked_s.get(capture.step, 0.0) + time.monotonic() - started
        if snapshot is None:
            self._copy_now |= capture.changed
            if not capture.running:  # a copy still running would write into a reused buffer
                self._spare.give(capture.buffer)
            logger.warning(
                "[%s] checkpoint not saved: %s; those tensors are copied at once from now on",
                self.options.replica_id,
                why,
            )
            figures, _ = self.telemetry.finished(
                SaveResult(capture.step, "failed", why), self._blocked_s.pop(capture.step, None)
            )
            self._emit(
                "checkpoint",
                checkpoint_step=capture.step,
                ok=False,
                status="failed",
                reason=why,
                path=None,
                num_bytes=0,
                **figures,
            )
            return
        self._in_flight = snapshot
        self._writer.save_async(snapshot, snapshot.manifest.step, self._capture_labels, lineage=self.lineage)

    def emergency_save(self, step: int, state: Callable[[], dict[str, Any]], quorum_id: int) -> None:
        self.settle()
        if self._writer is None:
            return
        handle = self._writer.save_async(
            self._snapshot(state, step, quorum_id, None),
            step,
            {"reason": "preemption", **self.labels.take()},
            lineage=self.lineage,
        )
        deadline = time.monotonic() + self.options.preemption_grace_s
        try:
            handle.wait(timeout_s=self.options.preemption_grace_s)
        except TimeoutError as e:
            logger.error("preemption save: %s", e)
        # A preempted machine takes its disk with it: what is not in the object store is lost.
        uploader = self._writer.uploader
        if uploader is not None and not uploader.wait_idle(max(0.0, deadline - time.monotonic())):
            logger.error(
                "[%s] preemption: the upload of the emergency checkpoint to %s did not finish within "
                "preemption_grace_s=%g; the next writer resumes it if this disk survives",
                self.options.replica_id,
                uploader.store.url,
                self.options.preemption_grace_s,
            )
        self._report()

    def _snapshot(
        self,
        state: Callable[[], dict[str, Any]],
        step: int,
        quorum_id: int,
        out: torch.Tensor | None,
        content: BufferHashes | None = None,
    ) -> Snapshot:
        """A synchronous host copy of the state (no checksums: the writer checksums its files)."""
        return Snapshot.capture(
            flatten(state()),
            step=step,
            quorum_id=quorum_id,
            replica_id=self.options.replica_id,
            with_checksums=False,
            out=out,
            content=content,
        )

    def _report(self) -> None:
        if self._writer is None:
            return
        finished = self._writer.pop_finished()
        if finished and self._in_flight is not None and self._writer.statistics().num_pending == 0:
            self._spare.give(self._in_flight.buffer, self._in_flight.content)
            self._in_flight = None
        for r in finished:
            blocked_s = self._blocked_s.pop(r.step, None)
            if self.cadence is not None and r.ok and blocked_s is not None:
                self.cadence.save_measured(blocked_s, r.seconds)
            report_save(r, blocked_s, self.telemetry, self._emit, self.options.replica_id)
        for u in self._writer.uploader.pop_finished() if self._writer.uploader is not None else ():
            report_upload(u, self._writer.catalog, self.telemetry, self._emit)
