"""TLS for every channel of a job: one set of files, checked once, turned into each kind of context.

A job that asks for encryption in transit gives every process the same three PEM files: a
certificate and its key (the job's identity; it must name the addresses peers dial, e.g.
127.0.0.1 and localhost for a local job) and the CA that signed it. With them:

* every server (the lighthouse's gRPC, a group's manager server, the state server, the
  status page) presents the certificate;
* every client verifies the server's certificate against the CA, host name included, and
  presents the same certificate, which the gRPC servers and the state server require: mutual
  TLS at no extra setup, since every process holds the job's files anyway. The status page
  asks for no client certificate, so a browser given the CA can read it;
* a peer whose certificate another CA signed, or that speaks plaintext, is refused at the
  handshake, and the error says so (:func:`tls_refusal` reads gRPC's failure text) instead of
  the client waiting out its deadline.

The files come from one options surface, :class:`TlsFiles`: flags ``--tls-cert``,
``--tls-key``, ``--tls-ca``, variables ``REPLICAFT_TLS_CERT`` / ``_KEY`` / ``_CA``, or the
``tls_cert`` / ``tls_key`` / ``tls_ca`` fields of the manager's options. All three or none;
each is read and parsed when the options are built, so a missing, unreadable or malformed file,
an expired certificate or a CA file that holds no CA's certificate (certificates.py) is an error
at start naming the option and the path, not a failed handshake later.

Tokens (``REPLICAFT_TOKEN``, the job secret) still authenticate calls: TLS keeps them and the
state's bytes from being read or altered on the way, the token says the caller belongs to the
job. Torch-free, like the rest of the lighthouse package; certificates for a local job are made
by ``replicaft.throwaway_ca``.
"""

from __future__ import annotations

import datetime
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from lighthouse.errors import OptionsError, TlsRefused
from lighthouse.tls.certificates import ca_problem, certificate_problem

CERT_ENV = "REPLICAFT_TLS_CERT"
KEY_ENV = "REPLICAFT_TLS_KEY"
CA_ENV = "REPLICAFT_TLS_CA"

_SPELLINGS = {
    "cert": f"tls_cert (--tls-cert, ${CERT_ENV})",
    "key": f"tls_key (--tls-key, ${KEY_ENV})",
    "ca": f"tls_ca (--tls-ca, ${CA_ENV})",
}
_WHAT = {"cert": "the job's certificate", "key": "the certificate's private key", "ca": "the CA certificate"}

LOCAL_HOSTS = ("127.0.0.1", "::1", "localhost")
"""The loopback names, which a throw-away certificate always names (throwaway_ca.py)."""

HANDSHAKE_TIMEOUT_S = 10.0
"""How long a state server waits for a connection's TLS handshake (a thread per connection)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TlsFiles:
    """The job's certificate, its key and the CA, as PEM file paths, checked when built."""

    cert: str
    key: str
    ca: str

    def __post_init__(self) -> None:
        for field in ("cert", "key", "ca"):
            path = getattr(self, field)
            if not isinstance(path, str) or not path:
                raise OptionsError(f"{_SPELLINGS[field]} is {path!r}; give the path of {_WHAT[field]} (PEM)")
            try:
                with open(path, "rb") as f:
                    head = f.read(1 << 20)
            except OSError as e:
                raise OptionsError(
                    f"{_SPELLINGS[field]} = {path!r} cannot be read ({e.strerror or e}); give the path of "
                    f"{_WHAT[field]} (PEM), readable by this process"
                ) from e
            if b"-----BEGIN " not in head:
                raise OptionsError(
                    f"{_SPELLINGS[field]} = {path!r} holds no PEM block; give {_WHAT[field]} in PEM form"
                )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            context.load_verify_locations(cafile=self.ca)
        except ssl.SSLError as e:
            raise OptionsError(
                f"{_SPELLINGS['ca']} = {self.ca!r} is not a CA certificate OpenSSL can load ({e})"
            ) from e
        try:
            context.load_cert_chain(self.cert, self.key)
        except ssl.SSLError as e:
            raise OptionsError(
                f"{_SPELLINGS['cert']} = {self.cert!r} and {_SPELLINGS['key']} = {self.key!r} are not a "
                f"certificate and its matching private key ({e}); give the pair the CA signed"
            ) from e
        if (problem := self.validity_problem(datetime.datetime.now(datetime.timezone.utc))) is not None:
            raise OptionsError(problem)

    def validity_problem(self, now: datetime.datetime) -> str | None:
        """Why the CA or the certificate cannot serve at ``now`` (expired, not valid yet, not a
        CA's), naming the option and the file; None when both can. Checked at start, and asked
        again by a client whose handshakes fail, since a certificate can expire while in use."""
        for field, problem in (
            ("ca", ca_problem(_read(self.ca), now)),
            ("cert", certificate_problem(_read(self.cert), now)),
        ):
            if problem is not None:
                return f"{_SPELLINGS[field]} = {getattr(self, field)!r} {problem}"
        return None

    @classmethod
    def from_values(cls, cert: str | None, key: str | None, ca: str | None) -> TlsFiles | None:
        """None when no file is given (plaintext); the files when all three are; else an error
        naming the ones missing."""
        given = {"cert": cert, "key": key, "ca": ca}
        if not any(given.values()):
            return None
        missing = [_SPELLINGS[k] for k, v in given.items() if not v]
        if missing:
            named = ", ".join(f"{k}={v!r}" for k, v in given.items() if v)
            raise OptionsError(
                f"TLS needs a certificate, its key and the CA together; {named} given but not "
                f"{' and '.join(missing)}. Give all three, or none for plaintext"
            )
        assert cert is not None and key is not None and ca is not None
        return cls(cert=cert, key=key, ca=ca)

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] = os.environ,
        *,
        cert: str | None = None,
        key: str | None = None,
        ca: str | None = None,
    ) -> TlsFiles | None:
        """The files given explicitly (flags), each else named by ``$REPLICAFT_TLS_CERT`` /
        ``_KEY`` / ``_CA`` (an empty variable counts as unset); None when none is given."""
        return cls.from_values(
            cert or environ.get(CERT_ENV) or None,
            key or environ.get(KEY_ENV) or None,
            ca or environ.get(CA_ENV) or None,
        )

    # -- contexts ----------------------------------------------------------------------------

    def server_context(self, *, client_cert: bool = True) -> ssl.SSLContext:
        """For a socket server; ``client_cert`` False serves peers without a certificate (the
        status page, for browsers)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        if client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=self.ca)
        return context

    def client_context(self) -> ssl.SSLContext:
        """For a socket client: verifies the server (host name too) and presents the job's certificate."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_verify_locations(cafile=self.ca)
        context.load_cert_chain(self.cert, self.key)
        return context

    def grpc_server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(_read(self.key), _read(self.cert))], root_certificates=_read(self.ca), require_client_auth=True
        )

    def grpc_channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(_read(self.ca), _read(self.key), _read(self.cert))


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def tls_refusal(details: str, address: str) -> TlsRefused | None:
    """A TlsRefused when gRPC's failure text ``details`` (of a call to ``address``) is a failed
    TLS handshake, else None. gRPC reports it only as UNAVAILABLE ("Tls handshake failed ...
    CERTIFICATE_VERIFY_FAILED", "Hostname Verification Check failed"), which would otherwise be
    retried like a restarting server until the caller's deadline."""
    lowered = details.lower()
    if "hostname verification" in lowered:
        host = address.rpartition(":")[0].strip("[]") or address
        return TlsRefused(
            f"TLS handshake with {address} failed: its certificate does not name {host!r}, the host dialled. "
            f"Dial a name or address the certificate names (the throw-away CA's name {', '.join(LOCAL_HOSTS)}), or "
            f"give the peer a certificate that names {host!r} (python -m lighthouse.tls.throwaway_ca --host {host} DIR)"
        )
    if "handshake failed" not in lowered and "certificate_verify_failed" not in lowered:
        return None
    return TlsRefused(
        f"TLS handshake with {address} failed: {details.strip()[-300:]}. The peer's certificate must be "
        "signed by the CA given as tls_ca (--tls-ca, $REPLICAFT_TLS_CA) and name the host dialled, and the "
        "peer must run with TLS too (every process of a job takes the same three files)"
    )


def grpc_channel(address: str, tls: TlsFiles | None, options: list[tuple[str, object]]) -> grpc.Channel:
    """A blocking channel to ``address``: TLS when ``tls`` is given, else plaintext."""
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, tls.grpc_channel_credentials(), options=options)


def grpc_aio_channel(address: str, tls: TlsFiles | None, options: list[tuple[str, object]]) -> grpc.aio.Channel:
    """An asyncio channel to ``address``: TLS when ``tls`` is given, else plaintext."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, tls.grpc_channel_credentials(), options=options)


def add_port(server: grpc.Server | grpc.aio.Server, address: str, tls: TlsFiles | None) -> int:
    """Bind ``server`` to ``address``, with TLS when ``tls`` is given; the port bound (0: failed)."""
    if tls is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, tls.grpc_server_credentials())
