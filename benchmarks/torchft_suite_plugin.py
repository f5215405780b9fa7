"""A pytest plugin that runs torchft 0.2.0's own test files against replicaft's shim.

Loaded with ``-p benchmarks.torchft_suite_plugin`` (see benchmarks/torchft_suite.py):
``import torchft`` resolves to ``replicaft.compat.torchft`` through the alias folder that
``replicaft-launch --torchft`` uses, and the installed torchft's folder is appended to the
shim's package path, so ``torchft.manager_integ_test`` (and ``torchft._test``) are found in
the wheel while every module the shim defines shadows torchft's own. With
``TORCHFT_SUITE_REAL=1`` nothing is aliased: the same files run against real torchft, the
baseline.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

from replicaft.compat import TORCHFT_ALIAS_DIR

ALIAS = TORCHFT_ALIAS_DIR


def installed_torchft_dir() -> Path:
    """The installed torchft's package folder, found without importing it."""
    return Path(str(importlib.metadata.distribution("torchft").locate_file("torchft")))


if os.environ.get("TORCHFT_SUITE_REAL") != "1":
    sys.path.insert(0, str(ALIAS))
    import torchft

    torchft.__path__.append(str(installed_torchft_dir()))
