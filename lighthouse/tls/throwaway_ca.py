"""A throw-away CA and one job certificate it signs, for TLS in a job on one machine or a test.

``replicaft-launch --tls`` makes one per job in the job's directory; ``python -m
lighthouse.tls.throwaway_ca DIR`` makes one by hand (e.g. for a lighthouse started apart from the
launcher). The CA's private key is not written anywhere: nothing can sign another certificate
for the job once the files exist, so the CA dies with the job. A long-lived or multi-host
job should use certificates from the site's own CA instead (README, Security).

The certificate names 127.0.0.1, ::1 and localhost (plus any ``hosts`` given), serves as both
server and client certificate (mutual TLS, lighthouse/tls/files.py), and is valid from an hour ago (clock skew
between processes) for ``days`` days. ECDSA P-256: signing and verifying cost a fraction of
an RSA-2048 handshake, and the bulk cipher (AES-GCM) is the same either way.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lighthouse.tls.files import LOCAL_HOSTS, TlsFiles


def _subject_names(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    """The certificate's names: addresses as IP entries, the rest as DNS names."""
    names: list[x509.GeneralName] = []
    for h in dict.fromkeys(LOCAL_HOSTS + hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return names


class ThrowawayCa:
    """A CA held in memory only: it signs job certificates (:meth:`issue`) while this object
    lives, and its key is never written."""

    def __init__(self, *, days: int = 30, name: str = "replicaft job") -> None:
        now = datetime.datetime.now(datetime.timezone.utc)
        self.name = name
        self.start, self.end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=days)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} throw-away CA")])
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(self._subject)
            .issuer_name(self._subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self.start)
            .not_valid_after(self.end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )

    def issue(
        self,
        directory: str | os.PathLike[str],
        *,
        hosts: tuple[str, ...] = (),
        valid_until: datetime.datetime | None = None,
    ) -> TlsFiles:
        """Write ``ca.pem``, a new ``cert.pem`` and its ``key.pem`` (mode 0600) into ``directory``
        (made if missing) and return them as checked :class:`TlsFiles`. ``valid_until`` ends the
        certificate's validity before the CA's (tests of a certificate that expires: one already
        past is refused by the check, after the files are written)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        end = valid_until or self.end
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.name)]))
            .issuer_name(self._subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(min(self.start, end))
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(_subject_names(hosts)), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .sign(self._key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        _write(out / "ca.pem", self.certificate.public_bytes(pem))
        _write(out / "cert.pem", cert.public_bytes(pem))
        _write(out / "key.pem", key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        return TlsFiles(cert=str(out / "cert.pem"), key=str(out / "key.pem"), ca=str(out / "ca.pem"))


def make_throwaway_ca(
    directory: str | os.PathLike[str], *, hosts: tuple[str, ...] = (), days: int = 30, name: str = "replicaft job"
) -> TlsFiles:
    """A new throw-away CA's ``ca.pem`` and one job certificate it signs (``cert.pem``,
    ``key.pem``, mode 0600), written into ``directory`` (made if missing), as checked
    :class:`TlsFiles`; the CA's key is forgotten."""
    return ThrowawayCa(days=days, name=name).issue(directory, hosts=hosts)


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m lighthouse.tls.throwaway_ca",
        description="Make a throw-away CA and a job certificate for TLS on this machine.",
    )
    p.add_argument("directory", help="where ca.pem, cert.pem and key.pem are written")
    p.add_argument(
        "--host",
        action="append",
        default=[],
        help=f"another address or name the certificate must name (repeatable); {', '.join(LOCAL_HOSTS)} always are",
    )
    p.add_argument("--days", type=int, default=30, help="validity (default: %(default)s)")
    args = p.parse_args(argv)
    if args.days < 1:
        p.error(f"--days {args.days}; give at least 1")
    files = make_throwaway_ca(args.directory, hosts=tuple(args.host), days=args.days)
    print(f"--tls-cert {files.cert} --tls-key {files.key} --tls-ca {files.ca}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
