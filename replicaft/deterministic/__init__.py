"""The deterministic mode: a run with failures ends bit for bit where the fault-free run ends.

``rules.py`` holds the pure rules (virtual shards, their seeds, an exact fixed-point sum);
``shard_gradients.py`` applies them to one group's gradients inside the DDP wrapper.
"""
