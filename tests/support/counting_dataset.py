"""A map-style dataset with torchdata-``Stateful`` state, for the StatefulDataLoader tests.

A module of its own, importing only torch: DataLoader workers unpickle the dataset by
importing the module that defines it, and a test module's imports (datasets, pytest) would
cost each started worker seconds.
"""

from __future__ import annotations

from typing import Any

import torch


class CountingDataset(torch.utils.data.Dataset):
    """Sample ``i`` is ``{"id": i}``; its state is how many samples this copy has loaded."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.loaded = 0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        self.loaded += 1
        return {"id": torch.tensor(index)}

    def state_dict(self) -> dict[str, Any]:
        return {"loaded": self.loaded}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded = state["loaded"]
