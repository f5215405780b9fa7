"""Compatibility surfaces for scripts written against other fault-tolerance libraries."""

from pathlib import Path

TORCHFT_ALIAS_DIR = Path(__file__).resolve().parent / "torchft_alias"
"""First on a program's ``sys.path``, this folder makes ``import torchft`` resolve to
``replicaft.compat.torchft`` (``replicaft-launch --torchft`` puts it on the groups' PYTHONPATH)."""
