"""The lighthouse's handshake bound holds over TLS too (lighthouse/server/binding.py): a client
that connects and never finishes its TLS handshake, silent or stopped halfway through its
ClientHello, is dropped at ``--handshake-timeout``, as a plaintext one is
(test_lighthouse_bounds.py). A real lighthouse process and raw sockets."""

from __future__ import annotations

import socket
import time

import pytest
from conftest import closed_within, start_lighthouse

from lighthouse.tls.throwaway_ca import make_throwaway_ca

pytestmark = pytest.mark.timeout(60)

HANDSHAKE_TIMEOUT_S = 0.5
SLACK_S = 1.0
PARTIAL_CLIENT_HELLO = b"\x16\x03\x01\x00\xff\x01"
"""A TLS record header announcing a 255-byte ClientHello, and its first byte: never finished."""


@pytest.mark.parametrize("sent", [b"", PARTIAL_CLIENT_HELLO], ids=["silent", "half_a_client_hello"])
def test_a_tls_handshake_never_finished_is_dropped_at_the_handshake_timeout(
    sent: bytes, tmp_path_factory: pytest.TempPathFactory
) -> None:
    files = make_throwaway_ca(tmp_path_factory.mktemp("tls"))
    lighthouse = start_lighthouse(
        "--handshake-timeout",
        str(HANDSHAKE_TIMEOUT_S),
        "--tls-cert",
        files.cert,
        "--tls-key",
        files.key,
        "--tls-ca",
        files.ca,
        status=False,
    )
    host, port = lighthouse.grpc_address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(sent)
        connected = time.monotonic()
        assert closed_within(sock, HANDSHAKE_TIMEOUT_S + 5.0)
        assert time.monotonic() - connected < HANDSHAKE_TIMEOUT_S + SLACK_S
