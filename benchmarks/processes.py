"""Child processes a benchmark starts: read line by line with deadlines, always killed.

Benchmarks run the thing measured as real OS processes (a lighthouse, members, an echo
server) so that a kill is a real kill and no measurement shares an event loop with the
code measuring it. Children report what happened as lines on stdout (JSON objects with an
``"event"`` key, or the lighthouse's own "serving at" line), and the benchmark waits for
those lines with a deadline: never a sleep. A line is an observable fact ("registered",
"round done"); a sleep is a guess that turns into a flaky number on a loaded machine.

Nothing may outlive a benchmark: :class:`ChildProcesses` SIGKILLs every child it started
when its ``async with`` block exits, however it exits, and each child is also started with
``PR_SET_PDEATHSIG`` so it dies if the benchmark process itself is killed before cleanup.
Each child's stderr goes to a file that is quoted in the error when the child misbehaves.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from replicaft.process.process_tree import dying_with_parent

REPO_ROOT = Path(__file__).resolve().parent.parent
LINE_LIMIT_BYTES = 1 << 20
"""A worker may report a thousand samples on one line; asyncio's default limit is 64 KiB."""
STDERR_TAIL_CHARS = 2000
KILL_WAIT_S = 5.0


class ChildFailed(RuntimeError):
    """A child exited, or did not print what was expected before the deadline."""


class Child:
    """One started process: its stdin for commands, its stdout read as lines."""

    def __init__(self, name: str, process: asyncio.subprocess.Process, stderr_path: Path) -> None:
        self.name = name
        self._process = process
        self._stderr_path = stderr_path

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        """None while it runs."""
        return self._process.returncode

    async def next_line(self, deadline: float) -> str:
        """The next stdout line (stripped); raises ChildFailed at the deadline or at EOF."""
        assert self._process.stdout is not None
        remaining = deadline - time.monotonic()
        try:
            raw = await asyncio.wait_for(self._process.stdout.readline(), max(remaining, 0.0))
        except asyncio.TimeoutError:  # not the builtin before 3.11, which pyproject allows
            raise ChildFailed(
                f"{self.name} (pid {self.pid}) printed nothing more before the deadline; "
                f"its stderr ends with:\n{self.stderr_tail()}"
            ) from None
        if not raw:
            code = await self._process.wait()
            raise ChildFailed(
                f"{self.name} (pid {self.pid}) exited with code {code}; its stderr ends with:\n{self.stderr_tail()}"
            )
        return raw.decode().strip()

    async def expect_line(self, prefix: str, deadline: float) -> str:
        """Skip lines until one starts with ``prefix``; returns the rest of that line."""
        while True:
            line = await self.next_line(deadline)
            if line.startswith(prefix):
                return line[len(prefix) :]

    async def expect_event(self, event: str, deadline: float, **fields: Any) -> dict[str, Any]:
        """Skip lines until a JSON object with this ``event`` and these field values arrives."""
        while True:
            line = await self.next_line(deadline)
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                raise ChildFailed(f"{self.name} printed {line!r}; workers print JSON lines only") from None
            if obj.get("event") == event and all(obj.get(k) == v for k, v in fields.items()):
                return obj

    def send_line(self, line: str) -> None:
        """Queue a command line on the child's stdin (asyncio flushes it in the background)."""
        assert self._process.stdin is not None
        self._process.stdin.write(line.encode() + b"\n")

    def kill(self) -> None:
        if self._process.returncode is None:
            self._process.kill()

    def send_signal(self, sig: int) -> None:
        if self._process.returncode is None:
            self._process.send_signal(sig)

    async def wait(self, deadline: float) -> int:
        return await asyncio.wait_for(self._process.wait(), max(deadline - time.monotonic(), 0.0))

    def cpu_seconds(self) -> float:
        """User + system CPU the child has used so far, from /proc (Linux)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stderr_tail(self) -> str:
        try:
            return self.stderr_text()[-STDERR_TAIL_CHARS:] or "(nothing)"
        except OSError as e:
            return f"(stderr unreadable: {e})"

    def stderr_text(self) -> str:
        """Everything the child has written to stderr so far (for children that log there)."""
        return self._stderr_path.read_text(errors="replace")


class ChildProcesses:
    """Owner of every child a benchmark starts; leaving the ``async with`` kills them all."""

    def __init__(self) -> None:
        self._children: list[Child] = []
        self._logs: tempfile.TemporaryDirectory[str] | None = None

    async def __aenter__(self) -> ChildProcesses:
        self._logs = tempfile.TemporaryDirectory(prefix="replicaft-bench-")
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        for child in self._children:
            child.kill()
        deadline = time.monotonic() + KILL_WAIT_S
        for child in self._children:
            try:
                await child.wait(deadline)
            except asyncio.TimeoutError:
                print(f"warning: {child.name} (pid {child.pid}) survived SIGKILL for {KILL_WAIT_S:g}s", file=sys.stderr)
        if self._logs is not None:
            self._logs.cleanup()

    async def start_python(self, name: str, *args: str, env: Mapping[str, str] | None = None) -> Child:
        """Start ``python <args>`` from the repository root with this interpreter (and ``env``
        instead of this process's environment, if given)."""
        assert self._logs is not None, "use ChildProcesses as `async with`"
        stderr_path = Path(self._logs.name) / f"{name}.stderr"
        with stderr_path.open("wb") as stderr:
            process = await asyncio.create_subprocess_exec(
                *dying_with_parent([sys.executable, *args]),
                cwd=REPO_ROOT,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                limit=LINE_LIMIT_BYTES,
                env=dict(env) if env is not None else None,
            )
        child = Child(name, process, stderr_path)
        self._children.append(child)
        return child
