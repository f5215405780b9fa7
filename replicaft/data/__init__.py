"""Exactly-once data: every sample of a deterministic global order trains in exactly one committed step.

``sampler.py`` holds the rule (the cursor, each step's share by contributor rank, the global
order's permutations) and ``ExactlyOnceSampler``, the cursor as training state; ``loader.py``
holds ``StepDataLoader``, which loads a rank's share through DataLoader workers;
``map_style.py`` the check that a user's DataLoader can be read by position at all.
"""

from replicaft.data.loader import StepDataLoader as StepDataLoader
from replicaft.data.sampler import BatchPolicy as BatchPolicy
from replicaft.data.sampler import ExactlyOnceSampler as ExactlyOnceSampler
from replicaft.data.sampler import Share as Share
from replicaft.data.sampler import assign_share as assign_share
from replicaft.data.sampler import epoch_permutation as epoch_permutation
from replicaft.data.sampler import sample_ids as sample_ids
from replicaft.data.sampler import shard_share as shard_share

__all__ = [
    "BatchPolicy",
    "ExactlyOnceSampler",
    "Share",
    "StepDataLoader",
    "assign_share",
    "epoch_permutation",
    "sample_ids",
    "shard_share",
]
