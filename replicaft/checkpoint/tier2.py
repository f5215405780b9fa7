"""The tier-2 copy: a published checkpoint copied to a second, more durable directory.

Tier 1 is typically fast local or node-shared storage that dies with the job's machines;
tier 2 (a network or object-store mount) survives them. The copy uses the same discipline as
a save: write under a temporary name, fsync, verify the copy byte for byte against the
manifest, then rename and fsync the parent. A copy interrupted at any point leaves tier 2's
previous checkpoints untouched.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from replicaft.checkpoint.durable import discard, new_token, publish, remove_partial
from replicaft.checkpoint.entries import judge
from replicaft.checkpoint.layout import MANIFEST_FILE, parse_dirname, tmp_dirname
from replicaft.checkpoint.manifest import CheckpointManifest
from replicaft.checkpoint.reader import check, read_manifest, verify

logger = logging.getLogger(__name__)


def copy_verified(source: Path, tier2_directory: Path, manifest: CheckpointManifest) -> Path:
    """Copy published checkpoint ``source`` into ``tier2_directory``; return the copy's path.

    Blocks for the whole copy (call it from a background thread). An intact copy already in
    tier 2 is kept; a damaged one is replaced. An increment's chain is copied first where
    tier 2 lacks it (normally it is there already: it was copied when it was published).
    Raises OSError or CheckpointCorrupt (the copy did not verify) after removing the
    partial copy.
    """
    tier2_directory.mkdir(parents=True, exist_ok=True)
    for name in manifest.requires:
        if judge(tier2_directory / name).kind == "missing":
            copy_verified(source.parent / name, tier2_directory, read_manifest(source.parent / name))
    final = tier2_directory / source.name
    if judge(final).kind != "missing":
        ok, reason = verify(final)
        if ok:
            return final
        logger.warning("tier-2 copy %s is damaged (%s); replacing it", final, reason)
        discard(final, manifest.step)
    tmp = tier2_directory / tmp_dirname(source.name, new_token())
    tmp.mkdir()
    try:
        for name in [f.name for f in manifest.files] + [MANIFEST_FILE]:
            shutil.copyfile(source / name, tmp / name)
            with open(tmp / name, "rb") as f:
                os.fsync(f.fileno())
        check(tmp, expected=parse_dirname(source.name))
        publish(tmp, final)
    except BaseException:
        remove_partial(tmp)
        raise
    return final
