"""Names inside a checkpoint directory. Pure: the one place that knows how names are spelled.

::

    DIR/step-000000400-3f9c2a1b7e55/    published: complete, checksummed, never modified
        manifest.json                   files with sizes and SHA-256, lineage, chain, codec (manifest.py)
        state.msgpack                   non-tensor state (msgpack skeleton) and the tensor list
        tensors.msgpack                 where every tensor's chunks are (index.py)
        pack-0.bin, pack-1.bin, ...     the chunks each rank wrote (storage.py); an increment's
                                        packs hold only what changed since its parent
    DIR/step-000000500-3f9c2a1b7e55.tmp-3f9c.../
                                        being written, or left by a crash: ignored by readers,
                                        removed by the next writer
    DIR/step-000000300-3f9c2a1b7e55/    format version 2 (the previous release; version 1 the same
        .metadata, __0_0.distcp, ...    without the lineage, DIR/step-000000300/): DCP's own
                                        files, read with a restricted unpickler (legacy.py)

A published name carries the step and the *lineage*: the history of training the state
belongs to (a run that resumes from a checkpoint continues its lineage; one that starts
from nothing begins a new one). Two histories in one directory (a run restarted from
step 0 beside the checkpoints of an earlier one) then never share a name, so a writer never
mistakes another history's checkpoint of the same step for its own save.

Publishing is one ``rename`` from the temporary name to the final one, so a reader sees a
checkpoint either complete or not at all. Deleting renames into the temporary namespace first,
so a crash halfway through ``rmtree`` leaves ignorable garbage rather than a half-deleted
checkpoint that looks corrupt. Step numbers are zero-padded so names sort like steps.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass

MANIFEST_FILE = "manifest.json"
STATE_FILE = "state.msgpack"
DCP_METADATA_FILE = ".metadata"
TENSORS_FILE = "tensors.msgpack"
_PACK = re.compile(r"pack-(\d{1,7})\.bin")
STEP_DIGITS = 9
LINEAGE_CHARS = 12
LEGACY_LINEAGE = ""
"""The lineage of a checkpoint written before lineages existed (format version 1)."""

_LINEAGE = re.compile(rf"[0-9a-f]{{{LINEAGE_CHARS}}}")
MAX_STEP_DIGITS = 19
"""Steps are below 2**63. A name with more digits is not one we wrote, and ``int()`` of one
over 4300 digits raises ValueError, not the None this parser promises (issue 19)."""
_PUBLISHED = re.compile(rf"step-([0-9]{{{STEP_DIGITS},{MAX_STEP_DIGITS}}})(?:-([0-9a-f]{{{LINEAGE_CHARS}}}))?")
_TMP = re.compile(rf"step-\d+(?:-[0-9a-f]{{{LINEAGE_CHARS}}})?\.tmp-[0-9a-zA-Z_-]+")


@dataclass(frozen=True, slots=True, order=True)
class CheckpointName:
    step: int
    lineage: str
    """``LINEAGE_CHARS`` hex digits, or ``LEGACY_LINEAGE`` for a version-1 checkpoint."""

    def __str__(self) -> str:
        return checkpoint_dirname(self.step, self.lineage)


def new_lineage() -> str:
    """A fresh lineage id, for a history that starts from nothing."""
    return uuid.uuid4().hex[:LINEAGE_CHARS]


def forked_lineage(parent: str, step: int, occasion: str) -> str:
    """The lineage a run continues as after resuming ``parent`` at ``step`` where newer
    checkpoints of ``parent`` did not load. Derived, not drawn: every group that resumes the
    same checkpoint on the same ``occasion`` (the first quorum they resume in, which the
    lighthouse never repeats) forks to the same lineage without talking about it, so whichever
    group writes next names one history."""
    digest = hashlib.blake2b(f"{parent}/{step}/{occasion}".encode(), digest_size=16).hexdigest()
    return digest[:LINEAGE_CHARS]


def is_lineage(value: object) -> bool:
    return isinstance(value, str) and (value == LEGACY_LINEAGE or _LINEAGE.fullmatch(value) is not None)


def lineage_label(lineage: str) -> str:
    """How a lineage is named in messages."""
    return lineage if lineage != LEGACY_LINEAGE else "(before lineages)"


def step_dirname(step: int) -> str:
    """``step-000000400``: the step part of a checkpoint's name (a version-1 name in full)."""
    if step < 0:
        raise ValueError(f"checkpoint step {step} is negative; steps are >= 0")
    return f"step-{step:0{STEP_DIGITS}d}"


def checkpoint_dirname(step: int, lineage: str) -> str:
    """The published name of the checkpoint of ``step`` in history ``lineage``."""
    if not is_lineage(lineage):
        raise ValueError(f"lineage {lineage!r} is not {LINEAGE_CHARS} lowercase hex digits")
    return step_dirname(step) if lineage == LEGACY_LINEAGE else f"{step_dirname(step)}-{lineage}"


def tmp_dirname(final_name: str, token: str) -> str:
    """The temporary name the checkpoint ``final_name`` is written (or deleted) under."""
    return f"{final_name}.tmp-{token}"


def parse_dirname(name: str) -> CheckpointName | None:
    """Step and lineage of a published checkpoint directory name, or None for any other name."""
    match = _PUBLISHED.fullmatch(name)
    if match is None:
        return None
    return CheckpointName(int(match.group(1)), match.group(2) or LEGACY_LINEAGE)


def is_tmp_dirname(name: str) -> bool:
    return _TMP.fullmatch(name) is not None


def pack_name(rank: int) -> str:
    """The file a rank appends the chunks it writes to (storage.py)."""
    return f"pack-{rank}.bin"


def is_pack_name(name: str) -> bool:
    return _PACK.fullmatch(name) is not None


def dcp_key(name: str, own_rank: int | None) -> str:
    """The DCP key of state tensor ``name``: the name itself, or, for a tensor each rank of a
    sharded group holds its own value of (``own_rank``), the name and that rank."""
    return name if own_rank is None else f"{name}@rank{own_rank}"
