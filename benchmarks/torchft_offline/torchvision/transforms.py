"""``Compose``, ``ToTensor`` and ``Normalize``, with torchvision's results for ``uint8`` arrays."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["Compose", "Normalize", "ToTensor"]


class Compose:
    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, x: Any) -> Any:
        for transform in self.transforms:
            x = transform(x)
        return x


class ToTensor:
    """An ``H x W x C`` ``uint8`` array to a ``C x H x W`` float tensor in [0, 1]."""

    def __call__(self, image: np.ndarray) -> torch.Tensor:
        if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3:
            raise TypeError(f"the ToTensor stand-in takes an H x W x C uint8 array, got {type(image).__name__}")
        return torch.from_numpy(image).permute(2, 0, 1).contiguous().float().div(255)


class Normalize:
    """``(x - mean) / std``, channel by channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> None:
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)
        self.inplace = inplace

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.sub_(self.mean).div_(self.std) if self.inplace else (x - self.mean) / self.std
