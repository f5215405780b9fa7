"""Configuration of a rank: one frozen dataclass, checked once when built.

``options.py`` (``ManagerOptions``, read from the environment in one place), ``option_ranges.py``
(the range of every number it holds) and ``env_names.py`` (every ``REPLICAFT_*`` variable).
"""
