"""The encryption key of checkpoints at rest: where it comes from and what it is called.

A checkpoint is encrypted with AES-256-GCM (chunks.py) under a 32-byte key that the
operator keeps *away from the data*: in a file (``REPLICAFT_CHECKPOINT_KEY_FILE``, typically
a secret mounted by the orchestrator) or a variable (``REPLICAFT_CHECKPOINT_KEY``), as 64 hex
digits or base64. It is never written anywhere by replicaft, and a key file inside a
checkpoint directory or tier is refused: whoever can read the checkpoints could read it.

Each key has a *key id*, a keyed digest of the key itself, stored in every manifest. So a
reader holding another key (or none) says so before reading a byte of data, and that is a
:class:`CheckpointKeyError`, never mistaken for corruption: falling back to an older
checkpoint would need the same key, and silently losing the newest state to a typo in a
secret is the outcome to avoid.

Three keys are derived from the one given (HMAC-SHA-256 with distinct labels), so no key
serves two purposes: the AES key, the key that names chunks (chunk ids are keyed digests
when encrypting, so a chunk's name does not reveal whether it holds a guessable value such
as a zero-initialised tensor), and the key id.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from replicaft.checkpoint.entries import read_small
from replicaft.errors import CheckpointCorrupt, OptionsError

KEY_BYTES = 32
KEY_ENV = "REPLICAFT_CHECKPOINT_KEY"
KEY_FILE_ENV = "REPLICAFT_CHECKPOINT_KEY_FILE"
MAX_KEY_FILE_BYTES = 4096
"""A key is 64 hex digits or 44 base64 characters; a bigger file is not a key."""
KEY_FILE_RULE = "give a file that holds the key (64 hex digits or base64)"


@dataclass(frozen=True, slots=True)
class EncryptionKey:
    aes_key: bytes = field(repr=False)
    chunk_id_key: bytes = field(repr=False)
    key_id: str
    """16 hex digits naming the key (not secret); stored in every manifest it encrypted."""

    @classmethod
    def from_bytes(cls, raw: bytes) -> EncryptionKey:
        if len(raw) != KEY_BYTES:
            raise OptionsError(f"a checkpoint key is {KEY_BYTES} bytes (AES-256); this one is {len(raw)}")

        def derive(label: bytes) -> bytes:
            return hmac.new(raw, b"replicaft checkpoint " + label, hashlib.sha256).digest()

        return cls(derive(b"aes-256-gcm"), derive(b"chunk id"), derive(b"key id").hex()[:16])


def parse_key(text: str | bytes, where: str) -> EncryptionKey:
    """A key from 64 hex digits, base64 of 32 bytes, or (a file's) 32 raw bytes."""
    raw = text.encode() if isinstance(text, str) else text
    if len(raw) == KEY_BYTES and raw.strip() == raw and not raw.isascii():
        return EncryptionKey.from_bytes(raw)
    stripped = raw.strip()
    try:
        if len(stripped) == 2 * KEY_BYTES:
            return EncryptionKey.from_bytes(bytes.fromhex(stripped.decode("ascii")))
        decoded = base64.b64decode(stripped, validate=True)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        decoded = b""
    if len(decoded) == KEY_BYTES:
        return EncryptionKey.from_bytes(decoded)
    if len(raw) == KEY_BYTES:
        return EncryptionKey.from_bytes(raw)
    raise OptionsError(
        f"{where} is not a checkpoint key: give {KEY_BYTES} random bytes as 64 hex digits or base64 "
        "(e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`)"
    )


def load_key(
    *,
    key_file: str | os.PathLike[str] | None = None,
    key: str | None = None,
    data_directories: tuple[str | os.PathLike[str] | None, ...] = (),
) -> EncryptionKey | None:
    """The checkpoint key from ``key_file`` or ``key`` (its text); None when neither is given.

    Raises OptionsError for a key that does not parse, an unreadable file, both given, or a
    key file inside one of ``data_directories`` (the checkpoint directory, tier 2).
    """
    if key_file is not None and key:
        raise OptionsError(f"both a checkpoint key file ({KEY_FILE_ENV}) and a key ({KEY_ENV}) are given; keep one")
    if key_file is None:
        return parse_key(key, KEY_ENV) if key else None
    path = Path(key_file).resolve()
    for directory in data_directories:
        if directory is not None and path.is_relative_to(Path(directory).resolve()):
            raise OptionsError(
                f"the checkpoint key file {key_file} is inside the checkpoint directory {directory}; anyone "
                "who can read the checkpoints could read the key. Keep it elsewhere (a mounted secret)"
            )
    try:
        # Never a plain read: a FIFO or a device given as the key file would block the start forever.
        data = read_small(
            path, f"the checkpoint key file {key_file}", MAX_KEY_FILE_BYTES, follow_links=True, rule=KEY_FILE_RULE
        )
    except CheckpointCorrupt as e:
        raise OptionsError(str(e)) from e
    return parse_key(data, f"the checkpoint key file {key_file}")


def key_from_env(
    environ: Mapping[str, str], *, data_directories: tuple[str | os.PathLike[str] | None, ...] = ()
) -> EncryptionKey | None:
    """:func:`load_key` from ``REPLICAFT_CHECKPOINT_KEY_FILE`` / ``REPLICAFT_CHECKPOINT_KEY``
    (for command-line entry points; the manager gets both through its options)."""
    return load_key(
        key_file=environ.get(KEY_FILE_ENV) or None, key=environ.get(KEY_ENV) or None, data_directories=data_directories
    )
