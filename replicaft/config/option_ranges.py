"""The range of every number ``ManagerOptions`` holds, and the bounds those ranges come from.

A NaN compares false with everything, so a check like ``value > 0`` lets it through, and a
NaN timeout never expires (issue 19). Every int and float field is therefore checked once,
when the options are built, against its range here (``options.py`` asserts at import that
every numeric field has one): finite, not a bool, inside ``[lowest, highest]``. The bounds are
the edges of what the system acts on, taken from the module that acts on the value; the third
element is the fix an error names.
"""

from __future__ import annotations

from collections.abc import Mapping

from lighthouse.config.option_checks import MAX_SECONDS
from lighthouse.config.options import MAX_MEMBERS
from lighthouse.wire.envelope import MAX_WORLD_SIZE
from replicaft.checkpoint.options import MAX_COMPRESSION_LEVEL, MAX_STEPS
from replicaft.checkpoint.options import MAX_SECONDS as CHECKPOINT_MAX_SECONDS

MAX_HEAL_CONNECTIONS = 64
"""Each connection is a receiving thread and a socket; past a few per core (measured: no gain
beyond four on two cores) more only contend."""
MAX_HEAL_REPLAY_STEPS = 1 << 16
"""Steps a heal records whatever their size (each holds an averaged gradient in memory); a
heal missing more should restart and hold the donors, which it then does."""
MAX_HEAL_REPLAY_BYTES = 1 << 40
"""A TiB of recorded steps held in host memory: beyond any host this runs on."""
MAX_RESUME_VERIFY_STEPS = 16
"""The reference is the last ``2 * resume_verify_steps`` losses before the checkpoint, and a
checkpoint carries 32 (resume_check.py, ``TRAJECTORY_STEPS``)."""
MAX_QUORUM_FAILURES = 10_000
"""At the longest quorum timeout (a day) already decades; a larger count means "forever"."""


NUMBER_RANGES: Mapping[str, tuple[float, float, str]] = {
    # field: (lowest, highest, the fix named in the error). Every int and float field is here
    # (checked below, at import). The bounds are the edges of what the system acts on, taken
    # from the module that acts: a larger value is a typo, and NaN or inf never expire.
    "group_rank": (0, MAX_WORLD_SIZE - 1, "need 0 <= group_rank < group_world_size"),
    "group_world_size": (1, MAX_WORLD_SIZE, "ranks per group, as many as the lighthouse accepts"),
    "min_replicas": (1, MAX_MEMBERS, "at least 1, at most the groups the lighthouse accepts"),
    # Timeouts: at most a day, what the lighthouse accepts for any wait (a quorum request's
    # timeout travels to it); longer reads as "never", which no wait here may be.
    "heartbeat_interval_s": (0.001, MAX_SECONDS, "seconds, e.g. 0.1"),
    "collective_timeout_s": (0.001, MAX_SECONDS, "seconds, e.g. 10.0"),
    "quorum_timeout_s": (0.001, MAX_SECONDS, "seconds, e.g. 60.0"),
    "heal_timeout_s": (0.001, MAX_SECONDS, "seconds, e.g. 30.0"),
    "connect_timeout_s": (0.001, MAX_SECONDS, "seconds, e.g. 10.0"),
    "preemption_grace_s": (0.001, MAX_SECONDS, "seconds, e.g. 30.0"),
    "checkpoint_store_wait_s": (0.001, MAX_SECONDS, "seconds a start waits for the object store, e.g. 300.0"),
    "preemption_poll_s": (0.01, 3600.0, "seconds between two looks at preemption_notice; AWS suggests 5"),
    "heal_connections": (1, MAX_HEAL_CONNECTIONS, "at least 1 per donor host"),
    "heal_replay_steps": (
        0,
        MAX_HEAL_REPLAY_STEPS,
        "0 or more (0 and 0 bytes: a heal holds the donors from its second try)",
    ),
    "heal_replay_bytes": (0, MAX_HEAL_REPLAY_BYTES, "0 or more bytes"),
    "max_quorum_failures": (1, MAX_QUORUM_FAILURES, "at least 1"),
    "digest_every_steps": (0, MAX_STEPS, "use 0 (off) or more"),
    "seed": (0, 2**63 - 1, "a non-negative 63-bit integer"),
    "checkpoint_interval_steps": (0, MAX_STEPS, "0 disables the step trigger"),
    # Checkpoint seconds: the checkpoint module's bound (an MTBF prior of weeks is sensible).
    "checkpoint_interval_s": (0, CHECKPOINT_MAX_SECONDS, "seconds; 0 disables the time trigger"),
    "checkpoint_interval_min_s": (0.001, CHECKPOINT_MAX_SECONDS, "seconds between saves at most often"),
    "checkpoint_interval_max_s": (0.001, CHECKPOINT_MAX_SECONDS, "seconds between saves at least often"),
    "checkpoint_mtbf_prior_s": (0.001, CHECKPOINT_MAX_SECONDS, "seconds between failures of every group at once"),
    "checkpoint_keep_last": (0, MAX_STEPS, "0 or more (the newest is always kept)"),
    "checkpoint_milestone_every": (0, MAX_STEPS, "use 0 for no milestones"),
    "checkpoint_keep_geometric_from": (0, MAX_STEPS, "use 0 for no geometric spacing"),
    "checkpoint_keep_best_k": (0, MAX_STEPS, "use 0 to keep no best checkpoints"),
    "checkpoint_chain_length": (1, MAX_STEPS, "1 makes every save a full base"),
    "checkpoint_compression_level": (0, MAX_COMPRESSION_LEVEL, "0 (off) or a zstd level 1-22"),
    "resume_verify_steps": (0, MAX_RESUME_VERIFY_STEPS, "0 (off) or the steps to judge after a resume, e.g. 5"),
    "resume_verify_tolerance": (0.0, 1e6, "a fraction of the mean loss, e.g. 0.5"),
    "virtual_shards": (1, MAX_MEMBERS, "at least the most groups the job will have"),
    "metrics_port": (0, 65535, "0 (no metrics endpoint) or a TCP port; rank r serves on metrics_port + r"),
}
