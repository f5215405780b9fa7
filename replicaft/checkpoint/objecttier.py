"""The object-store tier: every published checkpoint uploaded in the background, fetched back on a new machine.

Layout in the bucket mirrors the directory: ``<prefix>/<checkpoint name>/<file>``. A
checkpoint's ``manifest.json`` is uploaded *last*, after every other file of it (and its
chain) is there and verified, so a listing of manifests is a listing of complete
checkpoints, exactly as a rename publishes one on disk. Deletion goes the other way:
manifest first.

**Upload** runs on one background thread per writer (:class:`Uploader`), after the local
publish: training is never blocked on the store, and a save's result does not wait for it.
An increment's chain is uploaded first where the store lacks it. After an upload, retention
runs in the store with the writer's policy (retention.py: keep-last, milestones, best, ...,
and the chains they need). When the uploader
starts, every local checkpoint whose manifest is not in the store is queued again, oldest
first: that, and ObjectStore's multipart resumption, is what makes the tier resume after a
crash. Local retention keeps a checkpoint while its upload is queued or running
(:meth:`Uploader.pending_names`), so an upload slower than the saves delays deletions rather
than losing the checkpoint; one deleted locally anyway (by hand) is skipped with a warning.

**Fetch** (:func:`fetch_checkpoint`) brings a checkpoint and its chain into the local
directory the way a save publishes one: downloaded under a temporary name, every file
verified against the manifest, then renamed. A restore then loads it like any local one.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from replicaft.checkpoint.chainfiles import facts_of
from replicaft.checkpoint.durable import discard, new_token, publish, remove_partial, write_durably
from replicaft.checkpoint.entries import judge, read_small
from replicaft.checkpoint.layout import MANIFEST_FILE, parse_dirname, tmp_dirname
from replicaft.checkpoint.manifest import CheckpointManifest
from replicaft.checkpoint.objectstore import SHA256_META, ObjectStore
from replicaft.checkpoint.options import RetentionPolicy
from replicaft.checkpoint.reader import check, read_manifest, scan_checkpoints
from replicaft.checkpoint.retention import CheckpointFacts, decide_retention
from replicaft.errors import CheckpointCorrupt, ObjectStoreError
from replicaft.process.threads import lower_thread_priority

logger = logging.getLogger(__name__)

MAX_MANIFEST_BYTES = 64 * 1024 * 1024
UPLOADER_NICENESS = 19


@dataclass(frozen=True, slots=True)
class UploadResult:
    name: str
    step: int
    ok: bool
    reason: str
    num_bytes: int = 0
    """Bytes sent (files already in the store are not counted)."""
    seconds: float = 0.0


def stored_checkpoints(store: ObjectStore) -> list[str]:
    """Names of the complete checkpoints in the store (those whose manifest is there)."""
    found = []
    prefix = store.location.prefix + "/" if store.location.prefix else ""
    for key in store.list_keys(prefix):
        rest = key.removeprefix(prefix)
        name, _, file = rest.partition("/")
        if file == MANIFEST_FILE and (parsed := parse_dirname(name)) is not None:
            found.append(((parsed.step, parsed.lineage), name))
    return [name for _, name in sorted(found, reverse=True)]


def stored_manifest(store: ObjectStore, name: str) -> CheckpointManifest:
    where = f"{store.url}/{name}/{MANIFEST_FILE}"
    return CheckpointManifest.decode(
        store.get_bytes(store.location.key(name, MANIFEST_FILE), MAX_MANIFEST_BYTES), where
    )


def fetch_checkpoint(store: ObjectStore, name: str, directory: Path) -> Path:
    """Make checkpoint ``name`` and its chain present and intact in ``directory``, from the store.

    Copies already there and intact are kept. Raises CheckpointCorrupt when an object is
    missing or not what the manifest says, ObjectStoreError when the store fails.
    """
    final = directory / name
    if _intact(final):
        for required in read_manifest(final).requires:
            fetch_checkpoint(store, required, directory)
        return final
    if judge(final).kind != "missing":
        logger.warning("the local copy of %s is damaged; fetching it again from %s", name, store.url)
    raw = store.get_bytes(store.location.key(name, MANIFEST_FILE), MAX_MANIFEST_BYTES)
    manifest = CheckpointManifest.decode(raw, f"{store.url}/{name}/{MANIFEST_FILE}")
    for required in manifest.requires:
        fetch_checkpoint(store, required, directory)
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / tmp_dirname(name, new_token())
    tmp.mkdir()
    started = time.monotonic()
    try:
        for entry in manifest.files:
            store.download_file(
                store.location.key(name, entry.name), tmp / entry.name, num_bytes=entry.num_bytes, sha256=entry.sha256
            )
        write_durably(tmp / MANIFEST_FILE, raw)
        check(tmp, expected=parse_dirname(name))
        if judge(final).kind != "missing" and not _intact(final):
            discard(final, manifest.step)
        try:
            publish(tmp, final)
        except OSError:
            # Another process sharing the directory fetched and published it meanwhile
            # (every restarted group of a job resumes at once): theirs serves as well.
            if not _intact(final):
                raise
            remove_partial(tmp)
    except BaseException:
        remove_partial(tmp)
        raise
    logger.info(
        "fetched %s from %s (%d bytes in %.2fs)", name, store.url, manifest.num_bytes, time.monotonic() - started
    )
    return final


def _intact(path: Path) -> bool:
    """Checkpoint ``path`` is there and verifies (a missing one does not)."""
    try:
        check(path)
    except CheckpointCorrupt:
        return False
    return True


class Uploader:
    """Uploads published checkpoints of ``directory`` to ``store``, one at a time, in the background.

    Build anywhere; the thread starts with the first :meth:`submit` or :meth:`resume_pending`.
    Call its methods from one thread (the writer's); :meth:`pop_finished` from any.
    """

    def __init__(
        self, store: ObjectStore, directory: Path, *, retention: RetentionPolicy, writer_id: str = "-"
    ) -> None:
        self.store = store
        self.directory = directory
        self.retention = retention
        self.writer_id = writer_id
        self._queue: queue.Queue[Path | None] = queue.Queue()
        self._lock = threading.Lock()
        self._finished: list[UploadResult] = []
        self._pending: list[str] = []
        """Names of the checkpoints queued or being uploaded, in queue order."""
        self._idle = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._uploaded: set[str] = set()

    def submit(self, path: Path) -> None:
        """Queue published checkpoint ``path`` for upload; returns at once."""
        with self._lock:
            self._pending.append(path.name)
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="replicaft-upload", daemon=True)
            self._thread.start()
        self._queue.put(path)

    def resume_pending(self) -> int:
        """Queue every local checkpoint the store lacks, oldest first; return how many.

        Raises ObjectStoreError when the store cannot be listed.
        """
        stored = set(stored_checkpoints(self.store))
        missing = [path for name, path in reversed(scan_checkpoints(self.directory).found) if str(name) not in stored]
        for path in missing:
            self.submit(path)
        if missing:
            logger.info(
                "[%s] %d local checkpoint(s) not yet in %s queued for upload: %s",
                self.writer_id,
                len(missing),
                self.store.url,
                ", ".join(p.name for p in missing),
            )
        return len(missing)

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def pending_names(self) -> frozenset[str]:
        """The checkpoints queued or being uploaded: local retention keeps them (and their chains)."""
        with self._lock:
            return frozenset(self._pending)

    def pop_finished(self) -> list[UploadResult]:
        with self._lock:
            finished, self._finished = self._finished, []
        return finished

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until every queued upload has finished (True) or ``timeout_s`` passed (False)."""
        deadline = time.monotonic() + timeout_s
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def close(self, timeout_s: float) -> bool:
        """Let queued uploads finish for at most ``timeout_s``; True if they did. An upload
        cut short resumes with the next uploader (its parts stay on the server)."""
        finished = self.wait_idle(timeout_s)
        if self._thread is not None:
            self._queue.put(None)
            if finished:
                self._thread.join(timeout_s)
        return finished

    def _work(self) -> None:
        lower_thread_priority(UPLOADER_NICENESS, "the checkpoint uploader")
        while (path := self._queue.get()) is not None:
            started = time.monotonic()
            try:
                result = self._upload(path, started)
            except (ObjectStoreError, CheckpointCorrupt, OSError) as e:
                result = UploadResult(
                    path.name,
                    _step(path.name),
                    False,
                    f"uploading {path.name} to {self.store.url} failed: {e}; the local checkpoint is unaffected",
                    seconds=time.monotonic() - started,
                )
                logger.error("[%s] %s", self.writer_id, result.reason)
            except Exception as e:  # a bug here must not kill the thread and stop every later upload
                logger.exception("[%s] checkpoint uploader error", self.writer_id)
                result = UploadResult(path.name, _step(path.name), False, f"internal error: {type(e).__name__}: {e}")
            with self._idle:
                self._finished.append(result)
                self._pending.remove(path.name)
                self._idle.notify_all()

    def _upload(self, path: Path, started: float) -> UploadResult:
        name = path.name
        if judge(path).kind != "dir":
            reason = f"{name} was deleted locally (retention) before it could be uploaded; skipped"
            logger.warning("[%s] %s", self.writer_id, reason)
            return UploadResult(name, _step(name), False, reason)
        sent = self._upload_chain(path)
        reason = f"uploaded {name} to {self.store.url} ({sent} bytes sent in {time.monotonic() - started:.2f}s)"
        logger.info("[%s] %s", self.writer_id, reason)
        self._apply_retention(read_manifest(path).lineage)
        return UploadResult(name, _step(name), True, reason, sent, time.monotonic() - started)

    def _upload_chain(self, path: Path) -> int:
        """Upload checkpoint ``path`` after its chain; the bytes sent."""
        name = path.name
        key = self.store.location.key(name, MANIFEST_FILE)
        if name in self._uploaded or self.store.head(key) is not None:
            self._uploaded.add(name)
            return 0
        raw = read_small(path / MANIFEST_FILE, f"{name}/{MANIFEST_FILE}")
        manifest = CheckpointManifest.decode(raw, f"{name}/{MANIFEST_FILE}")
        sent = sum(self._upload_chain(path.parent / required) for required in manifest.requires)
        for entry in manifest.files:
            file_key = self.store.location.key(name, entry.name)
            found = self.store.head(file_key)
            if found is not None and found[0] == entry.num_bytes and found[1].get(SHA256_META) == entry.sha256:
                continue  # uploaded before a crash
            self.store.upload_file(path / entry.name, file_key, num_bytes=entry.num_bytes, sha256=entry.sha256)
            sent += entry.num_bytes
        self.store.put_bytes(key, raw, hashlib.sha256(raw).hexdigest())
        self._uploaded.add(name)
        return sent + len(raw)

    def _apply_retention(self, lineage: str) -> None:
        """Retention in the store, for this lineage; a failure is logged, never raised."""
        try:
            names = [
                n
                for n in stored_checkpoints(self.store)
                if (p := parse_dirname(n)) is not None and p.lineage == lineage
            ]
            facts = []
            for name in names:
                try:
                    facts.append(facts_of(_step(name), stored_manifest(self.store, name)))
                except CheckpointCorrupt:
                    facts.append(CheckpointFacts(_step(name)))
            by_step = {_step(n): n for n in names}
            decision = decide_retention(facts, self.retention)
            for step in decision.delete:
                self._delete(by_step[step])
            if decision.delete:
                logger.info("[%s] retention in %s: %s", self.writer_id, self.store.url, decision.reason)
        except ObjectStoreError as e:
            logger.warning("[%s] retention in %s failed: %s", self.writer_id, self.store.url, e)

    def _delete(self, name: str) -> None:
        keys = self.store.list_keys(self.store.location.key(name) + "/")
        manifest = self.store.location.key(name, MANIFEST_FILE)
        self.store.delete_keys([manifest])  # no longer a complete checkpoint, before its files go
        self.store.delete_keys([k for k in keys if k != manifest])
        self._uploaded.discard(name)


def _step(name: str) -> int:
    parsed = parse_dirname(name)
    return parsed.step if parsed is not None else -1
