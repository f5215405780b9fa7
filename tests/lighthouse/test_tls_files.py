"""Certificates that would fail every handshake are refused when the TLS files are loaded
(lighthouse/tls/certificates.py): an expired job certificate and a CA file holding no CA's
certificate, by the lighthouse and by the manager alike, with the option, the file and the
problem named."""

from __future__ import annotations

import datetime
import re

import pytest

from lighthouse.__main__ import main
from lighthouse.errors import OptionsError
from lighthouse.tls.files import TlsFiles
from lighthouse.tls.throwaway_ca import ThrowawayCa, make_throwaway_ca
from replicaft.config.options import ManagerOptions
from replicaft.errors import OptionsError as ReplicaftOptionsError

EXPIRED = (
    r"tls_cert \(--tls-cert, \$REPLICAFT_TLS_CERT\) = '.*cert\.pem' holds the certificate 'CN=replicaft job', "
    r"which expired on 20\d\d-.* UTC, so every TLS handshake would fail"
)
NOT_A_CA = r"tls_ca \(--tls-ca, \$REPLICAFT_TLS_CA\) = '.*cert\.pem' holds 'CN=replicaft job', which is not a CA"


@pytest.fixture(scope="module")
def job_ca(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_throwaway_ca(tmp_path_factory.mktemp("job-ca"))


@pytest.fixture(scope="module")
def expired(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    """Paths of a set whose job certificate expired a day ago (its CA is valid)."""
    directory = tmp_path_factory.mktemp("expired")
    yesterday = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=1)
    with pytest.raises(OptionsError, match=EXPIRED):
        ThrowawayCa().issue(directory, valid_until=yesterday)
    return str(directory / "cert.pem"), str(directory / "key.pem"), str(directory / "ca.pem")


def test_a_certificate_given_as_the_ca_is_refused_naming_the_file(job_ca: TlsFiles) -> None:
    with pytest.raises(OptionsError, match=NOT_A_CA):
        TlsFiles(cert=job_ca.cert, key=job_ca.key, ca=job_ca.cert)


def test_the_lighthouse_refuses_an_expired_certificate_at_start(
    expired: tuple[str, str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    cert, key, ca = expired
    assert main(["--port", "0", "--tls-cert", cert, "--tls-key", key, "--tls-ca", ca]) == 2
    assert re.search(EXPIRED, capsys.readouterr().err)


def test_the_manager_refuses_an_expired_certificate_and_a_non_ca(
    expired: tuple[str, str, str], job_ca: TlsFiles
) -> None:
    cert, key, ca = expired
    env = {"REPLICAFT_LIGHTHOUSE": "127.0.0.1:1", "REPLICAFT_REPLICA_ID": "g0"}
    tls = {"REPLICAFT_TLS_CERT": cert, "REPLICAFT_TLS_KEY": key, "REPLICAFT_TLS_CA": ca}
    with pytest.raises(ReplicaftOptionsError, match=EXPIRED):
        ManagerOptions.from_env({**env, **tls})
    tls = {"REPLICAFT_TLS_CERT": job_ca.cert, "REPLICAFT_TLS_KEY": job_ca.key, "REPLICAFT_TLS_CA": job_ca.cert}
    with pytest.raises(ReplicaftOptionsError, match=NOT_A_CA):
        ManagerOptions.from_env({**env, **tls})
