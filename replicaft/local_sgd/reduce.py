"""Average one flat pseudo-gradient across the quorum through the manager, in a wire format.

Started at a sync's start and finished at its commit (``fragment_sync_delay`` inner steps
later), so the transfer overlaps those steps. Everything goes through ``Manager.allreduce``,
which averages over the groups contributing this step and replaces a healer's tensor with
zeros: a peer's failure makes ``finish`` return None and the sync not commit, never raise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lighthouse.rules.plan import StepPlan
from replicaft.column.process_group import ManagedWork
from replicaft.local_sgd import wire
from replicaft.local_sgd.wire import Wire
from replicaft.manager import Manager


@dataclass
class PendingReduce:
    work: ManagedWork
    buffer: torch.Tensor
    numel: int
    scales: torch.Tensor | None = None
    bias: int = 0
    contributors: int = 1


def start_reduce(manager: Manager, plan: StepPlan, values: torch.Tensor, fmt: Wire) -> PendingReduce:
    """Launch the average of ``values`` (flat float32); returns at once except for int8's
    scale exchange, a blocking all-reduce of ``N * numel / CHUNK`` floats."""
    numel = values.numel()
    if fmt == "fp32":
        return PendingReduce(manager.allreduce(values), values, numel)
    if fmt == "bf16":
        buffer = values.to(torch.bfloat16)
        return PendingReduce(manager.allreduce(buffer), buffer, numel)
    n = max(plan.num_contributors, 1)
    bias = wire.lane_bias(n)
    local_max = wire.chunk_max(values)
    slots = local_max.new_zeros(n, local_max.numel())
    if plan.replica_id in plan.donors:
        slots[plan.donors.index(plan.replica_id)] = local_max
    exchange = manager.allreduce(slots)
    if not exchange.wait():
        scales = torch.ones_like(local_max)  # the step will not commit; keep the collectives in line
    else:
        scales = wire.scales_from_max((slots * n).amax(dim=0), bias)
    buffer = wire.encode_int8(values, scales, bias)
    return PendingReduce(manager.allreduce(buffer), buffer, numel, scales, bias, n)


def finish_reduce(pending: PendingReduce) -> torch.Tensor | None:
    """The averaged values (flat float32), or None if the all-reduce failed."""
    if not pending.work.wait():
        return None
    if pending.scales is not None:
        return wire.decode_int8(pending.buffer, pending.scales, pending.bias, pending.contributors, pending.numel)
    return pending.buffer.float() if pending.buffer.dtype != torch.float32 else pending.buffer
