"""What a simulated job is: its shape, its failure rates, and what each recovery costs.

Three frozen records, each field with its unit in the name, so that a run's parameters are one
value that can be written beside its results. The defaults of :class:`FaultRates` are the
published statistics (:meth:`FaultRates.llama3`); the defaults of :class:`Costs` come from this
machine's measurements where one exists (calibration.py fills them in and says which file each
came from) and are otherwise assumptions named as such in ``Costs.basis``.

Failure statistics used: Llama 3 405B's pre-training, 419 unexpected interruptions in 54 days
on 16,384 H100s in 2,048 hosts of 8 (Dubey et al., "The Llama 3 Herd of Models", 2024, arXiv
2407.21783, section 3.3.4 and Table 5), grouped by root cause below; and for the failure-rate
sweep, Meta's research clusters' mean time to failure of 7.9 h at 1,024 GPUs, projected to
14 min at 131,072 (Kokolis et al., "Revisiting Reliability in Large-Scale Machine Learning
Research Clusters", 2024, arXiv 2410.21680), 6.25 times Llama 3's per-host rate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

FaultKind = Literal["kill", "host", "hang", "sigstop", "preempt", "rack", "lighthouse"]
"""kill: a process crash on a healthy host (software bug), restarted in place. host: the
host's hardware fails (GPU, HBM, NIC...): it goes silent and the group waits for a spare host.
hang: the process hangs in a collective while its heartbeats go on (NCCL watchdog timeouts).
sigstop: the process is frozen for ``FaultRates.sigstop_s`` and resumes (chaos's SIGSTOP).
preempt: a SIGTERM with notice (host maintenance): the group leaves at a step boundary.
rack: a switch or rack loss, every group of one rack at once (as ``host``).
lighthouse: the lighthouse process or its host is lost and restarted."""
FAULT_KINDS: tuple[FaultKind, ...] = ("kill", "host", "hang", "sigstop", "preempt", "rack", "lighthouse")

LLAMA3_INTERRUPTIONS = 419
"""Unexpected interruptions of Llama 3 405B's pre-training, 54 days on 16,384 H100s (2,048
hosts of 8): the Llama 3 paper (Dubey et al. 2024), section 3.3.4 and Table 5."""
LLAMA3_HOURS = 54 * 24
LLAMA3_HOSTS = 2048
LLAMA3_BY_KIND: dict[FaultKind, int] = {
    "host": 283,  # faulty GPU 148, HBM3 72, SRAM 19, GPU system processor 17, NIC 7, thermal 6, and 14 others
    "kill": 62,  # software bug 54, silent data corruption 6, dependency 2
    "rack": 35,  # network switch or cable
    "preempt": 32,  # host maintenance
    "hang": 7,  # NCCL watchdog timeouts
}
"""Table 5's root causes grouped by what each does to a replica group (sums to 419)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FaultRates:
    """Failures per replica group per hour by kind; ``rack_per_h`` per rack, ``lighthouse_per_h`` per job."""

    kill_per_h: float = 0.0
    host_per_h: float = 0.0
    hang_per_h: float = 0.0
    sigstop_per_h: float = 0.0
    preempt_per_h: float = 0.0
    rack_per_h: float = 0.0
    lighthouse_per_h: float = 0.0
    rack_groups: int = 4
    """Groups (hosts) that one rack failure takes down together."""
    sigstop_s: float = 3.0

    @classmethod
    def llama3(cls, rack_groups: int = 4) -> FaultRates:
        """Llama 3's rates per host (one group of 8 GPUs = one host). The lighthouse is one more
        host's process: it fails at the rate a host's hardware and software do."""
        per_host_h = {k: n / (LLAMA3_HOURS * LLAMA3_HOSTS) for k, n in LLAMA3_BY_KIND.items()}
        return cls(
            kill_per_h=per_host_h["kill"],
            host_per_h=per_host_h["host"],
            hang_per_h=per_host_h["hang"],
            preempt_per_h=per_host_h["preempt"],
            rack_per_h=per_host_h["rack"] * rack_groups,
            lighthouse_per_h=per_host_h["host"] + per_host_h["kill"],
            rack_groups=rack_groups,
        )

    def scaled(self, factor: float) -> FaultRates:
        """Every rate times ``factor`` (the failure-rate sweep)."""
        return dataclasses.replace(
            self, **{f.name: getattr(self, f.name) * factor for f in dataclasses.fields(self) if f.name.endswith("_h")}
        )

    def per_group_h(self) -> float:
        """Group failures per group-hour, racks included (the job's MTTF is 1 / (this x groups))."""
        return (
            self.kill_per_h
            + self.host_per_h
            + self.hang_per_h
            + self.sigstop_per_h
            + self.preempt_per_h
            + self.rack_per_h / self.rack_groups  # a rack fails per rack, as one failure of the job
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class JobShape:
    groups: int
    gpus_per_group: int = 8
    step_s: float = 4.0
    """Median step time of one group, compute and all-reduce."""
    step_sigma: float = 0.03
    """Log-normal sigma of a group's step time: a synchronous step lasts its slowest group's."""
    forward_fraction: float = 0.33
    """The share of a step the quorum request overlaps (it is asked at the step's start)."""
    state_bytes_per_gpu: float = 32e9
    """Training state one GPU holds and a healer's rank fetches (model + optimizer shard)."""
    min_replicas: int = 1

    def __post_init__(self) -> None:
        if self.groups < 1 or self.min_replicas > self.groups:
            raise ValueError(
                f"groups={self.groups}, min_replicas={self.min_replicas}: need 1 <= min_replicas <= groups"
            )
        if self.step_s <= 0:
            raise ValueError(f"step_s={self.step_s}; a step takes a positive time")


@dataclass(frozen=True, kw_only=True, slots=True)
class Costs:
    """What recovering costs, in seconds (or GB/s). ``basis`` says where each value came from."""

    warm_restart_s: float = 0.33
    cold_restart_s: float = 2.2
    host_replace_s: float = 600.0
    pg_rebuild_s: float = 0.07
    notice_s: float = 0.004
    heal_fixed_s: float = 0.05
    heal_gbps: float = 2.9
    """replicaft's heal throughput per rank (its software's ceiling)."""
    torchft_heal_gbps: float = 0.84
    network_gbps: float = 50.0
    """Per-GPU network bandwidth (400 Gb/s NICs): a heal goes no faster than this."""
    donor_slowdown: float = 1.05
    lighthouse_restart_s: float = 1.3
    reconnect_s: float = 0.1
    lighthouse_failover_s: float = 0.12
    checkpoint_s_per_gb: float = 0.18
    """Blocking time of a checkpoint save per GB of a rank's state."""
    checkpoint_load_s_per_gb: float = 1.6
    job_restart_s: float = 600.0
    """Stopping and restarting a whole large job (scheduler, host swap, process and NCCL start)."""
    collective_timeout_s: float = 600.0
    """torch.distributed's default NCCL timeout: a job without fault tolerance notices a hang after it."""
    torchft_timeout_s: float = 60.0
    """torchft Manager's ``timeout``: a collective with a silent or hung peer fails after it."""
    basis: dict[str, str] = field(default_factory=dict, compare=False)

    def heal_s(self, state_bytes_per_gpu: float, *, torchft: bool = False) -> float:
        """One healer's transfer: every rank fetches its shard at once, at the slower of the
        software's ceiling and the link."""
        gbps = min(self.torchft_heal_gbps if torchft else self.heal_gbps, self.network_gbps)
        return self.heal_fixed_s + state_bytes_per_gpu / (gbps * 1e9)
