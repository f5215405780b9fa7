"""``import torchft`` resolves to replicaft's shim when this folder leads ``sys.path``.

``replicaft-launch --torchft`` puts ``replicaft/compat/torchft_alias`` first on the
PYTHONPATH of the groups it starts, so a torchft program runs with no edit at all. Replacing
the module in ``sys.modules`` while it is being imported is what the import system returns
afterwards. Every submodule is registered under its ``torchft.`` name too: found again on
the shim's path, ``torchft.manager`` would be a second copy of
``replicaft.compat.torchft.manager``, with classes that fail each other's isinstance checks.
"""

import importlib
import pkgutil
import sys

import replicaft.compat.torchft as _shim

for _info in pkgutil.walk_packages(_shim.__path__, prefix="replicaft.compat.torchft."):
    sys.modules["torchft." + _info.name.removeprefix("replicaft.compat.torchft.")] = importlib.import_module(_info.name)
sys.modules[__name__] = _shim
