"""PyTorch Lightning on replicaft: ``Trainer(strategy=FaultTolerantStrategy(), devices=1)``
trains an unchanged LightningModule as one replica group (``strategy.py``).

Needs ``pytorch-lightning`` (``pip install 'replicaft[lightning]'``).
"""

from replicaft.lightning.strategy import FaultTolerantStrategy as FaultTolerantStrategy

__all__ = ["FaultTolerantStrategy"]
