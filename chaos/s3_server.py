"""A local S3-compatible server on loopback, with faults on request: for the object-store tier's
tests and the ``cold_start`` chaos scenario.

The server is moto's (``moto[server]`` from PyPI: the S3 API in Python, in memory) in its own
process, bound to 127.0.0.1 on a port the OS picks; nothing leaves the machine. In front of
moto's WSGI app sits a small middleware that injects the failures a real store produces,
set at run time through ``POST /__faults__`` (a path no S3 request uses)::

    {"fail_parts": 1}       the next UploadPart answers 500 InternalError
    {"truncate_gets": 1}    the next object GET sends half its body, then closes
    {"delay_parts_s": 0.2}  every UploadPart waits this long first (to kill the server mid-upload)

``GET /__faults__`` returns the counters (``parts``, ``gets``, faults left). Killing the
process (SIGKILL) is the "server killed mid-upload" fault; moto keeps its state in memory,
so a restarted server is empty, as a store that lost the upload would be.

``--bucket NAME`` creates the bucket before the server listens (so a restarted server has it
again at once). ``--auth`` makes moto check credentials (its IAM emulation): the first three
requests are free, which :meth:`S3Server.create_credentials` spends on a user, its key and
its policy; every later request must be signed with that key.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from typing import Any

START_TIMEOUT_S = 60.0
_CHECKPOINT = re.compile(r"step-(\d{9,})(?:-[0-9a-f]{12})?")
"""A published checkpoint's name (replicaft/checkpoint/layout.py; repeated so the harness does
not import torch)."""
FREE_AUTH_REQUESTS = 3
MOTO_ACCOUNT = "123456789012"
"""moto's default account, which unsigned and IAM-signed requests alike act in."""


class _Faults:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.state: dict[str, float] = {
            "fail_parts": 0,
            "truncate_gets": 0,
            "delay_parts_s": 0.0,
            "parts": 0,
            "gets": 0,
        }

    def take(self, name: str) -> bool:
        with self.lock:
            if self.state[name] > 0:
                self.state[name] -= 1
                return True
            return False


def _middleware(app: Callable[..., Iterable[bytes]], faults: _Faults) -> Callable[..., Iterable[bytes]]:
    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path, method, query = environ.get("PATH_INFO", ""), environ["REQUEST_METHOD"], environ.get("QUERY_STRING", "")
        if path == "/__faults__":
            if method == "POST":
                body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
                with faults.lock:
                    faults.state.update({k: float(v) for k, v in json.loads(body or b"{}").items()})
            with faults.lock:
                answer = json.dumps(faults.state).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(answer)))])
            return [answer]
        if method == "PUT" and "partNumber=" in query:
            with faults.lock:
                faults.state["parts"] += 1
                delay = faults.state["delay_parts_s"]
            if delay:
                time.sleep(delay)
            if faults.take("fail_parts"):
                error = b"<Error><Code>InternalError</Code><Message>injected</Message></Error>"
                start_response(
                    "500 Internal Server Error",
                    [("Content-Type", "application/xml"), ("Content-Length", str(len(error)))],
                )
                return [error]
        if method == "GET" and path.count("/") >= 2 and "uploads" not in query and "list-type" not in query:
            with faults.lock:
                faults.state["gets"] += 1
            if faults.take("truncate_gets"):
                captured: dict[str, Any] = {}

                def capture(
                    status: str, headers: list[tuple[str, str]], exc_info: Any = None
                ) -> Callable[[bytes], None]:
                    captured["status"], captured["headers"] = status, headers
                    return lambda data: None

                body = b"".join(app(environ, capture))
                start_response(captured["status"], captured["headers"])  # the full Content-Length
                return [body[: len(body) // 2]]
        return app(environ, start_response)

    return wrapped


def serve(port: int, auth: bool, buckets: Sequence[str]) -> None:
    if auth:
        os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = str(FREE_AUTH_REQUESTS)
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from moto.s3.models import s3_backends
    from werkzeug.serving import make_server

    for bucket in buckets:
        s3_backends[MOTO_ACCOUNT]["aws"].create_bucket(bucket, "us-east-1")
    app = _middleware(DomainDispatcherApplication(create_backend_app), _Faults())
    server = make_server("127.0.0.1", port, app, threaded=True, request_handler=MotoRequestHandler)
    print(json.dumps({"event": "s3_server", "port": server.server_port}), flush=True)
    server.serve_forever()


class S3Server:
    """The server process, from the side that starts it. ``start`` blocks until it listens."""

    def __init__(self, *, buckets: Sequence[str] = (), auth: bool = False, port: int = 0) -> None:
        self.buckets = tuple(buckets)
        self.auth = auth
        self.port = port
        self.process: subprocess.Popen[str] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> S3Server:
        """Start (or restart, on the same port) the server; raises RuntimeError if it does not listen in time."""
        args = [
            sys.executable,
            "-m",
            "chaos.s3_server",
            "--port",
            str(self.port),
            *(["--auth"] if self.auth else []),
            *[a for b in self.buckets for a in ("--bucket", b)],
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], deadline - time.monotonic())
            if not ready:
                break
            line = self.process.stdout.readline()
            if not line:
                break
            if line.startswith("{"):
                self.port = int(json.loads(line)["port"])
                return self
        self.kill()
        raise RuntimeError(
            f"the S3 server ({' '.join(args)}) did not start listening within {START_TIMEOUT_S:g}s; "
            "is moto[server] installed? (pip install 'moto[server]')"
        )

    def kill(self) -> None:
        """SIGKILL and reap (the "server killed" fault; also the cleanup)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait(10)

    def faults(self, **settings: float) -> dict[str, float]:
        """Set faults (see the module docstring); returns the counters and faults left."""
        data = json.dumps(settings).encode() if settings else None
        request = urllib.request.Request(f"{self.endpoint}/__faults__", data=data, method="POST" if data else "GET")
        with urllib.request.urlopen(request, timeout=10) as r:
            return json.loads(r.read())

    def client(self, service: str = "s3", *, access_key: str = "replicaft", secret_key: str = "replicaft") -> Any:
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            region_name="us-east-1",
        )

    def create_credentials(self) -> tuple[str, str]:
        """With ``auth``: a user allowed every S3 action and its key (the three free requests)."""
        iam = self.client("iam")
        iam.create_user(UserName="replicaft")
        key = iam.create_access_key(UserName="replicaft")["AccessKey"]
        iam.put_user_policy(
            UserName="replicaft",
            PolicyName="s3",
            PolicyDocument=json.dumps(
                {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
            ),
        )
        return key["AccessKeyId"], key["SecretAccessKey"]

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
    parser = argparse.ArgumentParser(prog="python -m chaos.s3_server", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--auth", action="store_true", help="check credentials (moto's IAM)")
    parser.add_argument("--bucket", action="append", default=[], help="create this bucket before listening")
    args = parser.parse_args(argv)
    serve(args.port, args.auth, args.bucket)
    return 0


if __name__ == "__main__":
    sys.exit(main())
