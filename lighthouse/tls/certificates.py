"""What the job's certificate and CA files must be, judged when they are loaded (TlsFiles).

OpenSSL loads an expired certificate, one not valid yet, and a leaf certificate given as the
CA without a word; each then fails every handshake of the job, far from its cause, with an
error the peer words ("certificate expired", "unknown ca") or with none at all. So the
certificates are read here, as the process starts, and a problem is named with the file.
Pure: the PEM bytes and the time are arguments.
"""

from __future__ import annotations

import datetime

from cryptography import x509

_MAKE_ONE = " (python -m lighthouse.tls.throwaway_ca DIR makes a set for a job on one machine)"


def _certificates(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []  # not PEM certificates: OpenSSL's own loading says so, with its reason


def _validity_problem(cert: x509.Certificate, now: datetime.datetime) -> str | None:
    """The end of a sentence saying why ``cert`` is not valid at ``now``, with the fix; None when it is."""
    if now > cert.not_valid_after_utc:
        return (
            f"expired on {cert.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC, so every TLS handshake would fail; "
            f"give a current one{_MAKE_ONE}"
        )
    if now < cert.not_valid_before_utc:
        return (
            f"is not valid until {cert.not_valid_before_utc:%Y-%m-%d %H:%M:%S} UTC, so every TLS handshake would "
            "fail until then; is this machine's clock right?"
        )
    return None


def certificate_problem(pem: bytes, now: datetime.datetime) -> str | None:
    """Why the job's certificate (the first in ``pem``) cannot serve at ``now``, or None; the
    reason reads after the file's name ("holds the certificate ..., which expired on ...")."""
    certs = _certificates(pem)
    if not certs:
        return None
    problem = _validity_problem(certs[0], now)
    return None if problem is None else f"holds the certificate {certs[0].subject.rfc4514_string()!r}, which {problem}"


def ca_problem(pem: bytes, now: datetime.datetime) -> str | None:
    """Why ``pem`` cannot serve as the job's CA at ``now``, or None: each certificate in it must
    be a CA's (basic constraints CA:TRUE) and valid."""
    for cert in _certificates(pem):
        subject = cert.subject.rfc4514_string()
        try:
            is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = False
        if not is_ca:
            return (
                f"holds {subject!r}, which is not a CA certificate (no basic constraints CA:TRUE): give the "
                "certificate of the CA that signed the job's certificate, not a certificate it signed"
            )
        if (problem := _validity_problem(cert, now)) is not None:
            return f"holds the CA certificate {subject!r}, which {problem}"
    return None
