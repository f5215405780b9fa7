"""A stand-in for ``torchvision``, with only what torchft's ``train_ddp.py`` uses: offline data in
place of CIFAR-10's download.

``train_ddp.py`` builds ``torchvision.datasets.CIFAR10(root="./cifar", train=True,
download=True, transform=...)`` with ``transforms.Compose([ToTensor(), Normalize(...)])``.
The real dataset downloads 170 MB from a host tests and CI cannot reach (and would refuse a
made-up copy: it checks each file's md5), so with this folder first on the PYTHONPATH the
program gets :class:`~torchvision.datasets.CIFAR10` here instead: CIFAR-10's shapes and sizes
(50,000 training images of 32x32x3 ``uint8``, labels 0-9), each image made from its index, so
every replica group, and a restarted one, sees the same sample at the same index.

Only these names exist; anything else ``torchvision`` has raises AttributeError or
ImportError, so a program that needs more says so instead of training on something else.
Rejected: installing torchvision (its CPU wheel for torch 2.13 is 0.28.0; it still needs the
download, and the dataset is the only part the program needs).
"""

from torchvision import datasets, transforms

__all__ = ["datasets", "transforms"]
