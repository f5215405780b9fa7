"""Binding the lighthouse's gRPC server, with errors that say what failed.

A ``--host`` that does not resolve used to be reported as "address in use?" (issue 19): grpc
only says that binding failed. So the name is resolved first, and when grpc still fails the
OS is asked why, with a plain socket bound the same way.
"""

from __future__ import annotations

import asyncio
import resource
import socket

import grpc

from lighthouse.config.options import LighthouseOptions
from lighthouse.tls.files import add_port
from lighthouse.wire import envelope

SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", envelope.MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", envelope.MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 1000),
]

RESERVED_DESCRIPTORS = 256
"""Open files the lighthouse keeps for itself past its members' connections: the status page,
the etcd client of a replicated lighthouse, logs. A flood of connections takes at most the
rest, so it is refused at accept instead of failing the lighthouse's own files with EMFILE."""

MIN_CONNECTIONS = 64


def default_max_connections() -> int:
    """Incoming connections the process's open-file limit leaves room for (a group's rank 0
    holds its session's channel and, in a group of one rank, its fence's: two, three while it
    reconnects)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(MIN_CONNECTIONS, soft - RESERVED_DESCRIPTORS)


def raise_open_file_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit, as servers that hold a
    connection per client do (a 1,024-member job needs more than the usual soft 1,024), and
    return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft
    return hard


async def bind_grpc(options: LighthouseOptions, handler: grpc.GenericRpcHandler) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server with ``handler``, bound to the options' host and port (over TLS when
    they name TLS files) but not started, and the port it bound (port 0 picks one). Raises
    OSError naming what failed and the fix.

    Connections past ``max_connections`` (None: what the open-file limit leaves, see
    :func:`default_max_connections`) are closed as they are accepted, and one that has not
    finished its TLS and HTTP/2 handshake within ``handshake_timeout_s`` is closed (grpc's
    own default held a silent socket for two minutes)."""
    host, port, tls, max_connections = options.host, options.port, options.tls, options.max_connections
    try:
        await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise OSError(
            f"lighthouse could not resolve --host {host!r} ({e.strerror}); give an address of "
            "this machine (127.0.0.1, 0.0.0.0, ::) or a name that resolves to one"
        ) from e
    cap = default_max_connections() if max_connections is None else max_connections
    server = grpc.aio.server(
        options=[
            *SERVER_OPTIONS,
            ("grpc.max_allowed_incoming_connections", cap),
            ("grpc.server_handshake_timeout_ms", round(options.handshake_timeout_s * 1000)),
        ]
    )
    server.add_generic_rpc_handlers((handler,))
    bind = f"[{host}]" if ":" in host else host
    cause: Exception | None = None
    try:
        bound = add_port(server, f"{bind}:{port}", tls)
    except RuntimeError as e:  # recent grpcio raises where older ones returned port 0
        bound, cause = 0, e
    if bound == 0:
        await server.stop(0)
        raise OSError(
            f"lighthouse could not bind {host}:{port} ({_bind_problem(host, port)}); pick "
            "another --port (0 for any free one), or a --host that is an address of this machine"
        ) from cause
    return server, bound


def _bind_problem(host: str, port: int) -> str:
    """Why ``host:port`` cannot be bound, as the OS says it (grpc only reports that it failed)."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as e:
        return e.strerror or str(e)
    return "grpc refused it, though a plain socket could bind it"
