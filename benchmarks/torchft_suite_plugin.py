"""A pytest plugin that runs torchft 0.2.0's own test files against replicaft's shim.

Loaded with ``-p benchmarks.torchft_suite_plugin`` (see benchmarks/torchft_suite.py):
``import torchft`` resolves to ``replicaft.compat.torchft`` through the alias folder that
``replicaft-launch --torchft`` uses, and only torchft's test files are found in the installed
wheel (``torchft.manager_integ_test``, ``torchft.checkpointing.transport_test``, the
``torchft._test`` helpers): every other ``torchft.*`` module is the shim's or is missing, as
with replicaft installed without torchft. The wheel's own modules never load, so a test
cannot pass on a torchft module the shim lacks. With ``TORCHFT_SUITE_REAL=1`` nothing is
aliased: the same files run against real torchft, the baseline.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from replicaft.compat import TORCHFT_ALIAS_DIR

ALIAS = TORCHFT_ALIAS_DIR


def installed_torchft_dir() -> Path:
    """The installed torchft's package folder, found without importing it."""
    return Path(str(importlib.metadata.distribution("torchft").locate_file("torchft")))


def is_test_module(name: str) -> bool:
    """Whether ``torchft.<...>`` names one of torchft's test files: a ``*_test`` module or
    anything in its ``_test`` folder of test helpers."""
    parts = name.split(".")
    return len(parts) > 1 and parts[0] == "torchft" and (parts[1] == "_test" or parts[-1].endswith("_test"))


class TestFilesOnly(importlib.abc.MetaPathFinder):
    """Finds torchft's test modules in the wheel's folder ``root``, and nothing else there."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not is_test_module(fullname):
            return None
        folder = self.root.joinpath(*fullname.split(".")[1:-1])
        return importlib.machinery.PathFinder.find_spec(fullname, [str(folder)])


if os.environ.get("TORCHFT_SUITE_REAL") != "1":
    sys.path.insert(0, str(ALIAS))
    import torchft  # noqa: F401  (the alias: torchft is replicaft.compat.torchft from here on)

    sys.meta_path.insert(0, TestFilesOnly(installed_torchft_dir()))
