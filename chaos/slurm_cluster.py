"""A Slurm cluster on this machine, for the tests and the benchmark that run the recipes of
``deploy/slurm/`` as shipped: Debian's ``munged``, ``slurmctld`` and ``slurmd`` (installed with
apt-get when missing and allowed), with a generated ``slurm.conf`` describing this host.

Everything is private to a folder the caller owns: the munge key and socket (``AuthInfo``
points Slurm at it), the daemons' state, spool, logs and ports (asked of the OS), and the
configuration, which the client commands (``sbatch``, ``squeue``, ``scancel``, ``scontrol``)
find through ``SLURM_CONF``; ``env()`` gives a caller the variables, and jobs inherit them. So
nothing touches ``/etc`` and several clusters can share a machine. The node is this host,
``NodeAddr=127.0.0.1``; ``nodes=3`` runs three ``slurmd`` on it (``-N``), one per node name,
each on its own port, for the recipes that want three nodes. The node's CPUs are declared
(``SlurmdParameters=config_overrides``), not read from the hardware, so jobs asking for more
CPUs than the machine has (every replica group here asks for one) still run.

``stop()`` cancels every job, waits for them to end, kills any process still carrying this
cluster's ``SLURM_CONF`` (job steps outlive ``slurmd``), then stops the daemons.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from replicaft.launch.children import free_ports
from replicaft.process.process_tree import dying_with_parent

PACKAGES = ("slurm-wlm", "munge")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


class SlurmNotAvailable(RuntimeError):
    """No Slurm here and none could be installed; the message says why."""


def slurm_binaries(*, install: bool = True) -> None:
    """Make sure ``munged``, ``slurmctld``, ``slurmd`` and the client commands exist, installing
    Debian's ``slurm-wlm`` and ``munge`` with apt-get when missing and allowed (root, apt-get)."""
    needed = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
    if all(_which(n) for n in needed):
        return
    if not install:
        raise SlurmNotAvailable("no Slurm here; install Debian's slurm-wlm and munge")
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SlurmNotAvailable(
            "Slurm is not installed and cannot be installed here (needs root and apt-get); "
            "install Debian's slurm-wlm and munge"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install_cmd = ["apt-get", "install", "-y", "-qq", *PACKAGES]
    result = subprocess.run(install_cmd, env=env, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=900)
        result = subprocess.run(install_cmd, env=env, capture_output=True, text=True, timeout=900)
    missing = [n for n in needed if not _which(n)]
    if result.returncode != 0 or missing:
        raise SlurmNotAvailable(
            f"apt-get install {' '.join(PACKAGES)} failed ({result.returncode}; missing "
            f"{missing}): {result.stderr[-500:]}"
        )


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")


class SlurmCluster:
    """``start()`` brings up munge and Slurm and waits until every node is idle; a context manager."""

    def __init__(
        self, root: Path, *, nodes: int = 1, cpus_per_node: int = 16, memory_mb: int = 16000, cred_expire_s: int = 120
    ) -> None:
        slurm_binaries()
        self.cred_expire_s = cred_expire_s
        """Slurm's job credential lifetime, which is also how long a requeued job waits before it may
        start again (``AuthInfo=cred_expire``; Slurm's default, 120 s, is kept unless told)."""
        self.root = root
        self.node_names = [f"node{i}" for i in range(nodes)]
        self.node_addresses = [f"127.0.0.{2 + i}" for i in range(nodes)]
        self.cpus_per_node = cpus_per_node
        self.memory_mb = memory_mb
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.socket"
        ports = free_ports(nodes + 1)
        self.controller_port, self.node_ports = ports[0], ports[1:]
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) with what Slurm's commands need."""
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    def _conf_text(self) -> str:
        r = self.root
        lines = [
            "ClusterName=replicaft", f"SlurmctldHost={socket.gethostname()}(127.0.0.1)",
            f"SlurmctldPort={self.controller_port}", "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket},cred_expire={self.cred_expire_s}",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}/%n",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'slurmd'}.%n.pid",
            f"SlurmctldLogFile={r / 'slurmctld.log'}", f"SlurmdLogFile={r / 'slurmd'}.%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "SchedulerType=sched/backfill",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "SlurmdParameters=config_overrides", "ReturnToService=2", "JobRequeue=1", "KillWait=5",
            "MinJobAge=600", "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0", "MessageTimeout=20",
            "SlurmctldDebug=info", "SlurmdDebug=info",
            # Dependencies and requeued jobs are looked at every second, not every minute (the default).
            "SchedulerParameters=sched_interval=1,bf_interval=1",
        ]  # fmt: skip
        for name, address, port in zip(self.node_names, self.node_addresses, self.node_ports, strict=True):
            lines.append(
                f"NodeName={name} NodeAddr={address} NodeHostname={socket.gethostname()} Port={port} "
                f"CPUs={self.cpus_per_node} RealMemory={self.memory_mb} State=UNKNOWN"
            )
        lines.append("PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _spawn(self, name: str, args: list[str]) -> None:
        with open(self.root / f"{name}.out", "ab") as out:
            self.processes[name] = subprocess.Popen(
                dying_with_parent(args), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )

    def start(self) -> SlurmCluster:
        for d in ("munge", "state", "spool"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        os.chmod(key, 0o400)
        self.conf.write_text(self._conf_text())
        m = self.root / "munge"
        self._spawn(
            "munged",
            [
                _which("munged") or "munged",
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={m / 'munged.pid'}",
                f"--log-file={m / 'munged.log'}",
                f"--seed-file={m / 'munged.seed'}",
            ],
        )
        self._wait(lambda: self.munge_socket.exists(), "munged's socket")
        self._spawn("slurmctld", [_which("slurmctld") or "slurmctld", "-D", "-i", "-f", str(self.conf)])
        for name in self.node_names:
            self._spawn(f"slurmd-{name}", [_which("slurmd") or "slurmd", "-D", "-f", str(self.conf), "-N", name])
        self._wait(self._all_idle, f"every node ({', '.join(self.node_names)}) idle in sinfo")
        return self

    def _all_idle(self) -> bool:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout.split("\n")
        states = dict(line.split() for line in out if line.strip())
        return all(states.get(n) == "idle" for n in self.node_names)

    def _wait(self, ready: object, what: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():  # type: ignore[operator]
            dead = [n for n, p in self.processes.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(
                    f"Slurm cluster: no {what} within {timeout_s:g}s"
                    + (f"; exited: {dead}" if dead else "")
                    + f"\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def run(self, args: list[str], *, check: bool = True, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        """A Slurm command against this cluster; ``check``: a non-zero exit raises, with its output."""
        result = subprocess.run(args, env=self.env(), capture_output=True, text=True, timeout=timeout_s)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited with {result.returncode}: {result.stderr or result.stdout}")
        return result

    def log_tail(self, num_bytes: int = 2000) -> str:
        parts = []
        for path in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-num_bytes:]}")
        return "\n".join(parts)

    def _job_processes(self) -> list[int]:
        """Processes whose environment carries this cluster's SLURM_CONF (job scripts and steps)."""
        mark = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if mark in Path(entry.path, "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    def cancel_all(self) -> None:
        """Cancel every job and wait (at most STOP_TIMEOUT_S) until the queue is empty."""
        if "slurmctld" not in self.processes or self.processes["slurmctld"].poll() is not None:
            return
        self.run(["scancel", "--full", "--user", "root"], check=False)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while self.run(["squeue", "-h"], check=False).stdout.strip() and time.monotonic() < deadline:
            time.sleep(0.2)

    def stop(self) -> None:
        self.cancel_all()
        for pid in self._job_processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for name in sorted(self.processes, key=lambda n: n == "munged"):  # munge last: the others use it
            p = self.processes[name]
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(STOP_TIMEOUT_S)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
