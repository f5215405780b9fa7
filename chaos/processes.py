"""The lighthouse processes of a chaos run, each logging to a file; and the run's environment.

The replica groups are not started here: the launcher's supervisor starts and restarts them
(``replicaft.launch.groups``, through ``chaos/runner.py``), so that chaos exercises the
restart path of a launched job, warm standbys included. Their output reaches the same kind of
per-incarnation log file through a pipe that a reader thread drains.

The lighthouse's output goes straight to a file: nothing has to drain a pipe, and the log
stays in the run directory for the report's reader.

No child may outlive the run. The runner stops every child in a ``finally``; on Linux each
child additionally gets a death signal (``PR_SET_PDEATHSIG = SIGKILL``, set by ``setpriv``
before it execs the child: ``replicaft.process.process_tree.dying_with_parent``), so even a
SIGKILLed runner takes its children with it.

A signal reaches the child and every descendant. Each child leads its own session (process
group), which keeps a terminal's Ctrl-C away from the children (the runner ends them
itself); the descendants are found in ``/proc`` while the child is alive (so none of those
pids can have been reused).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from replicaft.process.process_tree import dying_with_parent

logger = logging.getLogger(__name__)

POLL_S = 0.05


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
                dying_with_parent(self.args) if sys.platform == "linux" else self.args,
                cwd=self._cwd,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
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
        """Send ``sig`` to the child, its process group and all its descendants, if it is still running."""
        if self.poll() is None:
            self._signal_all(sig)
            if sig == signal.SIGSTOP:
                self.stopped = True
            elif sig == signal.SIGCONT:
                self.stopped = False

    def _signal_all(self, sig: int) -> None:
        assert self.popen is not None
        # Listed before signalling, while the child is alive and has reaped none of them.
        pids = descendants(self.popen.pid)
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            self.popen.send_signal(sig)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass  # it exited meanwhile

    def kill(self, timeout_s: float = 10.0) -> int | None:
        """SIGKILL the child and its descendants (stopped ones die too) and reap the child; returns
        its exit code, None if it would not die."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self._signal_all(signal.SIGKILL)
        try:
            return self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            logger.error("%s (pid %d) did not die within %.0fs of SIGKILL", self.name, self.popen.pid, timeout_s)
            return None

    def output_tail(self, num_lines: int = 5) -> str:
        return log_tail(self.log_path, num_lines)

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
                raise RuntimeError(
                    f"{self.name} exited with code {self.poll()} before printing "
                    f"{pattern.pattern!r}: {self.output_tail()}"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.name} printed nothing matching {pattern.pattern!r} within "
                    f"{timeout_s:g}s: {self.output_tail()}"
                )
            time.sleep(POLL_S)


def log_tail(path: Path, num_lines: int = 5) -> str:
    """The last ``num_lines`` lines of the log at ``path`` on one line, for an error message; "" if unreadable."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in lines[-num_lines:])


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children first), from ``/proc/<pid>/task/*/children``; [] elsewhere."""
    out: list[int] = []
    queue = [pid]
    while queue:
        parent = queue.pop(0)
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            out += children
            queue += children
    return out


def python_env(repo_root: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """This environment with the repository importable, unbuffered output, and ``extra``;
    stale ``REPLICAFT_*`` variables of the caller are dropped so they cannot change a run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REPLICAFT_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo_root), env.get("PYTHONPATH")]))
    env.update(extra)
    return env
