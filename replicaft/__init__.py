"""replicaft: fault-tolerant data-parallel training for PyTorch."""
