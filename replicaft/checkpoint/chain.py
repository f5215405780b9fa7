"""Incremental saves: whether a save builds on its parent or starts a new chain. Pure.

An *increment* writes only the chunks (chunks.py) its parent's chain does not already hold
and refers to the rest where they are; a *base* writes every chunk. A chain is a base and
the increments after it, and it is only as good as its weakest link: a damaged chunk of a
base is damage to every increment that refers to it. So a new base is written

* every ``chain_length`` saves (a chain never holds more checkpoints than that, which bounds
  both what one damaged file can take with it and what a restore must read);
* when there is no usable parent: none in this lineage, or one whose files are not all
  there with their published sizes (a cheap ``stat`` of the chain, not a re-hash of it:
  damage inside a file is caught by the restore, which then falls back to an older,
  complete state), or one encrypted under another key (its chunk ids and ciphertext mean
  nothing under the new key).

``chain_length=1`` makes every save a base: incremental saves off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from replicaft.checkpoint.options import check_count

SaveKind = Literal["base", "increment"]


@dataclass(frozen=True, slots=True)
class Parent:
    """The newest published checkpoint of the saving lineage, as the writer found it."""

    name: str
    chain_position: int
    """1 for a base, 2 for the first increment after it, ..."""
    key_id: str | None
    intact: bool
    """Every file of its chain is there with the size its manifest lists."""
    why_not: str = ""
    """What is wrong with it when not intact."""


@dataclass(frozen=True, slots=True)
class ChainDecision:
    kind: SaveKind
    parent: str | None
    """The checkpoint whose chunks the save may reuse (None for a base)."""
    chain_position: int
    reason: str


def decide_chain(parent: Parent | None, *, chain_length: int, key_id: str | None) -> ChainDecision:
    """Base or increment, for a save whose newest same-lineage predecessor is ``parent``."""
    check_count("chain_length", chain_length, minimum=1, fix="; 1 makes every save a full base")
    if chain_length == 1:
        return ChainDecision("base", None, 1, "incremental saves are off (chain_length=1)")
    if parent is None:
        return ChainDecision("base", None, 1, "no earlier checkpoint of this lineage to build on")
    if not parent.intact:
        return ChainDecision("base", None, 1, f"{parent.name} cannot be built on: {parent.why_not}")
    if parent.key_id != key_id:
        return ChainDecision(
            "base",
            None,
            1,
            f"{parent.name} was encrypted under key {parent.key_id or 'none'}, this save under {key_id or 'none'}",
        )
    if parent.chain_position >= chain_length:
        return ChainDecision(
            "base", None, 1, f"{parent.name} ends a chain of {parent.chain_position} (chain_length={chain_length})"
        )
    position = parent.chain_position + 1
    return ChainDecision("increment", parent.name, position, f"increment {position} of {chain_length} on {parent.name}")
