"""A three-node etcd cluster on loopback, for the replicated lighthouse's tests, benchmark and
chaos scenario: real ``etcd`` processes (Debian's ``etcd-server``), each member killable and
restartable, the whole cluster stoppable to take etcd's quorum away.

Members listen on free loopback ports and keep their data under a directory the caller owns
(tests and benchmarks put it on tmpfs: etcd fsyncs its log on every write, and what is
measured is the lighthouse, not this machine's disk). Raft timings are tightened for
loopback (25 ms heartbeat, 250 ms election timeout), which also lets etcd grant one-second
leases (its floor is 1.5 election timeouts).

Each member is started with a death signal (``dying_with_parent``): no etcd outlives the process
that started it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from replicaft.process.process_tree import dying_with_parent

HEARTBEAT_MS = 25
ELECTION_MS = 250
START_TIMEOUT_S = 30.0


class EtcdNotAvailable(RuntimeError):
    """No etcd binary here and none could be installed; the message says why."""


def etcd_binary(*, install: bool = True) -> str:
    """Path of ``etcd``, installing Debian's ``etcd-server`` (and ``etcd-client``, whose
    ``etcdctl`` checks the cluster's health) with apt-get when missing and allowed (root with
    apt-get); raises EtcdNotAvailable saying why not otherwise."""
    found = shutil.which("etcd")
    if found and shutil.which("etcdctl"):
        return found
    if not install:
        raise EtcdNotAvailable("no etcd on PATH; install Debian's etcd-server (apt-get install etcd-server)")
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise EtcdNotAvailable(
            "no etcd on PATH and cannot install it here (needs root and apt-get); install Debian's etcd-server"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    result = subprocess.run(
        ["apt-get", "install", "-y", "-qq", "etcd-server", "etcd-client"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if result.returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=600)
        result = subprocess.run(
            ["apt-get", "install", "-y", "-qq", "etcd-server", "etcd-client"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    found = shutil.which("etcd")
    if result.returncode != 0 or not found:
        raise EtcdNotAvailable(f"apt-get install etcd-server failed ({result.returncode}): {result.stderr[-500:]}")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class EtcdCluster:
    """``start()`` launches every member and waits until the cluster has a leader; use as a
    context manager so every member is killed at the end."""

    def __init__(self, root: Path, size: int = 3) -> None:
        self.binary = etcd_binary()
        self.root = root
        self.members = [
            EtcdMember(f"etcd{i}", _free_port(), _free_port(), root / f"etcd{i}.data", root / f"etcd{i}.log")
            for i in range(size)
        ]

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def _args(self, m: EtcdMember, state: str) -> list[str]:
        initial = ",".join(f"{x.name}=http://127.0.0.1:{x.peer_port}" for x in self.members)
        return [
            self.binary,
            "--name",
            m.name,
            "--data-dir",
            str(m.data_dir),
            "--listen-client-urls",
            f"http://127.0.0.1:{m.client_port}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{m.client_port}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{m.peer_port}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{m.peer_port}",
            "--initial-cluster",
            initial,
            "--initial-cluster-state",
            state,
            "--initial-cluster-token",
            f"replicaft-{os.getpid()}",
            "--heartbeat-interval",
            str(HEARTBEAT_MS),
            "--election-timeout",
            str(ELECTION_MS),
            "--log-level",
            "warn",
            "--logger",
            "zap",
        ]

    def start_member(self, m: EtcdMember, state: str = "new") -> None:
        m.data_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(m.log_path, "ab") as log:
            m.process = subprocess.Popen(
                dying_with_parent(self._args(m, state)),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def start(self) -> EtcdCluster:
        for m in self.members:
            self.start_member(m)
        self.wait_healthy(START_TIMEOUT_S)
        return self

    def wait_healthy(self, timeout_s: float) -> None:
        """Until a put through etcdctl succeeds (the cluster has a leader), or raise."""
        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            for m in self.members:
                if m.process is not None and m.process.poll() is not None:
                    raise RuntimeError(
                        f"etcd member {m.name} exited with {m.process.returncode}: "
                        f"{m.log_path.read_text(errors='replace')[-1500:]}"
                    )
            result = subprocess.run(
                [
                    "etcdctl",
                    "--endpoints",
                    ",".join(m.endpoint for m in self.members if m.alive),
                    "--dial-timeout",
                    "1s",
                    "--command-timeout",
                    "1s",
                    "put",
                    "/replicaft-health",
                    "ok",
                ],
                capture_output=True,
                text=True,
                env={**os.environ, "ETCDCTL_API": "3"},
            )
            if result.returncode == 0:
                return
            last = result.stderr.strip()[-300:]
            time.sleep(0.1)
        raise RuntimeError(f"etcd cluster had no leader within {timeout_s:g}s: {last}")

    def follower_index(self, timeout_s: float = 10.0) -> int:
        """The index of a live member that is not the cluster's raft leader, from ``etcdctl
        endpoint status``. Killing a follower leaves the leader, and so every lease renewal, in
        place; killing the leader stalls renewals for an election (up to a few election
        timeouts), which a short lighthouse lease may not outlast."""
        alive = [m for m in self.members if m.alive]
        result = subprocess.run(
            [
                "etcdctl",
                "--endpoints",
                ",".join(m.endpoint for m in alive),
                "--dial-timeout",
                "1s",
                "--command-timeout",
                "1s",
                "endpoint",
                "status",
                "--write-out=json",
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "ETCDCTL_API": "3"},
            timeout=timeout_s,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"etcdctl endpoint status failed: {result.stderr.strip()[-300:]}")
        for status in json.loads(result.stdout):
            if status["Status"]["header"]["member_id"] != status["Status"]["leader"]:
                return next(i for i, m in enumerate(self.members) if m.endpoint == status["Endpoint"])
        raise RuntimeError(f"no follower among the live etcd members: {result.stdout[:300]}")

    def kill_member(self, index: int) -> None:
        m = self.members[index]
        if m.process is not None and m.process.poll() is None:
            m.process.kill()
            m.process.wait(10)

    def restart_member(self, index: int) -> None:
        """Start a killed member again on its data (it rejoins the cluster)."""
        self.start_member(self.members[index], state="existing")

    def stop(self) -> None:
        for i in range(len(self.members)):
            self.kill_member(i)

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
