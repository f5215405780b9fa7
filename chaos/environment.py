"""What a run's faults need from the machine, built before the first process and torn down after the last.

* ``partition`` / ``slow_link``: a network lab (``chaos/network.py``), every process in a namespace;
* ``fill_disk``: a small tmpfs as the checkpoint directory (``chaos/disk.py``);
* ``cold_start``: an S3-compatible server on loopback (``chaos/s3_server.py``), the
  checkpoints' object-store tier.

Each may be impossible here (not root, no ``ip``, no ``mount``). The run then goes on
without it, on loopback or the real disk, and the faults that needed it are listed in
``unavailable`` with the reason, for the injector to skip; nothing is ever simulated.
``notes`` says where the run actually ran, for ``summary.json``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from chaos.disk import TMPFS_MB, DiskUnavailable, SmallDisk
from chaos.network import NetworkLab, NetworkUnavailable
from chaos.s3_server import S3Server
from chaos.scenario import NETWORK_KINDS, OBJECT_STORE_KINDS, Scenario

logger = logging.getLogger(__name__)

OBJECT_STORE_BUCKET = "replicaft-chaos"
OBJECT_STORE_PREFIX = "checkpoints"


class RunEnvironment:
    def __init__(self, scenario: Scenario, checkpoint_dir: Path | None) -> None:
        self.scenario = scenario
        self.checkpoint_dir = checkpoint_dir
        self.lab: NetworkLab | None = None
        self.disk: SmallDisk | None = None
        self.s3: S3Server | None = None
        self.object_store: str | None = None
        """``s3://bucket/prefix`` the groups tier their checkpoints to, when ``s3`` runs."""
        self.notes: dict[str, str] = {}
        self.unavailable: list[tuple[frozenset[str], str]] = []
        """(fault kinds, why they cannot be injected in this run)."""

    def build(self) -> None:
        s = self.scenario
        self.notes["network"] = "loopback"
        if s.needs_network:
            lab = NetworkLab(s.group_ids)
            try:
                lab.create()
            except NetworkUnavailable as e:
                reason = f"network namespaces are unavailable here, so the run used loopback: {e}"
                self.notes["network"] = f"loopback ({reason})"
                self.unavailable.append((NETWORK_KINDS, reason))
            else:
                self.lab = lab
                self.notes["network"] = (
                    f"network namespaces {lab.prefix}-*, one per process, veths to a bridge: "
                    + ", ".join(f"{h.name} {h.address}" for h in lab.hosts.values())
                )
        if self.checkpoint_dir is None:
            return
        self.notes["checkpoint_dir"] = str(self.checkpoint_dir)
        if s.needs_object_store:
            self._start_object_store()
        if s.needs_disk:
            disk = SmallDisk(self.checkpoint_dir)
            try:
                disk.mount()
            except DiskUnavailable as e:
                self.unavailable.append(
                    (
                        frozenset({"fill_disk"}),
                        (
                            f"could not mount a tmpfs at {self.checkpoint_dir} to fill (the machine's own disk is "
                            f"never filled): {e}"
                        ),
                    )
                )
            else:
                self.disk = disk
                self.notes["checkpoint_dir"] += f" (a {TMPFS_MB} MiB tmpfs, for fill_disk)"

    def _start_object_store(self) -> None:
        if self.lab is not None:
            self.unavailable.append(
                (
                    OBJECT_STORE_KINDS,
                    "the S3 server listens on loopback, which the groups' network "
                    "namespaces cannot reach; run cold_start without network faults",
                )
            )
            return
        server = S3Server(buckets=[OBJECT_STORE_BUCKET])
        try:
            server.start()
        except (RuntimeError, OSError) as e:
            self.unavailable.append((OBJECT_STORE_KINDS, f"the S3 server could not start: {e}"))
            return
        self.s3 = server
        self.object_store = f"s3://{OBJECT_STORE_BUCKET}/{OBJECT_STORE_PREFIX}"
        self.notes["object_store"] = f"{self.object_store} on SeaweedFS's S3 server at {server.endpoint}"

    def close(self) -> None:
        """Unmount and delete what ``build`` made; call after every process is gone. Never raises."""
        if self.s3 is not None:
            self.s3.close()
            self.s3 = None
        if self.disk is not None:
            try:
                self.disk.unmount()
            except DiskUnavailable as e:
                logger.error("could not unmount the checkpoint tmpfs: %s", e)
            self.disk = None
        if self.lab is not None:
            self.lab.close()
            self.lab = None
