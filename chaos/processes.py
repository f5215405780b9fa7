"""Child processes of a chaos run: the lighthouse and the groups, each logging to a file.

Output goes to files rather than pipes: nothing has to drain a pipe (a stopped reader would
block a child on a full pipe, which is itself a hang the harness would then misreport), and
the logs stay in the run directory for the report's reader.

No child may outlive the run. The runner stops every child in a ``finally``; on Linux each
child additionally gets ``PR_SET_PDEATHSIG = SIGKILL``, so even a SIGKILLed runner takes its
children with it. (The runner is single-threaded, which ``preexec_fn`` requires.)
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
POLL_S = 0.05


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Child:
    """One process (one incarnation of a group, or the lighthouse) and its log file."""

    def __init__(self, name: str, args: Sequence[str], *, log_path: Path, env: Mapping[str, str], cwd: Path) -> None:
        self.name = name
        self.args = list(args)
        self.log_path = log_path
        self._env = dict(env)
        self._cwd = cwd
        self.popen: subprocess.Popen[bytes] | None = None
        self.stopped = False
        """True between SIGSTOP and SIGCONT sent by the harness."""

    def start(self) -> Child:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                self.args,
                cwd=self._cwd,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        logger.info("started %s (pid %d), log %s", self.name, self.popen.pid, self.log_path)
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, "start() first"
        return self.popen.pid

    def poll(self) -> int | None:
        assert self.popen is not None, "start() first"
        return self.popen.poll()

    def signal(self, sig: int) -> None:
        """Send ``sig`` if the process is still running (a finished one is left alone)."""
        if self.poll() is None:
            assert self.popen is not None
            self.popen.send_signal(sig)
            if sig == signal.SIGSTOP:
                self.stopped = True
            elif sig == signal.SIGCONT:
                self.stopped = False

    def kill(self, timeout_s: float = 10.0) -> int | None:
        """SIGKILL (a stopped process dies too) and reap; returns the exit code, None if it would not die."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.kill()
        try:
            return self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            logger.error("%s (pid %d) did not die within %.0fs of SIGKILL", self.name, self.popen.pid, timeout_s)
            return None

    def output_tail(self, num_lines: int = 5) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in lines[-num_lines:])

    def wait_for_output(self, pattern: re.Pattern[str], timeout_s: float) -> re.Match[str]:
        """The first match of ``pattern`` in the log; raises RuntimeError on exit or deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                text = self.log_path.read_text(errors="replace")
            except OSError:
                text = ""
            match = pattern.search(text)
            if match:
                return match
            if self.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.poll()} before printing "
                                   f"{pattern.pattern!r}: {self.output_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} printed nothing matching {pattern.pattern!r} within "
                                   f"{timeout_s:g}s: {self.output_tail()}")
            time.sleep(POLL_S)


def python_env(repo_root: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """This environment with the repository importable, unbuffered output, and ``extra``;
    stale ``REPLICAFT_*`` variables of the caller are dropped so they cannot change a run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLICAFT_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo_root), env.get("PYTHONPATH")]))
    env.update(extra)
    return env
