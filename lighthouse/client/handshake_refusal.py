"""Why a lighthouse closed a connection before the session registered, when TLS is the reason.

gRPC words two TLS refusals as it words a lighthouse that is restarting, "Socket closed": a
plaintext client's bytes at a TLS lighthouse, and a client certificate the lighthouse refused
(an expired one, say; under TLS 1.3 the server judges it after the client has finished its
handshake). Retried like a restart, each waited out the caller's deadline and then read "no
session ... is it running?". So a session closed before it registered is looked into:

* the client's own certificate may have expired while the process ran: the files say so,
  without I/O (TlsFiles.validity_problem);
* else one TLS handshake probes the address: a plaintext client that finds TLS there is told
  so; a TLS client whose certificate the lighthouse refuses is told the lighthouse's alert.

A probe that learns nothing (a lighthouse restarting or plaintext, a cap on connections) leaves
the error as it was, and the session retries as before; a probe costs one connection and at
most :data:`PROBE_TIMEOUT_S`, and only before a session registered.
"""

from __future__ import annotations

import asyncio
import datetime
import ssl

import grpc

from lighthouse.client.channels import translate
from lighthouse.errors import LighthouseUnavailable, TlsRefused
from lighthouse.tls.files import CA_ENV, CERT_ENV, KEY_ENV, TlsFiles

PROBE_TIMEOUT_S = 0.5
"""For the whole probe: connection, handshake and the lighthouse's verdict on the certificate
(milliseconds on a network, since the lighthouse answers a real member's within them). Below
blocking_client's grace past a caller's deadline, which the probe after a timeout runs into."""


async def diagnose(error: grpc.aio.AioRpcError, address: str, tls: TlsFiles | None, registered: bool) -> Exception:
    """``error`` of a session with ``address`` translated (channels.translate); a TlsRefused
    instead when the session had not ``registered``, the connection was closed, and TLS is why."""
    translated = translate(error, address)
    if registered or not isinstance(translated, LighthouseUnavailable):
        return translated
    if "socket closed" not in (error.details() or "").lower():
        return translated
    reason = await _probe(address, tls)
    return translated if reason is None else TlsRefused(reason)


async def _probe(address: str, tls: TlsFiles | None) -> str | None:
    """What TLS refused at ``address``, or None when the probe learns nothing by its deadline."""
    try:
        return await asyncio.wait_for(_refusal(address, tls), PROBE_TIMEOUT_S)
    except asyncio.TimeoutError:
        return None


async def _refusal(address: str, tls: TlsFiles | None) -> str | None:
    """The probe without its deadline: the files first, then one connection."""
    if tls is not None and (problem := tls.validity_problem(datetime.datetime.now(datetime.timezone.utc))):
        return f"no TLS session with the lighthouse at {address}: {problem}"
    host, _, port = address.rpartition(":")
    context = tls.client_context() if tls is not None else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # only the server's answer matters
    context.set_alpn_protocols(["h2"])  # as gRPC: a gRPC server closes a TLS connection without it
    writer: asyncio.StreamWriter | None = None
    try:
        reader, writer = await asyncio.open_connection(host.strip("[]"), int(port), ssl=context)
        if tls is None:
            return _plaintext_at_tls(address)
        if await reader.read(1):
            return None  # its HTTP/2 settings: the lighthouse took the certificate
        return (
            f"the lighthouse at {address} closed the connection as soon as the TLS handshake ended: it refused "
            f"this process's certificate {tls.cert!r}, valid by this machine's clock (is the lighthouse's clock "
            "right? was the certificate signed by the CA the lighthouse was given?)"
        )
    except ssl.SSLError as e:
        if "ALERT" in (e.reason or "").upper() and tls is None:
            return _plaintext_at_tls(address)  # a TLS server that wants a certificate (TLS 1.2)
        return None  # not a TLS server, or one that failed otherwise: the session's retries judge it
    except (OSError, ValueError):
        return None
    finally:
        if writer is not None:
            writer.close()


async def unregistered(address: str, tls: TlsFiles | None, timeout_s: float) -> Exception:
    """The error for a client that found no session with ``address`` within ``timeout_s``: what
    TLS refused there if a probe says so, else a lighthouse not running or not at that address.
    (A plaintext client waits for a ready channel after its first attempt, and hears nothing
    of a lighthouse that closes each connection.)"""
    reason = await _probe(address, tls)
    if reason is not None:
        return TlsRefused(reason)
    return LighthouseUnavailable(
        f"no session with the lighthouse at {address} within {timeout_s:g}s; is it running, and is the address right?"
    )


def _plaintext_at_tls(address: str) -> str:
    return (
        f"the lighthouse at {address} serves TLS and this process speaks plaintext: give it the job's TLS "
        f"files, as the lighthouse has them (--tls-cert, --tls-key, --tls-ca, or ${CERT_ENV}, ${KEY_ENV}, "
        f"${CA_ENV})"
    )
