"""The ``REPLICAFT_*`` environment variables: every name the project reads, in one registry.

A misspelt variable (``REPLICAFT_QUORUM_TIMEOUT`` for ``REPLICAFT_QUORUM_TIMEOUT_S``) used to
be ignored without a word, so the job ran on the default the operator meant to change (issue
19). The prefix is ours, so every ``REPLICAFT_*`` name in a training process's environment is
either one we read or a mistake, and :func:`check_variable_names` (called by
``ManagerOptions.from_env``) refuses an unknown one, suggesting the closest known name.

The registry is :func:`known_variable_names`: one ``REPLICAFT_<FIELD>`` per ``ManagerOptions``
field (passed in, so a new field is known without an edit here), the variables other parts of
the project read under their own constants (the lighthouse's token and TLS files, the
checkpoint key, imported so a rename there cannot leave this list behind), and
:data:`READ_OUTSIDE_THE_LIBRARY`, which deployment scripts and benchmarks set for themselves
and which reach a training process's environment. Rejected: a warning instead of an error
(one line among thousands at start, and the run still uses the wrong value), and checking only
names "close" to a known one (``REPLICAFT_QUORUM_TIMOUT_S`` and ``REPLICAFT_QUORUMTIMEOUT`` are
equally mistakes).

Torch-free, like ``replicaft/config/options.py``, which imports it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from lighthouse.config.options import TOKEN_ENV
from lighthouse.tls.files import CA_ENV, CERT_ENV, KEY_ENV
from replicaft.checkpoint.keys import KEY_ENV as CHECKPOINT_KEY_ENV
from replicaft.checkpoint.keys import KEY_FILE_ENV as CHECKPOINT_KEY_FILE_ENV
from replicaft.errors import OptionsError

ENV_PREFIX = "REPLICAFT_"

NUM_GROUPS_ENV = "REPLICAFT_NUM_GROUPS"
"""The number of groups ``replicaft-launch`` started the job with, in every group's
environment: what ``replicaft.lightning`` sizes the global batch by."""

READ_ELSEWHERE = frozenset(
    {TOKEN_ENV, CERT_ENV, KEY_ENV, CA_ENV, CHECKPOINT_KEY_ENV, CHECKPOINT_KEY_FILE_ENV, NUM_GROUPS_ENV}
)
"""Read by the lighthouse (token, TLS files), the checkpoint tools (the key) and the Lightning
strategy (the group count) under their own constants; the first six are also ``ManagerOptions``
fields, and stay known if one is renamed."""

READ_OUTSIDE_THE_LIBRARY: Mapping[str, str] = {
    "REPLICAFT_REPO": "deploy/slurm/*.sbatch: the checkout the jobs run in (submit.sh exports it to every job)",
    "REPLICAFT_HEAL_BENCH_NETNS": "benchmarks/heal_worker.py: the network namespace a heal benchmark worker entered",
    "REPLICAFT_TORCHTITAN_PYTHON": (
        "tests/replicaft/compat/test_torchtitan.py: the Python with torchtitan (default: .venv-torchtitan's)"
    ),
}
"""Set by scripts around the library for themselves; they reach the training processes'
environment (Slurm's ``--export=ALL``), so they must not read as misspellings."""


def known_variable_names(option_fields: Iterable[str]) -> frozenset[str]:
    """Every ``REPLICAFT_*`` name the project reads, given the names of ``ManagerOptions``' fields."""
    return (
        frozenset(ENV_PREFIX + name.upper() for name in option_fields)
        | READ_ELSEWHERE
        | READ_OUTSIDE_THE_LIBRARY.keys()
    )


def check_variable_names(environ: Iterable[str], known: frozenset[str]) -> None:
    """Raise OptionsError for the first ``REPLICAFT_*`` name in ``environ`` (sorted, so the
    message is stable) that is not in ``known``, suggesting the closest known name."""
    for name in sorted(n for n in environ if n.startswith(ENV_PREFIX) and n not in known):
        # Compared without the prefix every name shares, which would make any two look alike.
        suffixes = sorted(k.removeprefix(ENV_PREFIX) for k in known)
        close = difflib.get_close_matches(name.removeprefix(ENV_PREFIX), suffixes, n=1, cutoff=0.6)
        hint = f"did you mean {ENV_PREFIX}{close[0]}?" if close else f"the known ones are {', '.join(sorted(known))}."
        raise OptionsError(
            f"{name} is set, but replicaft reads no variable of that name, so its value would be ignored; "
            f"{hint} Rename or unset it"
        )
