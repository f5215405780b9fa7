"""TLS refusals a real network meets, each told at once and in words (lighthouse/client/
handshake_refusal.py, lighthouse/tls/files.py): a plaintext client at a TLS lighthouse, a client
certificate that expired while the process ran, and a lighthouse certificate that does not name
the host dialled. Each used to be retried like a restarting lighthouse and read, at the
deadline, "no session ... is it running?".

Real lighthouse processes over TLS and real clients; certificates from one throw-away CA.
"""

from __future__ import annotations

import datetime
import time

import pytest
from conftest import LighthouseProcess, start_lighthouse

from lighthouse import LighthouseClient
from lighthouse.errors import TlsRefused
from lighthouse.tls.files import TlsFiles
from lighthouse.tls.throwaway_ca import ThrowawayCa

pytestmark = pytest.mark.timeout(60)

REFUSAL_DEADLINE_S = 5.0
"""A refused client must hear of it well within this; retried, it heard at QUORUM_TIMEOUT_S."""
QUORUM_TIMEOUT_S = 15.0
CERT_LIFETIME_S = 2.0
"""The expiring certificate's validity left when made: enough to load it, soon gone."""


@pytest.fixture(scope="module")
def ca() -> ThrowawayCa:
    return ThrowawayCa()


@pytest.fixture(scope="module")
def job(ca: ThrowawayCa, tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return ca.issue(tmp_path_factory.mktemp("job"))


def tls_args(files: TlsFiles) -> list[str]:
    return ["--tls-cert", files.cert, "--tls-key", files.key, "--tls-ca", files.ca]


@pytest.fixture
def lighthouse(job: TlsFiles) -> LighthouseProcess:
    return start_lighthouse(*tls_args(job), status=False)


def refusal(address: str, tls: TlsFiles | None) -> str:
    """The error a member's first quorum gets, checked to come soon."""
    started = time.monotonic()
    with LighthouseClient(address, "g0", tls=tls) as client, pytest.raises(TlsRefused) as refused:
        client.quorum(0, QUORUM_TIMEOUT_S)
    assert time.monotonic() - started < REFUSAL_DEADLINE_S
    return str(refused.value)


def test_a_plaintext_client_is_told_the_lighthouse_serves_tls(lighthouse: LighthouseProcess) -> None:
    message = refusal(lighthouse.grpc_address, None)
    assert f"the lighthouse at {lighthouse.grpc_address} serves TLS and this process speaks plaintext" in message
    assert "--tls-cert" in message and "$REPLICAFT_TLS_CA" in message


def test_a_certificate_that_expired_while_the_process_ran_is_named(
    ca: ThrowawayCa, lighthouse: LighthouseProcess, tmp_path_factory: pytest.TempPathFactory
) -> None:
    valid_until = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=CERT_LIFETIME_S)
    expiring = ca.issue(tmp_path_factory.mktemp("expiring"), valid_until=valid_until)  # checked: valid now
    deadline = time.monotonic() + CERT_LIFETIME_S + 5.0
    while expiring.validity_problem(datetime.datetime.now(datetime.timezone.utc)) is None:
        assert time.monotonic() < deadline, "the certificate did not expire"
        time.sleep(0.05)
    message = refusal(lighthouse.grpc_address, expiring)
    assert f"no TLS session with the lighthouse at {lighthouse.grpc_address}" in message
    assert f"tls_cert (--tls-cert, $REPLICAFT_TLS_CERT) = {expiring.cert!r}" in message
    assert "which expired on" in message


def test_a_lighthouse_certificate_without_the_dialled_host_is_named(job: TlsFiles) -> None:
    # 127.0.0.2 is loopback too (127/8), and the throw-away certificate does not name it.
    other = start_lighthouse("--host", "127.0.0.2", *tls_args(job), status=False)
    message = refusal(other.grpc_address, job)
    assert f"TLS handshake with {other.grpc_address} failed: its certificate does not name '127.0.0.2'" in message
