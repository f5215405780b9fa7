"""``CIFAR10``, offline: CIFAR-10's shapes and sizes, every sample made from its index."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["CIFAR10"]

NUM_TRAIN = 50_000
NUM_TEST = 10_000
NUM_CLASSES = 10
IMAGE_SHAPE = (32, 32, 3)
"""Height, width, channels, as CIFAR-10's arrays hold them (what ``ToTensor`` expects)."""


class CIFAR10:
    """``torchvision.datasets.CIFAR10(root, train, transform, target_transform, download)``
    with made-up images: ``root`` is never read or written and nothing is downloaded."""

    def __init__(
        self,
        root: str,
        train: bool = True,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[int], Any] | None = None,
        download: bool = False,
    ) -> None:
        self.root = root
        self.train = train
        self.transform = transform
        self.target_transform = target_transform
        self.classes = [f"class {i}" for i in range(NUM_CLASSES)]

    def __len__(self) -> int:
        return NUM_TRAIN if self.train else NUM_TEST

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        if not 0 <= index < len(self):
            raise IndexError(f"CIFAR10 stand-in index {index} is outside 0..{len(self) - 1}")
        # Seeded by split and index alone: any process, worker or restart makes the same sample.
        rng = np.random.default_rng((int(self.train), index))
        image: Any = rng.integers(0, 256, size=IMAGE_SHAPE, dtype=np.uint8)
        target: Any = int(rng.integers(0, NUM_CLASSES))
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target
