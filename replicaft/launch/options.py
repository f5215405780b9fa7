"""The launcher's command line: every argument checked once, before anything starts."""

from __future__ import annotations

import argparse
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NoReturn

from lighthouse.config.option_checks import MAX_SECONDS, check_number
from lighthouse.config.options import MAX_MEMBERS, TOKEN_ENV
from lighthouse.wire.replica_id import check_replica_id
from replicaft.errors import OptionsError

PROG = "replicaft-launch"

MAX_LOCAL_PROCESSES = 1024
"""Groups, ranks per group or standbys on one machine: each is a process with its own ports,
and past this the machine's limits decide, not replicaft; a cluster's scheduler starts more."""
MAX_RESTARTS = 1_000_000
"""Restarts per group; at the shortest delay, more than a job restarting for weeks."""

NUMBER_FLAGS: dict[str, tuple[str, float, float]] = {
    # field: (its flag, lowest, highest). Every int and float field of LaunchOptions is here
    # (checked at import): NaN, inf, a negative or a huge value is refused naming the flag
    # (a NaN --restart-delay left dead groups never restarted, issue 19).
    "num_groups": ("--groups", 1, MAX_LOCAL_PROCESSES),
    "ranks_per_group": ("--ranks-per-group", 1, MAX_LOCAL_PROCESSES),
    "restart_delay_s": ("--restart-delay", 0.0, MAX_SECONDS),
    "max_restarts": ("--max-restarts", 0, MAX_RESTARTS),
    "min_replicas": ("--min-replicas", 1, MAX_MEMBERS),
    "status_interval_s": ("--status-interval", 0.001, MAX_SECONDS),
    "stop_grace_s": ("--stop-grace", 0.001, MAX_SECONDS),
    "standbys": ("--standbys", 0, MAX_LOCAL_PROCESSES),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class LaunchOptions:
    script: Path
    """The training script every rank of every group runs."""
    script_args: tuple[str, ...] = ()
    lighthouse: str | None = None
    """``host:port`` of a running lighthouse; None starts one on a free loopback port."""
    num_groups: int = 2
    ranks_per_group: int = 1
    """W; above 1 each group runs under torchrun."""
    restart_delay_s: float = 1.0
    max_restarts: int = 10
    """Restarts allowed per group; one more failure leaves the group down."""
    events_dir: Path | None = None
    """Where the groups write their event logs; None uses a temporary directory."""
    min_replicas: int | None = None
    """Passed to the lighthouse and to every manager; None keeps their default."""
    replica_prefix: str = "g"
    status_interval_s: float = 5.0
    """Period of the plain status line when stderr is not a terminal."""
    stop_grace_s: float = 10.0
    """Time between SIGTERM and SIGKILL when stopping a process."""
    standbys: int | None = None
    """Warm standby processes kept for restarts; None: 1 with W = 1, 0 otherwise."""
    standby_reserve: bool = True
    """Have each standby fault in memory for the restarted group's buckets and heal (reserve.py)."""
    torchft: bool = False
    """SCRIPT is a torchft program: ``import torchft`` resolves to replicaft's shim (the alias
    folder leads the groups' PYTHONPATH), and each group gets torchft's ``REPLICA_GROUP_ID``
    (its index) and ``NUM_REPLICA_GROUPS``, which torchft's examples read."""

    def __post_init__(self) -> None:
        for name, (flag, lo, hi) in NUMBER_FLAGS.items():
            value, kind = getattr(self, name), _FIELD_TYPES[name]
            if value is not None or not kind.endswith("| None"):
                check_number(
                    flag,
                    value,
                    lo,
                    hi,
                    integer=kind.startswith("int"),
                    error=OptionsError,
                    fix="in seconds" if kind.startswith("float") else "",
                )
        if not isinstance(self.standby_reserve, bool):
            raise OptionsError(f"standby_reserve={self.standby_reserve!r}; give True or False (--no-standby-reserve)")
        if self.lighthouse is not None:
            host, _, port = self.lighthouse.rpartition(":")
            if not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
                raise OptionsError(f"--lighthouse {self.lighthouse!r} is not host:port (e.g. 127.0.0.1:29510)")
        if self.min_replicas is not None and self.lighthouse is None and self.min_replicas > self.num_groups:
            raise OptionsError(
                f"--min-replicas {self.min_replicas} is more than --groups {self.num_groups}, so no "
                f"quorum could ever form; lower --min-replicas or raise --groups"
            )
        if self.standbys and self.ranks_per_group > 1:
            raise OptionsError(
                f"--standbys {self.standbys} with --ranks-per-group {self.ranks_per_group}: torchrun starts the "
                "ranks of a W > 1 group, so they cannot run in a standby; use --standbys 0"
            )
        if not isinstance(self.torchft, bool):
            raise OptionsError(f"torchft={self.torchft!r}; give True or False (--torchft)")
        if not isinstance(self.replica_prefix, str):
            raise OptionsError(f"--replica-prefix {self.replica_prefix!r}; give a string such as 'g'")
        # The one rule for replica ids (lighthouse/wire/replica_id.py); the last id is the longest.
        check_replica_id(
            f"{self.replica_prefix}{self.num_groups - 1}",
            error=OptionsError,
            where=f"--replica-prefix {self.replica_prefix!r}: the replica id",
        )

    def replica_ids(self) -> list[str]:
        return [f"{self.replica_prefix}{i}" for i in range(self.num_groups)]

    def num_standbys(self) -> int:
        if self.standbys is not None:
            return self.standbys
        return 1 if self.ranks_per_group == 1 else 0


_FIELD_TYPES = {f.name: str(f.type) for f in fields(LaunchOptions)}
assert NUMBER_FLAGS.keys() == {n for n, t in _FIELD_TYPES.items() if t.split(" |")[0] in ("int", "float")}, (
    "every numeric LaunchOptions field needs its flag and range in NUMBER_FLAGS"
)


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so every error is one line."""

    def error(self, message: str) -> NoReturn:
        raise OptionsError(message)


def parse_args(argv: Sequence[str] | None = None) -> LaunchOptions:
    """Map the command line onto :class:`LaunchOptions`; raises OptionsError naming the flag."""
    d = LaunchOptions(script=Path())
    p = _Parser(prog=PROG, description="Run a lighthouse and N replica groups of SCRIPT; restart groups that die.")
    p.add_argument("--lighthouse", metavar="HOST:PORT", help="use this lighthouse instead of starting one")
    p.add_argument(
        "--groups", type=int, default=d.num_groups, metavar="N", help="replica groups (default: %(default)s)"
    )
    p.add_argument(
        "--ranks-per-group",
        type=int,
        default=d.ranks_per_group,
        metavar="W",
        help="ranks per group; above 1 runs each group under torchrun (default: %(default)s)",
    )
    p.add_argument(
        "--restart-delay",
        type=float,
        default=d.restart_delay_s,
        metavar="S",
        help="seconds before a dead group is restarted (default: %(default)s)",
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=d.max_restarts,
        metavar="K",
        help="restarts per group before it is left down (default: %(default)s)",
    )
    p.add_argument("--events-dir", type=Path, metavar="DIR", help="keep the groups' event logs here")
    p.add_argument("--min-replicas", type=int, metavar="M", help="fewest groups a quorum may have")
    p.add_argument("--replica-prefix", default=d.replica_prefix, help="replica ids are PREFIX0, PREFIX1, ...")
    p.add_argument(
        "--status-interval",
        type=float,
        default=d.status_interval_s,
        metavar="S",
        help="period of the status line when stderr is not a terminal (default: %(default)s)",
    )
    p.add_argument(
        "--stop-grace",
        type=float,
        default=d.stop_grace_s,
        metavar="S",
        help="seconds between SIGTERM and SIGKILL when stopping (default: %(default)s)",
    )
    p.add_argument(
        "--standbys",
        type=int,
        metavar="K",
        help="warm standby processes (torch already imported) that restarted groups run in; "
        "W = 1 only (default: 1 with W = 1, else 0)",
    )
    p.add_argument(
        "--no-standby-reserve",
        dest="standby_reserve",
        action="store_false",
        help="do not have standbys fault in memory the size of a group's state for its restart "
        "(each then holds ~300 MB instead of that much more)",
    )
    p.add_argument(
        "--torchft",
        action="store_true",
        help="SCRIPT is a torchft program: `import torchft` runs on replicaft's shim, and each group "
        "gets REPLICA_GROUP_ID and NUM_REPLICA_GROUPS",
    )
    p.add_argument("script", metavar="SCRIPT", help="training script")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for SCRIPT")
    args = p.parse_args(argv)
    script = Path(args.script)
    if not script.is_file():
        raise OptionsError(f"SCRIPT {args.script!r} is not a file")
    if args.events_dir is not None and args.events_dir.exists() and not args.events_dir.is_dir():
        raise OptionsError(f"--events-dir {str(args.events_dir)!r} exists and is not a directory")
    return LaunchOptions(
        script=script,
        script_args=tuple(args.script_args),
        lighthouse=args.lighthouse,
        num_groups=args.groups,
        ranks_per_group=args.ranks_per_group,
        restart_delay_s=args.restart_delay,
        max_restarts=args.max_restarts,
        events_dir=args.events_dir,
        min_replicas=args.min_replicas,
        replica_prefix=args.replica_prefix,
        status_interval_s=args.status_interval,
        stop_grace_s=args.stop_grace,
        standbys=args.standbys,
        standby_reserve=args.standby_reserve,
        torchft=args.torchft,
    )


def job_secret(options: LaunchOptions, environ: Mapping[str, str]) -> dict[str, str]:
    """``{REPLICAFT_TOKEN: secret}`` to add to every child's environment, or nothing.

    A fresh secret when the launcher starts the lighthouse itself and the caller set no token;
    nothing when the caller set one (it is inherited, even empty, which the children refuse
    by name) or the lighthouse is someone else's (its token is the caller's to set)."""
    if options.lighthouse is not None or TOKEN_ENV in environ:
        return {}
    return {TOKEN_ENV: secrets.token_urlsafe(32)}
