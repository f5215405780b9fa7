"""Names inside a checkpoint directory. Pure: the one place that knows how names are spelled.

::

    DIR/step-000000400/                 published: complete, checksummed, never modified
        manifest.json                   files with sizes and SHA-256, metadata (see manifest.py)
        state.msgpack                   non-tensor state (msgpack skeleton) and the tensor list
        .metadata, __0_0.distcp, ...    torch.distributed.checkpoint (DCP) files
    DIR/step-000000500.tmp-3f9c.../     being written, or left by a crash: ignored by readers,
                                        removed by the next writer

Publishing is one ``rename`` from the temporary name to the final one, so a reader sees a
checkpoint either complete or not at all. Deleting renames into the temporary namespace first,
so a crash halfway through ``rmtree`` leaves ignorable garbage rather than a half-deleted
checkpoint that looks corrupt. Step numbers are zero-padded so names sort like steps.
"""

from __future__ import annotations

import re

MANIFEST_FILE = "manifest.json"
STATE_FILE = "state.msgpack"
DCP_METADATA_FILE = ".metadata"
STEP_DIGITS = 9

_PUBLISHED = re.compile(rf"step-(\d{{{STEP_DIGITS},}})")
_TMP = re.compile(r"step-\d+\.tmp-[0-9a-zA-Z_-]+")


def step_dirname(step: int) -> str:
    if step < 0:
        raise ValueError(f"checkpoint step {step} is negative; steps are >= 0")
    return f"step-{step:0{STEP_DIGITS}d}"


def tmp_dirname(step: int, token: str) -> str:
    """The temporary name a checkpoint of ``step`` is written (or deleted) under."""
    return f"{step_dirname(step)}.tmp-{token}"


def parse_step_dirname(name: str) -> int | None:
    """The step of a published checkpoint directory name, or None for any other name."""
    match = _PUBLISHED.fullmatch(name)
    return int(match.group(1)) if match else None


def is_tmp_dirname(name: str) -> bool:
    return _TMP.fullmatch(name) is not None


def dcp_key(name: str, own_rank: int | None) -> str:
    """The DCP key of state tensor ``name``: the name itself, or, for a tensor each rank of a
    sharded group holds its own value of (``own_rank``), the name and that rank."""
    return name if own_rank is None else f"{name}@rank{own_rank}"
