"""How the ranks of a W > 1 writing group agree on one save: group rank 0 decides, the others follow.

Only group rank 0 touches the checkpoint directory's names (it checks space, creates the
temporary directory and publishes), yet every rank runs ``dcp.save`` into that directory and
must report the same :class:`SaveResult`. So rank 0 broadcasts two messages per save: its
go/no-go before ``dcp.save`` (:class:`Prepared`) and its result after. With ``process_group``
None (W == 1) there is nobody to tell and the value is returned as it is.

A sharded group sizes an increment together before the go/no-go: rank 0 broadcasts the
parent it chose (:func:`agree_parent`), each rank counts the new chunks of its own shards
against that parent, and one all-reduce (:func:`agree_total`) gives rank 0 their sum to check
free space against. Like the broadcasts, it waits as long as the group's timeout allows.

The messages travel as msgpack bytes in two broadcasts (the length, then the bytes).
Rejected alternative: ``dist.broadcast_object_list``, which pickles, and nothing read by a
checkpoint's writer or reader runs pickle.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import torch
import torch.distributed as dist

from replicaft.checkpoint.results import SaveResult


@dataclass(frozen=True, slots=True)
class Prepared:
    """Rank 0's go/no-go for one save, broadcast to the other ranks of the group."""

    tmp: Path | None
    refusal: SaveResult | None
    parent: str | None = None
    """The checkpoint whose chunks this save may reuse (chain.py); None for a base."""
    chain_position: int = 1
    name: str = ""
    """The checkpoint's final name (rank 0's lineage), which every rank's chunk references carry."""


def agree_prepared(process_group: dist.ProcessGroup | None, prepared: Prepared | None) -> Prepared:
    """Group rank 0's go/no-go on every rank (rank 0 passes it, the others None).

    A collective: every rank of ``process_group`` calls it for the same save, and it blocks
    until rank 0's value has arrived.
    """
    if process_group is None:
        assert prepared is not None
        return prepared
    wire = None
    if prepared is not None:
        refusal = prepared.refusal.to_wire() if prepared.refusal is not None else None
        wire = {"tmp": str(prepared.tmp) if prepared.tmp is not None else None, "refusal": refusal}
        wire["parent"], wire["chain_position"], wire["name"] = prepared.parent, prepared.chain_position, prepared.name
    d = _broadcast_from_rank0(process_group, wire)
    return Prepared(
        Path(d["tmp"]) if d["tmp"] is not None else None,
        SaveResult.from_wire(d["refusal"]) if d["refusal"] is not None else None,
        d["parent"],
        d["chain_position"],
        d["name"],
    )


def agree_result(process_group: dist.ProcessGroup | None, result: SaveResult | None) -> SaveResult:
    """Group rank 0's result on every rank (rank 0 passes it, the others None); a collective."""
    if process_group is None:
        assert result is not None
        return result
    return SaveResult.from_wire(_broadcast_from_rank0(process_group, result.to_wire() if result is not None else None))


def agree_parent(process_group: dist.ProcessGroup, parent: str | None) -> str | None:
    """Group rank 0's ``parent`` (chain.py; None for a base) on every rank; the others' is ignored. A collective."""
    leader = dist.get_rank(process_group) == 0
    return _broadcast_from_rank0(process_group, {"parent": parent} if leader else None)["parent"]


def agree_total(process_group: dist.ProcessGroup, num_bytes: int) -> int:
    """The sum of every rank's ``num_bytes`` in the group, on every rank: one int64 all-reduce."""
    total = torch.tensor([num_bytes], dtype=torch.int64)
    dist.all_reduce(total, op=dist.ReduceOp.SUM, group=process_group)
    return int(total.item())


def _broadcast_from_rank0(process_group: dist.ProcessGroup, value: dict[str, Any] | None) -> dict[str, Any]:
    """Broadcast rank 0's ``value`` in the group as msgpack bytes (never pickle)."""
    src = dist.get_global_rank(process_group, 0)
    payload = msgpack.packb(value, use_bin_type=True) if value is not None else b""
    size = torch.tensor([len(payload)], dtype=torch.int64)
    dist.broadcast(size, src=src, group=process_group)
    data = (
        torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        if value is not None
        else torch.empty(int(size), dtype=torch.uint8)
    )
    dist.broadcast(data, src=src, group=process_group)
    return msgpack.unpackb(data.numpy().tobytes(), raw=False)
