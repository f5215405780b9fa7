"""Warm standbys: interpreters that have imported torch and replicaft, waiting to become a
restarted group (``replicaft.process.standby``), each holding a memory reserve the size of a group's
state once the groups have told it.

They start only at quiet times (no group in its start-up), so their imports never compete
for the CPU with a group's start or heal; one that dies unused turns standbys off for the run.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Mapping, Sequence

from replicaft.launch.children import DEFAULT_SPAWN, Child, SpawnSettings
from replicaft.launch.restart_policy import describe_exit
from replicaft.process.standby import (
    READY_LINE,
    RESERVED_LINE,
    encode_activation,
    encode_reserve,
    reserve_bytes_for,
)

logger = logging.getLogger(__name__)

_RESERVED = re.compile(rf"{re.escape(RESERVED_LINE)} (\d+) bytes, pid (\d+)")


class StandbyPool:
    """``num_standbys`` standbys at most, each running ``script`` (the script and its arguments)
    once activated; ``reserve``: ask them for memory reserves; ``discard`` stops one that cannot
    be used. Used by :class:`~replicaft.launch.groups.GroupSupervisor`, for the launcher and the
    chaos harness alike."""

    def __init__(
        self,
        script: Sequence[str],
        *,
        num_standbys: int,
        reserve: bool,
        env: Callable[[], Mapping[str, str]],
        write_line: Callable[[str], None],
        discard: Callable[[Child], None],
        settings: SpawnSettings = DEFAULT_SPAWN,
    ) -> None:
        self._script = list(script)
        self._num_standbys = num_standbys
        self._reserve = reserve
        self._env = env
        self._write_line = write_line
        self._discard = discard
        self._settings = settings
        self.standbys: list[Child] = []
        self.off = num_standbys == 0
        self.state_cpu_bytes = 0
        """The most host memory any group's state has reported (``state_size`` events)."""
        self._reserve_asked: dict[int, int] = {}
        """Standby pid -> the reserve it was asked for."""
        self._ready: set[int] = set()
        """Pids of the standbys that have printed ``READY_LINE`` (added by their reader threads)."""

    def num_ready(self) -> int:
        """How many standbys have finished their imports and wait for an activation."""
        return sum(standby.pid in self._ready for standby in self.standbys)

    def take(self, variables: Mapping[str, str], on_line: Callable[[str], None]) -> Child | None:
        """A live standby, activated with a group's ``variables``, its output from now on passed
        to ``on_line``; None when there is none (the restart goes cold)."""
        # A ready one first: its imports are done, so the restart starts at once.
        self.standbys.sort(key=lambda standby: standby.pid not in self._ready)
        while self.standbys:
            standby = self.standbys.pop(0)
            self._reserve_asked.pop(standby.pid, None)
            self._ready.discard(standby.pid)
            assert standby.popen.stdin is not None
            standby.on_line = on_line  # before the activation: the group's first line must not pass as the standby's
            try:
                standby.popen.stdin.write(encode_activation(dict(variables)))
                standby.popen.stdin.close()
            except OSError as e:  # it died since the last tick
                logger.warning("warm standby pid %d could not be activated (%s); trying the next", standby.pid, e)
                self._discard(standby)
                continue
            return standby
        return None

    def note_state_size(self, cpu_bytes: int) -> None:
        self.state_cpu_bytes = max(self.state_cpu_bytes, cpu_bytes)

    def watch(self, *, quiet: bool) -> None:
        """Drop standbys that died unused (and stop starting them); start one when it is ``quiet``."""
        for standby in list(self.standbys):
            code = standby.popen.poll()
            if code is not None:
                self.standbys.remove(standby)
                self._reserve_asked.pop(standby.pid, None)
                self._ready.discard(standby.pid)
                self.off = True
                logger.warning(
                    "warm standby pid %d %s before it was used; restarts start cold from now on",
                    standby.pid,
                    describe_exit(code),
                )
        if self.off or not quiet:
            return
        self._ask_reserves()
        if len(self.standbys) >= self._num_standbys:
            return
        argv = [sys.executable, "-m", "replicaft.process.standby", *self._script]
        standby = Child(argv, self._env(), self._on_line, stdin_pipe=True, settings=self._settings)
        self.standbys.append(standby)
        logger.info("starting warm standby pid %d", standby.pid)

    def _on_line(self, line: str) -> None:
        if line.startswith(READY_LINE):
            pid = line.rsplit(" ", 1)[1]
            if pid.isdigit():
                self._ready.add(int(pid))
            logger.info("warm standby pid %s ready", pid)
        elif match := _RESERVED.fullmatch(line):
            logger.info("warm standby pid %s reserved %.1f MB for a restart", match.group(2), int(match.group(1)) / 1e6)
        else:
            self._write_line(f"[standby] {line}")

    def _ask_reserves(self) -> None:
        """Ask every standby for a reserve the size of the largest state reported, unless it has
        one that large; at quiet times only, as faulting it in takes a core for a second or two."""
        size = reserve_bytes_for(self.state_cpu_bytes) if self._reserve else 0
        for standby in self.standbys:
            if size <= self._reserve_asked.get(standby.pid, 0):
                continue
            assert standby.popen.stdin is not None
            try:
                standby.popen.stdin.write(encode_reserve(size))
                standby.popen.stdin.flush()
            except OSError as e:  # it died since the last tick: dropped at the next one
                logger.warning("warm standby pid %d could not be asked for a reserve (%s)", standby.pid, e)
                continue
            self._reserve_asked[standby.pid] = size
