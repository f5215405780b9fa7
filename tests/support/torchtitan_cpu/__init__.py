"""torchtitan 0.3.0's torchft experiment, unmodified, on CPU (tests/replicaft/compat/test_torchtitan.py).

torchtitan 0.3.0 has no CPU path: ``torchtitan/tools/utils.py`` resolves the device to CUDA
when no accelerator is found, FlexAttention has no CPU backward, and its wheel ships neither
the debug tokenizer nor the ``c4_test`` dataset its debug configs name. ``train.py`` runs
torchtitan's own ``torchtitan.train.main`` after changing exactly what ``cpu_patches.py`` and
``assets.py`` list (the README's "Coming from torchft" section repeats it).
"""
