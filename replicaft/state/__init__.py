"""The training state as data, and the registry of who owns it.

``flat.py`` flattens a nested state dict into a msgpack skeleton plus tensors and takes its
digest; ``skeleton.py`` checks a skeleton's shape (torch-free); ``content.py`` hashes tensors
in chunks; ``registry.py`` is what a heal transfers and a checkpoint saves, and who acts at step
boundaries; ``rng_state.py`` and ``grad_scaler.py`` make the global random generators and
AMP's scaler part of that state.
"""
