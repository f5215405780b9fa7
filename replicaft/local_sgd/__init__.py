"""Semi-synchronous training: LocalSGD, DiLoCo and streaming DiLoCo, fault tolerant.

Groups train alone for a round of inner steps and meet at sync points, where replicaft's
quorum, commit and heal run (diloco.py). ``schedule.py`` (which fragment syncs when),
``leases.py`` (exactly-once data per round) and ``wire.py`` (fp32, bf16 or packed 8-bit
pseudo-gradients) are pure and tested alone.
"""

from replicaft.local_sgd.diloco import DiLoCo, LocalSGD
from replicaft.local_sgd.schedule import SyncSchedule
from replicaft.local_sgd.wire import WIRES, Wire

__all__ = ["WIRES", "DiLoCo", "LocalSGD", "SyncSchedule", "Wire"]
