"""TLS on every channel of a job (lighthouse/tls/files.py): options checked at start, real servers
over TLS, and a peer with another CA refused with an error that says so, not a hang.

The lighthouse runs as a real process; state servers run in this process (plain threads on
real sockets, as in test_transfer.py). Certificates are made per test by the throw-away CA.
"""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from conftest import ManagedProcess, spawn_python, start_lighthouse, stop_gracefully
from support.training_events import EXAMPLE, assert_digests_agree, wait_for_event

from lighthouse import LighthouseClient
from lighthouse.errors import OptionsError, TlsRefused
from lighthouse.tls.files import TlsFiles, tls_refusal
from lighthouse.tls.throwaway_ca import make_throwaway_ca
from replicaft.errors import HealError
from replicaft.state.flat import flatten
from replicaft.transfer.client import fetch_state
from replicaft.transfer.donors import Donor
from replicaft.transfer.server import StateServer
from replicaft.transfer.snapshot import Snapshot

REFUSAL_DEADLINE_S = 5.0
"""A refused peer must hear of it well within this; a hang would last the whole call deadline."""


@pytest.fixture(scope="module")
def job_ca(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_throwaway_ca(tmp_path_factory.mktemp("job-ca"))


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_throwaway_ca(tmp_path_factory.mktemp("other-ca"), name="another job")


def tls_args(files: TlsFiles) -> list[str]:
    return ["--tls-cert", files.cert, "--tls-key", files.key, "--tls-ca", files.ca]


# -- options ----------------------------------------------------------------------------------


def test_no_tls_files_means_plaintext() -> None:
    assert TlsFiles.from_env({}) is None


def test_missing_file_is_refused_naming_option_and_path(job_ca: TlsFiles, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(
        OptionsError, match=r"tls_key \(--tls-key, \$REPLICAFT_TLS_KEY\) = '.*nope\.pem' cannot be read"
    ):
        TlsFiles(cert=job_ca.cert, key=missing, ca=job_ca.ca)


def test_unreadable_file_is_refused_naming_option_and_path(job_ca: TlsFiles, tmp_path: Path) -> None:
    with pytest.raises(OptionsError, match=r"tls_ca .* = '.*' cannot be read \(Is a directory\)"):
        TlsFiles(cert=job_ca.cert, key=job_ca.key, ca=str(tmp_path))


def test_partial_set_is_refused_naming_the_missing_ones(job_ca: TlsFiles) -> None:
    with pytest.raises(OptionsError, match=r"not tls_key .* and tls_ca"):
        TlsFiles.from_env({"REPLICAFT_TLS_CERT": job_ca.cert})


def test_flag_wins_over_variable(job_ca: TlsFiles, other_ca: TlsFiles) -> None:
    env = {"REPLICAFT_TLS_CERT": other_ca.cert, "REPLICAFT_TLS_KEY": job_ca.key, "REPLICAFT_TLS_CA": job_ca.ca}
    assert TlsFiles.from_env(env, cert=job_ca.cert) == job_ca


def test_key_of_another_certificate_is_refused(job_ca: TlsFiles, other_ca: TlsFiles) -> None:
    with pytest.raises(OptionsError, match="are not a certificate and its matching private key"):
        TlsFiles(cert=job_ca.cert, key=other_ca.key, ca=job_ca.ca)


def test_non_pem_file_is_refused(job_ca: TlsFiles, tmp_path: Path) -> None:
    junk = tmp_path / "cert.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(OptionsError, match="holds no PEM block"):
        TlsFiles(cert=str(junk), key=job_ca.key, ca=job_ca.ca)


def test_throwaway_certificate_names_loopback_and_the_hosts_given(tmp_path: Path) -> None:
    from cryptography import x509

    files = make_throwaway_ca(tmp_path, hosts=("h1", "10.0.0.5"))
    cert = x509.load_pem_x509_certificate(Path(files.cert).read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(n.value) for n in names} == {"127.0.0.1", "::1", "localhost", "h1", "10.0.0.5"}
    assert Path(files.key).stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("details", "refused"),
    [
        (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Tls handshake failed "
            "(TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL "
            "routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED",
            True,
        ),
        (
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.2:1: Custom verification check "
            "failed with error: UNAUTHENTICATED: Hostname Verification Check failed.",
            True,
        ),
        ("failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: Connection refused", False),
        ("Socket closed", False),
    ],
)
def test_only_a_failed_handshake_reads_as_a_tls_refusal(details: str, refused: bool) -> None:
    assert (tls_refusal(details, "127.0.0.1:1") is not None) is refused


def test_manager_options_take_the_tls_variables_and_check_them(job_ca: TlsFiles, tmp_path: Path) -> None:
    from replicaft.config.options import ManagerOptions
    from replicaft.errors import OptionsError as ReplicaftOptionsError

    env = {
        "REPLICAFT_LIGHTHOUSE": "127.0.0.1:1",
        "REPLICAFT_REPLICA_ID": "g0",
        "REPLICAFT_TLS_CERT": job_ca.cert,
        "REPLICAFT_TLS_KEY": job_ca.key,
        "REPLICAFT_TLS_CA": job_ca.ca,
    }
    assert ManagerOptions.from_env(env).tls() == job_ca
    with pytest.raises(ReplicaftOptionsError, match=r"tls_ca .* = '.*missing\.pem' cannot be read"):
        ManagerOptions.from_env({**env, "REPLICAFT_TLS_CA": str(tmp_path / "missing.pem")})
    with pytest.raises(ReplicaftOptionsError, match="not tls_key"):
        ManagerOptions.from_env({k: v for k, v in env.items() if k != "REPLICAFT_TLS_KEY"})


def test_lighthouse_with_a_missing_file_exits_with_a_one_line_error(job_ca: TlsFiles, tmp_path: Path) -> None:
    from lighthouse.__main__ import main

    assert (
        main(["--port", "0", "--tls-cert", job_ca.cert, "--tls-key", str(tmp_path / "k.pem"), "--tls-ca", job_ca.ca])
        == 2
    )


# -- the lighthouse ---------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_lighthouse_over_tls_forms_quorum_and_serves_its_page_over_https(job_ca: TlsFiles, other_ca: TlsFiles) -> None:
    lighthouse = start_lighthouse(*tls_args(job_ca), "--min-replicas", "1")
    assert lighthouse.status_url is not None and lighthouse.status_url.startswith("https://")
    with LighthouseClient(lighthouse.grpc_address, "g0", tls=job_ca) as client:
        quorum = client.quorum(0, 10.0)
        assert quorum.replica_ids == ("g0",)
        assert client.fence(quorum.quorum_id, 0, 5.0).ok
        page = urllib.request.urlopen(
            lighthouse.status_url + "status.json", timeout=5, context=ssl.create_default_context(cafile=job_ca.ca)
        )
        assert [m["replica_id"] for m in json.load(page)["members"]] == ["g0"]
    started = time.monotonic()
    with LighthouseClient(lighthouse.grpc_address, "stranger", tls=other_ca) as stranger:
        with pytest.raises(TlsRefused, match="TLS handshake with .* failed.*CERTIFICATE_VERIFY_FAILED"):
            stranger.quorum(0, 30.0)
    assert time.monotonic() - started < REFUSAL_DEADLINE_S
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(lighthouse.status_url, timeout=5, context=ssl.create_default_context(cafile=other_ca.ca))
    assert stop_gracefully(lighthouse.process) == 0


@pytest.mark.timeout(60)
def test_session_over_tls_survives_a_lighthouse_restart(job_ca: TlsFiles) -> None:
    """Over TLS a call does not wait for a ready channel (it would never hear of a failed
    handshake), so a restart is bridged by the session's reconnects instead: checked here."""
    lighthouse = start_lighthouse(*tls_args(job_ca), status=False)
    with LighthouseClient(lighthouse.grpc_address, "g0", tls=job_ca) as client:
        first = client.quorum(0, 10.0)
        lighthouse.process.kill()
        lighthouse.process.wait_exit(10)
        start_lighthouse(*tls_args(job_ca), port=lighthouse.port, status=False)
        assert client.quorum(1, 20.0).replica_ids == first.replica_ids


# -- the state server -------------------------------------------------------------------------


def small_snapshot(step: int = 3) -> Snapshot:
    state = {"w": torch.arange(200_000, dtype=torch.float32), "step": step}
    return Snapshot.capture(flatten(state), step=step, quorum_id=1, replica_id="donor", chunk_bytes=64 * 1024)


def test_heal_over_tls_receives_the_state_bitwise(job_ca: TlsFiles) -> None:
    snapshot = small_snapshot()
    server = StateServer("127.0.0.1", "tok", tls=job_ca.server_context())
    address = server.start()
    server.publish(snapshot)
    try:
        result = fetch_state([Donor("donor", address)], 3, token="tok", timeout_s=10.0, tls=job_ca.client_context())
    finally:
        server.stop()
    assert torch.equal(result.tensors[0], torch.arange(200_000, dtype=torch.float32))


@pytest.mark.parametrize("healer", ["other_ca", "plaintext"])
def test_heal_from_a_tls_donor_is_refused_to_a_stranger(job_ca: TlsFiles, other_ca: TlsFiles, healer: str) -> None:
    server = StateServer("127.0.0.1", tls=job_ca.server_context())
    address = server.start()
    server.publish(small_snapshot())
    context = other_ca.client_context() if healer == "other_ca" else None
    started = time.monotonic()
    try:
        with pytest.raises(
            HealError, match="TLS handshake .* failed" if healer == "other_ca" else "served the manifest"
        ):
            fetch_state([Donor("donor", address)], 3, token=None, timeout_s=30.0, tls=context)
    finally:
        server.stop()
    assert time.monotonic() - started < REFUSAL_DEADLINE_S


# -- a whole job ------------------------------------------------------------------------------


def start_tls_group(
    lighthouse: str, replica_id: str, events: Path, files: TlsFiles, *args: str, ranks: int = 1
) -> ManagedProcess:
    env = dict(os.environ)
    env.pop("REPLICAFT_FAULT_POINTS", None)
    env.update(
        REPLICAFT_LIGHTHOUSE=lighthouse,
        REPLICAFT_REPLICA_ID=replica_id,
        REPLICAFT_EVENTS_DIR=str(events),
        REPLICAFT_TOKEN="job-secret",
        REPLICAFT_TLS_CERT=files.cert,
        REPLICAFT_TLS_KEY=files.key,
        REPLICAFT_TLS_CA=files.ca,
    )
    runner = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)) if ranks > 1 else ()
    return spawn_python(*runner, EXAMPLE, *args, name=replica_id, env=env)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_job_over_tls_commits_heals_and_refuses_a_group_of_another_ca(
    job_ca: TlsFiles, other_ca: TlsFiles, tmp_path: Path
) -> None:
    """Every channel over TLS: each group's two ranks talk through its group manager (gRPC), g1 joins
    late and heals from g0's state server, both hold the lighthouse session; a group given
    another CA stops with an error naming the TLS handshake instead of waiting out its deadline."""
    lh = start_lighthouse(*tls_args(job_ca), "--token", "job-secret", status=False)
    g0 = start_tls_group(lh.grpc_address, "g0", tmp_path, job_ca, "--steps", "150", "--step-delay", "0.1", ranks=2)
    wait_for_event(
        tmp_path,
        lambda e: (
            e["event"] == "commit"
            and e["replica_id"] == "g0"
            and e["group_rank"] == 1
            and e["committed"]
            and e["step"] >= 5
        ),
        120,
        "g0 rank 1 committing over TLS",
    )
    g1 = start_tls_group(lh.grpc_address, "g1", tmp_path, job_ca, "--steps", "150", "--step-delay", "0.1", ranks=2)
    heal = wait_for_event(tmp_path, lambda e: e["event"] == "heal_end" and e["replica_id"] == "g1", 90, "g1 heal")
    assert heal["ok"] and heal["num_bytes"] > 0, heal
    wait_for_event(
        tmp_path,
        lambda e: e["event"] == "commit" and e["replica_id"] == "g1" and e["committed"] and e["num_contributors"] == 2,
        60,
        "g1 committing with g0",
    )
    stranger = start_tls_group(lh.grpc_address, "g9", tmp_path / "stranger", other_ca, "--steps", "5")
    assert stranger.wait_exit(60) != 0
    assert "TLS handshake with" in stranger.output_tail() and "CERTIFICATE_VERIFY_FAILED" in stranger.output_tail()
    for rid, g in (("g0", g0), ("g1", g1)):
        assert g.wait_exit(120) == 0, f"{rid}\n{g.output_tail()}"
    assert_digests_agree(tmp_path, min_steps=140)
