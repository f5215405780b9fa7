"""The job's own lighthouse: started on a free port, its address read from its announcement,
restarted on the same port when it dies (the managers reconnect to the address they know)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping

from lighthouse.server.announce import grpc_address
from replicaft.launch.children import Child
from replicaft.launch.options import LaunchOptions
from replicaft.launch.restart_policy import decide_restart, describe_exit

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0
"""Generous: on a loaded two-core machine importing grpc alone has taken several seconds."""
TICK_S = 0.1
"""How often a start looks for the address while it waits."""


class LighthouseKeeper:
    """Starts ``python -m lighthouse`` and keeps it running; ``write_line`` shows its output."""

    def __init__(
        self,
        options: LaunchOptions,
        env: Mapping[str, str],
        write_line: Callable[[str], None],
        stopping: Callable[[], bool],
    ) -> None:
        self.options = options
        self._env = dict(env)
        self._write_line = write_line
        self._stopping = stopping
        self.child: Child | None = None
        self.address: str | None = None
        self._address_seen = threading.Event()
        self._restarts = 0
        self._restart_at: float | None = None

    def start(self, port: int = 0) -> bool:
        """Start it on ``port``; with port 0, wait (with a deadline) for the address it announces."""
        args = [sys.executable, "-m", "lighthouse", "--port", str(port)]
        if self.options.min_replicas is not None:
            args += ["--min-replicas", str(self.options.min_replicas)]
        self.child = Child(args, {**self._env, "PYTHONUNBUFFERED": "1"}, self._on_line)
        if port:
            return True
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._address_seen.wait(TICK_S):
            if self._stopping():
                return False
            if self.child.popen.poll() is not None:
                logger.error(
                    "the lighthouse %s before printing its address", describe_exit(self.child.popen.returncode)
                )
                return False
            if time.monotonic() >= deadline:
                logger.error("the lighthouse printed no address within %gs", START_TIMEOUT_S)
                return False
        return True

    def _on_line(self, line: str) -> None:
        address = grpc_address(line)
        if address is not None and self.address is None:
            self.address = address
            self._address_seen.set()
        self._write_line(f"[lighthouse] {line}")

    def watch(self, now: float) -> bool:
        """Restart a lighthouse that died, on the same port; False once it may not restart."""
        if self.child is None or self.child.popen.poll() is None:
            return True
        if self._restart_at is None:
            decision = decide_restart(
                self.child.popen.returncode,
                self._restarts,
                may_finish=False,
                max_restarts=self.options.max_restarts,
                restart_delay_s=self.options.restart_delay_s,
            )
            logger.warning("lighthouse %s", decision.reason)
            if decision.action == "give_up":
                return False
            self._restart_at = now + decision.delay_s
        elif now >= self._restart_at:
            assert self.address is not None
            self._restarts += 1
            self._restart_at = None
            self.start(port=int(self.address.rpartition(":")[2]))
            logger.info("restarted the lighthouse at %s", self.address)
        return True
