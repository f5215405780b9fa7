"""Where a Ray worker is reached from other nodes: the node's address, and the interface holding it.

A replica group's rank serves its TCPStore and state server at ``REPLICAFT_HOST`` and Gloo binds
the interface ``GLOO_SOCKET_IFNAME`` names (deploy/README.md says why both are needed across
hosts). Under Ray the node's address is Ray's own (``ray.util.get_node_ip_address``); the
interface is found by asking the kernel for each interface's IPv4 address (``SIOCGIFADDR``),
which needs no ``ip`` command in the worker's image.
"""

from __future__ import annotations

import fcntl
import socket
import struct

SIOCGIFADDR = 0x8915
"""``<linux/sockios.h>``: an interface's IPv4 address."""


def interface_of(address: str) -> str | None:
    """The name of the interface holding the IPv4 ``address``, or None (not this host's, or IPv6)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                reply = fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:  # down, or no IPv4 address
                continue
            if socket.inet_ntoa(reply[20:24]) == address:
                return name
    return None
