"""Manager configuration: one frozen dataclass, checked once, read from the environment in one place.

The timeouts form one hierarchy, validated in ``__post_init__``::

    heartbeat_interval_s  <  collective_timeout_s  <  quorum_timeout_s
                             heal_timeout_s        <  quorum_timeout_s

* ``collective_timeout_s`` bounds one all-reduce (and the Gloo/NCCL op timeout). A peer that
  dies is usually noticed far sooner (its connection closes, or the lighthouse pushes a
  member-lost notice); this deadline covers a silent peer (partition).
* ``quorum_timeout_s`` bounds how long a group waits for a quorum. It must outlast a failed
  step (a collective timeout) plus the lighthouse's deadlines for dropping a hung member
  (its ``--heartbeat-timeout`` / ``--progress-timeout``), or survivors would give up while
  the lighthouse is still, correctly, waiting. A quorum timeout does not crash the group:
  it is retried (up to ``max_quorum_failures``).
* ``heal_timeout_s`` bounds one state transfer.

Every other value is checked once, here, too (issue 19): each number through the lighthouse's
one rule (``lighthouse.config.option_checks.check_number``: a number of the field's type, not a bool,
finite, inside the range :data:`NUMBER_RANGES` gives it), so a NaN timeout, a NaN checkpoint
interval or a quorum timeout the lighthouse refuses on the wire fails at start, naming the
field, instead of hanging or failing later with a traceback. The replica id follows the
lighthouse's rule (``lighthouse/wire/replica_id.py``), and the checkpoint part the checkpoint's
(``checkpoint/options.py``).

Explicit arguments always win over the environment; ``from_env`` is called by entry points,
never by library code, and library code never writes ``os.environ``. What the environment
sets is read by environment.py; a ``REPLICAFT_*`` variable that nothing reads is an error
(env_names.py keeps the registry).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from lighthouse import errors as lighthouse_errors
from lighthouse.config.option_checks import check_number
from lighthouse.tls.files import TlsFiles
from lighthouse.wire.replica_id import check_replica_id
from replicaft.checkpoint.cadence import check_cadence_options
from replicaft.checkpoint.options import check_checkpoint_options
from replicaft.config.env_names import ENV_PREFIX, known_variable_names
from replicaft.config.environment import check_environment, environment_values
from replicaft.config.option_ranges import NUMBER_RANGES
from replicaft.errors import OptionsError
from replicaft.persistence.preemption import check_notice_options
from replicaft.process.faults import parse_fault_points

HEAL_CONNECTIONS = 2
"""Connections a heal pulls over in all, at least one per donor host, each host's to one of its
donors (transfer/client.py, ``streams_by_donor``). One TCP stream does not carry
what a host can send: on this project's 2-core benchmark host a raw loopback socket moved
1 GiB at 2.3-3.2 GB/s over one connection and 4.3-5.5 GB/s over two from the same sender
(over four, no more), and a one-donor heal went from 2.7 to 3.7 GB/s. A total rather than a
count per donor: the healer's cores bound what it can receive, and two donors pulled over
two connections each (four receiving threads on two cores) healed no faster than one donor
over two."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ManagerOptions:
    lighthouse: str
    """``host:port`` of the lighthouse (``REPLICAFT_LIGHTHOUSE``); for a replicated lighthouse,
    every one of the set, comma-separated (the session moves to the leader)."""
    replica_id: str
    """Stable name of this replica group (``REPLICAFT_REPLICA_ID``); a restarted group keeps it."""
    group_rank: int = 0
    """This process's rank inside its group (``RANK`` under torchrun)."""
    group_world_size: int = 1
    """Ranks per group, W (``WORLD_SIZE`` under torchrun)."""
    group_store: str | None = None
    """``host:port`` of the group's TCPStore (torchrun's ``MASTER_ADDR:MASTER_PORT``), through
    which ranks > 0 find rank 0's manager server. Required when W > 1."""
    min_replicas: int = 1
    """A step commits only if at least this many groups took part."""
    host: str = "127.0.0.1"
    """Address other groups use to reach this rank's store and state server. Loopback by
    default; set the host's routable address for multi-host jobs."""
    token: str | None = None
    """Shared secret for the lighthouse, manager server and state server (``REPLICAFT_TOKEN``)."""
    tls_cert: str | None = None
    """The job's certificate (PEM, ``REPLICAFT_TLS_CERT``): with ``tls_key`` and ``tls_ca``,
    every channel of this rank (lighthouse, group manager, state server) runs over TLS
    (lighthouse/tls/files.py). All three or none."""
    tls_key: str | None = None
    """The certificate's private key (PEM, ``REPLICAFT_TLS_KEY``)."""
    tls_ca: str | None = None
    """The CA that signed the job's certificates (PEM, ``REPLICAFT_TLS_CA``); peers must present one."""
    backend: Literal["gloo", "nccl"] | None = None
    """Column process group backend; None picks NCCL when CUDA is available, else Gloo."""
    heartbeat_interval_s: float = 0.1
    """How long rank 0's session with the lighthouse may be quiet before it heartbeats (with
    the step and a progress count); a step's quorum request counts. The lighthouse declares a
    group hung (SIGSTOP, frozen host) after ~3x this silence (lighthouse/rules/liveness.py), so
    0.1 s detects one in ~0.3 s; faster only costs the lighthouse CPU while steps are slower
    than this (measured: 256 groups at 0.1 s kept a fifth of a core busy)."""
    collective_timeout_s: float = 10.0
    quorum_timeout_s: float = 60.0
    heal_timeout_s: float = 30.0
    heal_connections: int = HEAL_CONNECTIONS
    """Connections a heal pulls its donors over, in all; at least one per donor host."""
    heal_replay_steps: int = 16
    """A non-blocking heal records the steps it misses, to replay them once its fetch has
    arrived: this many always, and more while ``heal_replay_bytes`` allows. Past both, it
    restarts, and the next heal holds the donors until its fetch has arrived (catchup.py)."""
    heal_replay_bytes: int = 1 << 30
    """Bytes of recorded steps (mostly one averaged gradient each) a heal may keep beyond
    ``heal_replay_steps``."""
    connect_timeout_s: float = 10.0
    """Rendezvous of a new column process group, and reaching the group's manager server."""
    max_quorum_failures: int = 3
    """Consecutive quorum timeouts tolerated before ``start_quorum`` raises."""
    events_dir: str | None = None
    """Directory for the structured event log (``REPLICAFT_EVENTS_DIR``); None = no events."""
    digest_every_steps: int = 1
    """Emit a digest of the whole state every N committed steps (0 = never). It hashes the state
    on the training thread at the step boundary (XXH3-128 per 4 MiB piece, ~13 GB/s a core:
    ~0.8 ms for 10 MB), so it is skipped when there is no event log to write it to."""
    seed: int = 0
    """Base of the per-step RNG seed (see ``Manager.step_seed``)."""
    checkpoint_dir: str | None = None
    """Persistent checkpoints (every group gone) go here; None = none (replicaft/persistence/duties.py)."""
    checkpoint_interval_steps: int = 0
    """Save every N committed steps (0 = not by steps). With a directory and no interval, 100."""
    checkpoint_interval_s: float = 0.0
    """Save every T seconds (0 = not by time); W = 1 only."""
    checkpoint_interval: Literal["fixed", "auto"] = "fixed"
    """``auto`` (``REPLICAFT_CHECKPOINT_INTERVAL=auto``): the interval in seconds is chosen, and
    recomputed, from the measured cost of a save and the observed time between total failures
    (replicaft/checkpoint/cadence.py), within the two bounds below; instead of the fixed
    intervals, and W = 1 only (like ``checkpoint_interval_s``)."""
    checkpoint_interval_min_s: float = 60.0
    """``auto``: never save more often (also the interval until a save has been measured)."""
    checkpoint_interval_max_s: float = 3600.0
    """``auto``: never save less often; bounds the work a total failure can lose."""
    checkpoint_mtbf_prior_s: float = 86400.0
    """``auto``: the mean time between total failures assumed until two have been observed."""
    checkpoint_keep_last: int = 3
    """Retention keeps the newest N checkpoints (the newest always, even with 0). Every
    ``checkpoint_keep_*``/``checkpoint_milestone_*`` rule only keeps: a checkpoint is deleted
    when none keeps it (replicaft/checkpoint/retention.py)."""
    checkpoint_milestone_every: int = 0
    """Also keep every checkpoint whose step is a multiple of this, forever (0 = none)."""
    checkpoint_milestone_at_epoch_end: bool = False
    """Also keep the last checkpoint of each epoch (the ``epoch`` given to
    ``Manager.checkpoint_tags``), once one of a later epoch exists."""
    checkpoint_keep_geometric_from: int = 0
    """Also keep the first checkpoint at or after each of the steps N, 2N, 4N, ...: the whole
    run's history at a cost logarithmic in its length (0 = none)."""
    checkpoint_keep_best_k: int = 0
    """Also keep the K checkpoints with the best ``checkpoint_keep_best_metric`` (0 = none)."""
    checkpoint_keep_best_metric: str | None = None
    """The metric keep-best ranks by, as reported with ``Manager.report_metrics`` (e.g. ``loss``);
    needed with ``checkpoint_keep_best_k`` and refused without it."""
    checkpoint_keep_best_mode: Literal["min", "max"] = "min"
    """``min``: a lower metric is better (a loss); ``max``: a higher one (an accuracy)."""
    checkpoint_tier2_dir: str | None = None
    """A durable second directory receiving a verified background copy of each checkpoint."""
    checkpoint_chain_length: int = 10
    """Incremental checkpoints: a full base every N saves; between them a save writes only the
    chunks that changed (1 = every save writes everything). See replicaft/checkpoint/chain.py."""
    checkpoint_compression_level: int = 0
    """zstd level (1-22) for checkpoint chunks; 0 = off, the right choice for a local disk."""
    checkpoint_key_file: str | None = None
    """Encrypt checkpoints at rest (AES-256-GCM) with the 32-byte key in this file, kept outside
    the checkpoint directories; ``REPLICAFT_CHECKPOINT_KEY`` gives the key itself instead."""
    checkpoint_key: str | None = field(default=None, repr=False)
    checkpoint_object_store: str | None = None
    """``s3://bucket/prefix``: each checkpoint is uploaded there in the background and restored
    from there when no local copy is left. Credentials: boto3's (``AWS_ACCESS_KEY_ID``, ...)."""
    checkpoint_object_store_endpoint: str | None = None
    """The S3 API endpoint (``http://host:port``) of a store other than AWS's."""
    checkpoint_store_wait_s: float = 300.0
    """A starting group whose local directories hold no checkpoint asks the object store whether
    one exists; while the store cannot answer it does not train (that would start a second
    history beside a stored one) and asks again at each quorum, and after this long it stops
    with ``CheckpointStoreUnavailable`` (replicaft/persistence/resume_question.py)."""
    preemption_grace_s: float = 30.0
    """After SIGTERM, how long the writer group may spend on its emergency save."""
    preemption_notice: str | None = None
    """Where this host's preemption is announced ahead of SIGTERM (``REPLICAFT_PREEMPTION_NOTICE``):
    ``gce``, ``aws`` (the provider's metadata URL), an ``http(s)://`` URL, or ``file:PATH``; a
    notice leaves exactly as SIGTERM does, only sooner. None/empty = not watched (preemption.py)."""
    preemption_notice_kind: str = "auto"
    """How to read ``preemption_notice``: ``gce`` (body TRUE), ``aws`` (200 vs 404), ``http``
    (200 is a notice), ``file`` (it exists and does not say false), or ``auto`` (from its form)."""
    preemption_poll_s: float = 5.0
    """Seconds between two looks at ``preemption_notice``: AWS announces two minutes ahead and
    suggests polling every 5 s; each request gives up after a quarter of this (0.5-2 s)."""
    resume_verify_steps: int = 5
    """After a resume from disk, judge the mean loss of this many committed steps against the
    loss trajectory the checkpoint carries (replicaft/persistence/resume_check.py); 0 = off. Needs losses
    reported with ``Manager.report_metrics(loss=...)``."""
    resume_verify_tolerance: float = 0.5
    """How far that mean may move from the mean of the losses before the checkpoint, as a
    fraction of it, on top of their spread (max - min)."""
    resume_verify_action: Literal["warn", "stop"] = "warn"
    """On a divergence: ``warn`` (a warning and the ``resume_verdict`` event), or ``stop``
    (also raise ``ResumeDiverged`` from ``should_commit``, before that step's checkpoint)."""
    fault_points: str | None = None
    """Kill this process at named points (``allreduce@5``), for chaos tests; see faults.py."""
    deterministic: bool = False
    """Make each committed update depend only on the step's global batch, never on which groups
    took part (``REPLICAFT_DETERMINISTIC=1``): the batch is cut into ``virtual_shards`` fixed
    shards whose gradients are summed exactly (replicaft/deterministic/rules.py). Needs the DDP wrapper and
    ``policy="global"`` data; costs one backward per shard and twice the bytes on the wire."""
    virtual_shards: int = 8
    """Shards of each step's global batch in the deterministic mode: at least the most groups
    the job will have (groups past it contribute zeros), and a divisor of the global batch."""
    metrics_port: int = 0
    """Serve this process's Prometheus metrics at ``http://host:<metrics_port + group_rank>/metrics``
    (``REPLICAFT_METRICS_PORT``; + group_rank so the ranks on one host do not collide, and groups
    sharing a host need ports that far apart); 0 = no endpoint (replicaft/telemetry/metrics.py)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in NUMBER_RANGES:
                check_option_number(f.name, value, f.name)
            elif f.type in ("str", "str | None") and not (value is None and f.type == "str | None"):
                if not isinstance(value, str) or "\x00" in value:
                    raise OptionsError(
                        f"{f.name}={value!r} is not a string without NUL bytes; give a string"
                        + (" or leave it unset" if f.type == "str | None" else "")
                    )
        for name in ("deterministic", "checkpoint_milestone_at_epoch_end"):
            if not isinstance(getattr(self, name), bool):
                raise OptionsError(f"{name}={getattr(self, name)!r}; give True or False")
        self.tls()
        check_replica_id(self.replica_id, where="replica_id", error=OptionsError)
        if not all(_is_host_port(a.strip()) for a in self.lighthouse.split(",")):
            raise OptionsError(
                f"lighthouse={self.lighthouse!r} is not host:port (e.g. 127.0.0.1:29510), or every "
                "lighthouse of a replicated set as host:port,host:port,..."
            )
        if self.token is not None and not self.token:
            raise OptionsError("token is empty; pass a non-empty token or none at all")
        if not self.group_rank < self.group_world_size:
            raise OptionsError(
                f"group_rank={self.group_rank} with group_world_size={self.group_world_size}; "
                "need 0 <= group_rank < group_world_size"
            )
        if self.group_world_size > 1 and not self.group_store:
            raise OptionsError(
                f"group_world_size={self.group_world_size} needs group_store (host:port of the "
                "group's TCPStore; torchrun sets MASTER_ADDR and MASTER_PORT)"
            )
        if self.group_store is not None and not _is_host_port(self.group_store):
            raise OptionsError(f"group_store={self.group_store!r} is not host:port (e.g. 127.0.0.1:29500)")
        if self.backend not in (None, "gloo", "nccl"):
            raise OptionsError(f"backend={self.backend!r}; use 'gloo', 'nccl', or leave it unset to pick by device")
        self._check_timeout_hierarchy()
        parse_fault_points(self.fault_points)
        check_notice_options(self.preemption_notice, self.preemption_notice_kind)
        if self.resume_verify_action not in ("warn", "stop"):
            raise OptionsError(
                f"resume_verify_action={self.resume_verify_action!r}; use 'warn' (log and emit the "
                "verdict) or 'stop' (also stop the group when the loss diverged after a resume)"
            )
        check_cadence_options(
            self.checkpoint_interval,
            self.checkpoint_interval_steps,
            self.checkpoint_interval_s,
            self.group_world_size,
            self.checkpoint_interval_min_s,
            self.checkpoint_interval_max_s,
            self.checkpoint_mtbf_prior_s,
        )
        if (
            self.checkpoint_dir is not None
            and self.checkpoint_interval == "fixed"
            and not (self.checkpoint_interval_steps or self.checkpoint_interval_s)
        ):
            object.__setattr__(self, "checkpoint_interval_steps", 100)
        check_checkpoint_options(
            directory=self.checkpoint_dir,
            tier2_directory=self.checkpoint_tier2_dir,
            interval_steps=self.checkpoint_interval_steps,
            interval_s=self.checkpoint_interval_s,
            keep_last=self.checkpoint_keep_last,
            milestone_every=self.checkpoint_milestone_every,
            chain_length=self.checkpoint_chain_length,
            compression_level=self.checkpoint_compression_level,
            object_store=self.checkpoint_object_store,
            milestone_at_epoch_end=self.checkpoint_milestone_at_epoch_end,
            keep_geometric_from=self.checkpoint_keep_geometric_from,
            keep_best_k=self.checkpoint_keep_best_k,
            keep_best_metric=self.checkpoint_keep_best_metric,
            keep_best_mode=self.checkpoint_keep_best_mode,
        )
        if self.deterministic and self.group_world_size > 1:
            raise OptionsError(
                f"deterministic=True with group_world_size={self.group_world_size}: the deterministic "
                "mode supports groups of one rank (the DDP wrapper) only; unset it or use W=1"
            )

    def _check_timeout_hierarchy(self) -> None:
        if self.collective_timeout_s <= self.heartbeat_interval_s:
            raise OptionsError(
                f"collective_timeout_s={self.collective_timeout_s} is not above heartbeat_interval_s="
                f"{self.heartbeat_interval_s}; raise collective_timeout_s"
            )
        for f in ("collective_timeout_s", "heal_timeout_s"):
            if getattr(self, f) >= self.quorum_timeout_s:
                raise OptionsError(
                    f"quorum_timeout_s={self.quorum_timeout_s} is not above {f}={getattr(self, f)}, "
                    "so a group would give up on the quorum while a failed step or heal is still "
                    f"being resolved; set quorum_timeout_s above {getattr(self, f)}"
                )

    def tls(self) -> TlsFiles | None:
        """The TLS files, checked (read and parsed; OptionsError naming the option and path); None: plaintext."""
        try:
            return TlsFiles.from_values(self.tls_cert, self.tls_key, self.tls_ca)
        except lighthouse_errors.OptionsError as e:
            raise OptionsError(str(e)) from None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **explicit: Any) -> ManagerOptions:
        """Build from explicit arguments, filling the rest from the environment.

        Reads ``REPLICAFT_<FIELD>`` for every field (e.g. ``REPLICAFT_QUORUM_TIMEOUT_S``), and
        torchrun's ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` for the group. An
        empty variable means unset, except ``REPLICAFT_TOKEN``: empty there is an error, as for
        the lighthouse (it used to turn authentication off without a word). A ``REPLICAFT_*``
        variable replicaft does not read is an error naming the closest one (env_names.py).
        Raises OptionsError naming the variable or argument, its value and the fix.
        """
        env = os.environ if environ is None else environ
        check_environment(env, KNOWN_VARIABLES)
        unknown = sorted(set(explicit) - {f.name for f in fields(cls)})
        if unknown:
            raise OptionsError(f"ManagerOptions has no option {unknown[0]!r}; the options are its fields")
        values, sources = environment_values(env, {f.name: str(f.type) for f in fields(cls)})
        given = {k: v for k, v in explicit.items() if v is not None}
        for name, env_name in sources.items():
            if name in NUMBER_RANGES and name not in given:
                check_option_number(name, values[name], env_name)
        values.update(given)
        for required in ("lighthouse", "replica_id"):
            if required not in values:
                raise OptionsError(f"{required} is not set; pass it or set {ENV_PREFIX}{required.upper()}")
        return cls(**values)


assert NUMBER_RANGES.keys() == {f.name for f in fields(ManagerOptions) if f.type in ("int", "float")}, (
    "every numeric ManagerOptions field needs its range in NUMBER_RANGES"
)
KNOWN_VARIABLES = known_variable_names(f.name for f in fields(ManagerOptions))
"""Every ``REPLICAFT_*`` variable the project reads (env_names.py)."""


def check_option_number(name: str, value: Any, label: str) -> None:
    """OptionsError naming ``label`` (the field, or the variable it came from) unless ``value``
    is a finite number of ``name``'s type inside its :data:`NUMBER_RANGES` range; the one rule,
    ``lighthouse.config.option_checks.check_number``, with replicaft's error type."""
    lo, hi, fix = NUMBER_RANGES[name]
    integer = ManagerOptions.__dataclass_fields__[name].type == "int"
    check_number(label, value, lo, hi, integer=integer, fix=fix, error=OptionsError)


def _is_host_port(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and port.isascii() and port.isdigit() and int(port) <= 65535
