"""Forks 30 children while a thread keeps calling into gRPC, after ``import lighthouse``; prints
the fork-support setting it ran with (tests/lighthouse/test_grpc_fork.py reads its stderr)."""

from __future__ import annotations

import os
import threading
from concurrent import futures

import lighthouse  # noqa: F401 - the import under test: it sets gRPC's fork support before gRPC loads

import grpc  # isort: skip

server = grpc.server(futures.ThreadPoolExecutor(2))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
channel = grpc.insecure_channel(f"127.0.0.1:{port}")
stop = threading.Event()
calling = threading.Event()


def call_forever() -> None:
    while not stop.is_set():
        calling.set()
        try:
            channel.unary_unary("/none/Call")(b"", timeout=0.01)
        except grpc.RpcError:
            pass


threading.Thread(target=call_forever, daemon=True).start()
calling.wait(10)
for _ in range(30):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
stop.set()
print(f"GRPC_ENABLE_FORK_SUPPORT={os.environ.get('GRPC_ENABLE_FORK_SUPPORT')}", flush=True)
