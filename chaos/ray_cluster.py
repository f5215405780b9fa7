"""A one-node Ray cluster on loopback, for the tests and the benchmark that run replicaft under
Ray Train: a real ``ray start --head --block`` (Ray's GCS, raylet and agents), started once and
shared, each driver connecting to it by address as a job on a real cluster does.

Every port Ray would otherwise take at a fixed number (GCS 6379, the client server 10001, the
dashboard agent 52365, ...) is asked of the OS, and Ray's session files live under a folder of
their own, so several clusters can run on one machine. Ray's node address is loopback:
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes Ray take 127.0.0.1 instead of the address of the
route out of the machine (its ``--node-ip-address 127.0.0.1`` alone is "resolved" to that
address). The dashboard is off (its state API is then unavailable, which Ray Train's placement
group cleaner reports as warnings; nothing else needs it).

``ray start --block`` ties its daemons' lives to its own (Ray's kernel fate sharing) and stops
them on SIGTERM; it is started with ``PR_SET_PDEATHSIG``, so nothing outlives the caller.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from replicaft.launch.children import free_ports
from replicaft.process.process_tree import dying_with_parent

START_TIMEOUT_S = 120.0
"""``ray start`` took 7-30 s on this 2-core machine, depending on its load."""
STOP_TIMEOUT_S = 30.0
READY_LINE = "Ray runtime started."
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
"""What every process of the cluster and every driver needs (module docstring)."""


class RayNotAvailable(RuntimeError):
    """Ray is not installed here; the message says how to install it."""


def ray_command() -> str:
    """The ``ray`` command of this interpreter's environment."""
    if importlib.util.find_spec("ray") is None:
        raise RayNotAvailable("ray is not installed: pip install 'replicaft[ray]' (or the dev extra)")
    beside = Path(sys.executable).parent / "ray"
    found = str(beside) if beside.exists() else shutil.which("ray")
    if found is None:
        raise RayNotAvailable(f"ray is importable but has no `ray` command beside {sys.executable} or on PATH")
    return found


class RayCluster:
    """``start()`` runs the head and waits until Ray says it is up; a context manager, so the
    cluster is stopped at the end. ``address`` is what drivers pass to ``ray.init``."""

    def __init__(self, *, num_cpus: int = 8, env: dict[str, str] | None = None) -> None:
        self.command = ray_command()
        self.num_cpus = num_cpus
        self.extra_env = dict(env or {})
        # Ray's sockets live in here: a short path (AF_UNIX paths are limited to 107 bytes).
        self.root = Path(tempfile.mkdtemp(prefix="rft-ray-"))
        self.log_path = self.root / "head.log"
        self.gcs_port, *self._other_ports = free_ports(6)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    def driver_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with what a driver of this cluster needs."""
        return {**(os.environ if base is None else base), **LOOPBACK_ENV, "RAY_ADDRESS": self.address}

    def start(self) -> RayCluster:
        agent_http, agent_grpc, runtime_env_agent, metrics, client_server = self._other_ports
        args = [
            self.command, "start", "--head", "--block", "--disable-usage-stats", "--include-dashboard", "false",
            "--node-ip-address", "127.0.0.1", "--port", str(self.gcs_port), "--num-cpus", str(self.num_cpus),
            "--temp-dir", str(self.root), "--dashboard-agent-listen-port", str(agent_http),
            "--dashboard-agent-grpc-port", str(agent_grpc), "--runtime-env-agent-port", str(runtime_env_agent),
            "--metrics-export-port", str(metrics), "--ray-client-server-port", str(client_server),
            "--min-worker-port", "0", "--max-worker-port", "0",
        ]  # fmt: skip
        env = {
            **os.environ,
            **LOOPBACK_ENV,
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            **self.extra_env,
        }
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                dying_with_parent(args),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while READY_LINE not in self.log_path.read_text(errors="replace"):
            if self.process.poll() is not None:
                raise RuntimeError(f"ray start exited with status {self.process.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"ray start did not report '{READY_LINE}' within {START_TIMEOUT_S:g}s:\n{self.log_tail()}"
                )
            time.sleep(0.2)
        return self

    def log_tail(self, num_bytes: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-num_bytes:]

    def stop(self) -> None:
        """SIGTERM (Ray stops its daemons), then SIGKILL if it lingers; removes the session files."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> RayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
