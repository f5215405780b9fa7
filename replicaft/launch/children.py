"""A process the launcher started: its own session, its output labelled line by line."""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from replicaft.process.process_tree import dying_with_parent


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now; torchrun needs a number before it binds its store."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free right now (all held open until every one is chosen), for a
    program that takes several port numbers at once (Ray, Slurm)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass(frozen=True, kw_only=True, slots=True)
class SpawnSettings:
    """How every group process and standby of one supervisor is started."""

    cwd: Path | None = None
    """Working directory; None inherits the supervisor's."""
    die_with_parent: bool = False
    """``PR_SET_PDEATHSIG = SIGKILL`` (``dying_with_parent``: set by ``setpriv`` before it execs
    the child), so that even a SIGKILLed supervisor takes its children along. The chaos runner
    asks for it (a harness must leave nothing behind). The launcher relies on being a
    subreaper instead (see the package's docstring)."""


DEFAULT_SPAWN = SpawnSettings()
"""The launcher's: its own working directory, no death signal."""


class Child:
    """One process the launcher started, in a session of its own, whose output is labelled.

    A reader thread passes each line of its stdout and stderr (merged) to ``on_line``, which a
    standby's activation replaces; it ends when the last process holding the pipe exits, and
    :meth:`join_output` waits for it. Its stdin is ``/dev/null``, or a pipe with ``stdin_pipe``.
    """

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        on_line: Callable[[str], None],
        *,
        stdin_pipe: bool = False,
        settings: SpawnSettings = DEFAULT_SPAWN,
    ) -> None:
        self.on_line = on_line
        self.popen = subprocess.Popen(
            dying_with_parent(argv) if settings.die_with_parent else list(argv),
            env=dict(env),
            cwd=settings.cwd,
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, name=f"output-{self.pid}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.on_line(line.rstrip("\n"))

    def join_output(self, timeout_s: float) -> None:
        self._reader.join(timeout_s)
