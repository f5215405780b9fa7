"""``python -m lighthouse`` / ``replicaft-lighthouse``: run the quorum service.

Flags map one to one onto :class:`LighthouseOptions`; bad values print a one-line error and
exit with code 2. SIGTERM and SIGINT shut the server down cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from lighthouse.config.options import TOKEN_ENV, LighthouseOptions, MembershipOptions
from lighthouse.errors import OptionsError
from lighthouse.replicated.server import ReplicatedLighthouse, ReplicationOptions
from lighthouse.server.announce import grpc_line
from lighthouse.server.binding import raise_open_file_limit
from lighthouse.server.collector import tune_for_server
from lighthouse.server.grpc_server import LighthouseServer
from lighthouse.tls.files import CA_ENV, CERT_ENV, KEY_ENV, TlsFiles


def _parser() -> argparse.ArgumentParser:
    d = MembershipOptions()
    server_defaults = LighthouseOptions()
    p = argparse.ArgumentParser(
        prog="replicaft-lighthouse",
        description="The replicaft quorum service: one per training job.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    p.add_argument("--port", type=int, default=29510, help="gRPC port; 0 picks a free one")
    p.add_argument(
        "--status-port",
        type=int,
        default=None,
        help="HTTP status page and /metrics port; 0 picks a free one (default: off)",
    )
    p.add_argument(
        "--min-replicas",
        type=int,
        default=d.min_replicas,
        help="fewest groups a quorum may have (default: %(default)s)",
    )
    p.add_argument(
        "--join-timeout",
        type=float,
        default=d.join_timeout_s,
        metavar="SECONDS",
        help="how long a quorum waits for healthy stragglers (default: %(default)s)",
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=d.heartbeat_timeout_s,
        metavar="SECONDS",
        help="the longest silence after which a group is lost (default: %(default)s)",
    )
    p.add_argument(
        "--hung-factor",
        type=float,
        default=d.hung_factor,
        help="a group silent for its longest recent gap between messages plus this many heartbeat intervals "
        "less one is hung "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--hung-min",
        type=float,
        default=d.hung_min_s,
        metavar="SECONDS",
        help="no group is declared hung on a shorter silence (default: %(default)s)",
    )
    p.add_argument(
        "--max-commit-lease",
        type=float,
        default=d.max_commit_lease_s,
        metavar="SECONDS",
        help="the longest a group may commit a step without asking whether its quorum is still current; "
        "a lost group's survivors wait at most this long more for their next quorum; 0: always ask "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--progress-timeout",
        type=float,
        default=d.progress_timeout_s,
        metavar="SECONDS",
        help="time without training progress after which a group is lost (default: %(default)s)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        default=None,
        metavar="N",
        help="incoming connections served at once (default: the open-file limit less a reserve)",
    )
    p.add_argument(
        "--handshake-timeout",
        type=float,
        default=server_defaults.handshake_timeout_s,
        metavar="SECONDS",
        help="close a connection that has not finished its handshake by then (default: %(default)s)",
    )
    p.add_argument("--token", default=None, help=f"shared secret every RPC must carry (or ${TOKEN_ENV})")
    tls = p.add_argument_group("TLS (optional; all three or none; see README, Security)")
    tls.add_argument("--tls-cert", default=None, metavar="PEM", help=f"the job's certificate (or ${CERT_ENV})")
    tls.add_argument("--tls-key", default=None, metavar="PEM", help=f"its private key (or ${KEY_ENV})")
    tls.add_argument(
        "--tls-ca",
        default=None,
        metavar="PEM",
        help=f"the CA that signed the job's certificates; callers must present one (or ${CA_ENV})",
    )
    ha = p.add_argument_group("replicated lighthouse (optional; see README)")
    ha.add_argument(
        "--etcd",
        default=None,
        metavar="HOST:PORT[,HOST:PORT...]",
        help="run as one of a replicated set, leading through a lease in this etcd cluster",
    )
    ha.add_argument(
        "--advertise",
        default=None,
        metavar="HOST:PORT",
        help="address members reach this lighthouse at (default: --host:--port once bound)",
    )
    ha.add_argument(
        "--etcd-prefix", default="/replicaft/default", help="this job's keys in etcd (default: %(default)s)"
    )
    ha.add_argument(
        "--lease-ttl",
        type=int,
        default=2,
        metavar="SECONDS",
        help="the leader's etcd lease; a partitioned leader costs about this long (default: %(default)s)",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def options_from_args(args: argparse.Namespace) -> LighthouseOptions:
    return LighthouseOptions(
        host=args.host,
        port=args.port,
        status_port=args.status_port,
        membership=MembershipOptions(
            min_replicas=args.min_replicas,
            join_timeout_s=args.join_timeout,
            heartbeat_timeout_s=args.heartbeat_timeout,
            progress_timeout_s=args.progress_timeout,
            hung_factor=args.hung_factor,
            hung_min_s=args.hung_min,
            max_commit_lease_s=args.max_commit_lease,
        ),
        max_connections=args.max_connections,
        handshake_timeout_s=args.handshake_timeout,
        token=args.token if args.token is not None else LighthouseOptions.token_from_env(),
        tls=TlsFiles.from_env(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca),
    )


def replication_from_args(args: argparse.Namespace, options: LighthouseOptions) -> ReplicationOptions | None:
    if args.etcd is None:
        return None
    if args.advertise is None and (options.port == 0 or options.host in ("0.0.0.0", "::")):
        raise OptionsError(
            "--advertise is required with --etcd when --port is 0 or --host is a wildcard: "
            "followers and members must be told a reachable host:port"
        )
    return ReplicationOptions(
        etcd_endpoints=tuple(e.strip() for e in args.etcd.split(",") if e.strip()),
        advertise=args.advertise or f"{options.host}:{options.port}",
        prefix=args.etcd_prefix,
        lease_ttl_s=args.lease_ttl,
    )


def parse_options(argv: list[str]) -> tuple[LighthouseOptions, ReplicationOptions | None]:
    """The options this CLI's flags ``argv`` describe, for a lighthouse started from code (the Ray
    actor, replicaft/ray/lighthouse_actor.py); raises OptionsError naming a bad or unknown flag
    where the CLI would print it and exit."""
    parser = _parser()
    parser.exit_on_error = False
    parser.allow_abbrev = False  # flags written in code are written out
    try:
        args, unknown = parser.parse_known_args(argv)
    except argparse.ArgumentError as e:
        raise OptionsError(f"lighthouse flags {argv}: {e}") from None
    if unknown:
        raise OptionsError(f"lighthouse flags {argv}: unknown {unknown} (see replicaft-lighthouse --help)")
    options = options_from_args(args)
    return options, replication_from_args(args, options)


async def _serve(options: LighthouseOptions, replication: ReplicationOptions | None) -> None:
    # Handlers first: whoever reads the address below may send SIGTERM at once.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server: LighthouseServer | ReplicatedLighthouse = (
        LighthouseServer(options) if replication is None else ReplicatedLighthouse(options, replication)
    )
    addresses = await server.start()
    print(grpc_line(addresses.grpc), flush=True)
    if addresses.status:
        print(f"lighthouse status page at {addresses.status}", flush=True)
    await stop.wait()
    await server.stop()
    print("lighthouse stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        options = options_from_args(args)
        replication = replication_from_args(args, options)
    except OptionsError as e:
        print(f"replicaft-lighthouse: error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    raise_open_file_limit()
    tune_for_server()
    try:
        asyncio.run(_serve(options, replication))
    except OSError as e:
        print(f"replicaft-lighthouse: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
