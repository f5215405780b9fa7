"""replicaft on Ray: Ray Train places the replica groups and restarts a failed one; replicaft
heals it from the others (README: Running on a cluster).

* ``ReplicaftConfig``: the backend for ``TorchTrainer(torch_config=...)``; a worker is a group.
* ``run_script``: a replicaft training script in R groups, as ``python -m replicaft.ray`` runs it.

Needs Ray Train: ``pip install 'replicaft[ray]'``.
"""

from replicaft.ray.backend import ReplicaftConfig
from replicaft.ray.script import GroupExited, run_script

__all__ = ["GroupExited", "ReplicaftConfig", "run_script"]
